"""The fake cluster's workers and node agents: in-memory stand-ins for
``RayWorker`` and ``NodeAgent`` with the same methods and the same answers
(a ``Placement``, an ``Outcome`` sent as ``RayWorker.execute`` sends it), so
that the engine above the seam cannot tell them apart. The user's function
really runs, in this process; torch is never imported.
"""

from __future__ import annotations

import pickle
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from raydist.core.environment import DEVICE_INDEX_VAR
from raydist.pool.records import CollectiveEntry, Outcome, Placement, WorkerEvidence, WorkerSpec

FIRST_PID = 50_000_000  # above any real pid (Linux's pid_max is at most 2**22): a stray signal finds no process
FIRST_PORT = 40_000
NO_SUCH_DIR = "/nonexistent/raydist-fake"  # evidence paths that no agent here reads

_running = threading.local()


def current_rank() -> int:
    """The rank of the fake worker running the calling user function (a test's stand-in for RANK)."""
    worker = getattr(_running, "worker", None)
    if worker is None or worker.rank is None:
        raise RuntimeError("current_rank() is for functions run on a FakeCluster's workers")
    return int(worker.rank)


def current_attempt() -> int:
    """The world attempt (TORCHELASTIC_RESTART_COUNT) of the fake worker running the caller."""
    worker = getattr(_running, "worker", None)
    if worker is None:
        raise RuntimeError("current_attempt() is for functions run on a FakeCluster's workers")
    return int(worker.env.get("TORCHELASTIC_RESTART_COUNT", "0"))


def evidence_of(pid: int) -> WorkerEvidence:
    return WorkerEvidence(
        stderr_path=None,
        exit_note_path=f"{NO_SUCH_DIR}/exit-{pid}",
        stack_path=f"{NO_SUCH_DIR}/stacks-{pid}",
        preemption_path=f"{NO_SUCH_DIR}/preempted-{pid}",
    )


@dataclass(eq=False)
class FakeProcess:
    """What every fake process has: where it runs and whether it lives."""

    number: int  # in creation order, over the cluster's life
    node_id: str
    pid: int
    alive: bool = True
    how_it_ended: str = ""  # the death line a call on it then fails with
    exit_code: Optional[int] = None  # what its node's agent reads as its end (-9: SIGKILL)


@dataclass(eq=False)
class FakeWorker(FakeProcess):
    """A ``RayWorker`` stand-in in slot ``slot`` of reservation ``reservation``."""

    reservation: int = 0
    slot: int = 0
    rank: Optional[int] = None
    env: Dict[str, str] = field(default_factory=dict)
    port: int = 0
    returned: str = ""
    last_call: Any = None
    load: Callable[[Any], Any] = pickle.loads  # how a sent call is read (the cluster's table)
    recorder: List[CollectiveEntry] = field(default_factory=list)  # its flight recorder, what the agent reads
    gflops: float = 100.0  # what its pre-flight compute probe measures (its node's speed; 0: the probe fails)
    devices_visible: bool = True  # False: its accelerator is only counted, torch falls back to the CPU
    ran_ahead: List[Tuple[Optional[int], int]] = field(default_factory=list)  # (rank, teardowns before) of each run_ahead
    teardowns: int = 0

    def __repr__(self) -> str:
        return f"FakeWorker(#{self.number}, rank={self.rank}, slot={self.slot}, node={self.node_id})"

    def describe(self, index: int, used_ports: frozenset = frozenset()) -> Placement:
        port = FIRST_PORT + self.number
        while port in used_ports:
            port += 1
        self.port = port
        return Placement(index, self.node_id, node_ip(self.node_id), self.pid, (), port, evidence_of(self.pid), f"host-{self.node_id}")

    def setup(self, spec: WorkerSpec) -> None:
        self.rank, self.env = spec.worker.rank, dict(spec.env)

    def execute(self, call: Any = None) -> Any:
        call = self.last_call if call is None else call
        self.last_call = call
        _running.worker = self
        try:
            fn, args, kwargs = self.load(call)
            value = fn(*args, **kwargs)
            self.returned = f"{type(value).__module__}.{type(value).__qualname__}"
            return Outcome(value=value).to_send()
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            return Outcome(exit_code=code) if code else Outcome()
        except BaseException as error:  # noqa: BLE001 - every ending of the user's code is reported, as RayWorker does
            return failed_outcome(error)
        finally:
            _running.worker = None

    def set_dataset_shards(self, iterators: Mapping[str, Any]) -> None:
        pass

    def stand_by(self, env: Mapping[str, str], device_type: str) -> int:
        self.env = dict(env)
        return self.pid

    def probe_ready(self, env: Mapping[str, str], device_type: str) -> str:
        self.env = dict(env)
        if device_type == "cpu" or not self.devices_visible:
            return "cpu"
        return f"{device_type}:{env.get(DEVICE_INDEX_VAR, '0')}"  # the fake names no device ids: its first

    def probe(self, mode: str, threads: int) -> Tuple[Optional[float], str]:
        if self.gflops <= 0:  # a device that fails its probe
            return None, "RuntimeError: the device did not answer"
        return self.gflops, ""

    def probe_collective(self, mode: str) -> Tuple[float, float]:
        return 1.0, 0.01

    def ping(self) -> int:
        return self.pid

    def returned_type(self) -> str:
        return self.returned

    def teardown(self) -> None:
        self.teardowns += 1

    def run_ahead(self, call: Any) -> None:
        """Noted only: what a function run ahead does before its load_state is the worker's, not the engine's."""
        self.ran_ahead.append((self.rank, self.teardowns))


def failed_outcome(error: BaseException, timestamp: float = 0.0) -> Outcome:
    try:
        pickled: Optional[bytes] = pickle.dumps(error)
    except Exception:  # noqa: BLE001 - sent as text, as RayWorker does
        pickled = None
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return Outcome(traceback=text, exception_type=type(error).__name__, exception=pickled, timestamp=timestamp)


@dataclass(eq=False)
class FakeAgent(FakeProcess):
    """A ``NodeAgent`` stand-in: reads the evidence the cluster noted for each process on its node."""

    ended: Callable[[int], Tuple[Optional[str], Optional[int]]] = lambda pid: (None, None)
    recorded: Callable[[int], List[CollectiveEntry]] = lambda pid: []  # a worker's flight recorder
    killed: Callable[[int, str], None] = lambda pid, signal_name: None  # a signal the fake's user code cannot handle
    warned: List[Tuple[int, float]] = field(default_factory=list)  # (rank, deadline) of each preemption warning

    def ping(self) -> int:
        return self.pid

    def evidence(self, requests: List[Tuple[int, int, WorkerEvidence]]) -> Dict[int, Tuple[Optional[str], Optional[int]]]:
        return {rank: self.ended(pid) for rank, pid, _ in requests}

    def stacks(self, requests: List[Tuple[int, int, WorkerEvidence]]) -> Dict[int, Optional[str]]:
        return {rank: None for rank, _, _ in requests}

    def collectives(self, requests: List[Tuple[int, int, WorkerEvidence]]) -> Dict[int, Optional[list]]:
        return {rank: list(self.recorded(pid)) for rank, pid, _ in requests}

    def clock(self) -> int:
        return 0

    def signal(self, requests: List[Tuple[int, int, WorkerEvidence]], signum: int) -> Dict[int, bool]:
        return {rank: False for rank, _, _ in requests}  # the fake's user code is not interruptible

    def remove(self, requests: List[Tuple[int, int, WorkerEvidence]]) -> Dict[int, bool]:
        return {rank: True for rank, _, _ in requests}

    def preempt(self, requests: List[Tuple[int, int, WorkerEvidence]], deadline: float, signal_name: Optional[str]) -> Dict[int, bool]:
        """The deadline noted, then the signal sent, as a ``NodeAgent`` does; the
        fake's user code has no handler, so the signal ends the rank's process."""
        self.warned.extend((rank, deadline) for rank, _, _ in requests)
        if signal_name is not None:
            for _, pid, _ in requests:
                self.killed(pid, signal_name)
        return {rank: True for rank, _, _ in requests}


def node_ip(node_id: str) -> str:
    return f"10.0.0.{sum(node_id.encode()) % 250 + 1}"
