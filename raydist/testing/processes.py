"""The fake cluster's processes and their calls: every worker and node agent
started, each one's calls in the order sent, and how each process ended.
``FakeCluster`` decides when a call runs and what goes wrong
(``raydist.testing.fake``); this module keeps the books."""

from __future__ import annotations

import itertools
import signal
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from raydist.pool.cluster.seam import CallFailed, WorkerDied
from raydist.pool.records import CollectiveEntry
from raydist.testing.workers import FIRST_PID, FakeAgent, FakeProcess, FakeWorker, failed_outcome


@dataclass(eq=False)
class FakeCall:
    """One call sent to a fake process: ``queued`` until it runs, ``hung``
    when it never returns, then ``done`` (``value``) or ``failed`` (``error``)."""

    process: FakeProcess
    method: str
    args: Tuple[Any, ...]
    number: int
    state: str = "queued"
    value: Any = None
    error: Optional[BaseException] = None
    on_end: List[Callable[[], None]] = field(default_factory=list)  # ``FakeCluster.when_ended``

    @property
    def ended(self) -> bool:
        return self.state in ("done", "failed")

    def finish(self, value: Any = None, error: Optional[BaseException] = None) -> None:
        self.state, self.value, self.error = ("failed" if error is not None else "done"), value, error
        for notify in self.on_end:
            notify()


class FakeProcesses:
    def __init__(self, load: Callable[[Any], Any], speeds: Optional[Mapping[str, float]] = None):
        self.workers: List[FakeWorker] = []
        self._by_pid: Dict[int, FakeWorker] = {}
        self._in_collective: List[FakeWorker] = []  # workers that entered a collective they have not left (a hang)
        self._speeds = dict(speeds or {})  # node -> what its workers' compute probe measures (default 100 GFLOP/s)
        self._devices_visible = True
        self.agents: List[FakeAgent] = []
        self._load = load  # how a worker reads a call it was sent
        self._queues: Dict[int, List[FakeCall]] = {}  # process number -> its calls not yet ended, in order
        self._numbers = itertools.count()
        self._calls = itertools.count()

    def start_worker(self, node: Optional[str], reservation: int, slot: int) -> FakeWorker:
        number = next(self._numbers)
        worker = FakeWorker(number, node or "", FIRST_PID + number, reservation=reservation, slot=slot, load=self._load)
        worker.gflops = self._speeds.get(node or "", worker.gflops)
        worker.devices_visible = self._devices_visible
        self.workers.append(worker)
        self._by_pid[worker.pid] = worker
        self._queues[number] = []
        if node is None:
            self.end(worker, "its bundle is not placed", None)
        return worker

    def set_speed(self, node_id: str, gflops: float) -> None:
        """What the compute probe of a worker started on ``node_id`` from now on measures."""
        self._speeds[node_id] = gflops

    def hide_devices(self) -> None:
        """Workers started from now on do not see their accelerators (torch falls
        back to the CPU), as on a cluster whose GPUs Ray only counts."""
        self._devices_visible = False

    def start_agent(self, node_id: str, node_alive: bool) -> FakeAgent:
        number = next(self._numbers)
        agent = FakeAgent(number, node_id, FIRST_PID + number, ended=self.ended, killed=self.killed, recorded=self.recorded)
        self.agents.append(agent)
        self._queues[number] = []
        if not node_alive:
            self.end(agent, "its node is gone", None)
        return agent

    def call(self, process: FakeProcess, method: str, args: Tuple[Any, ...]) -> FakeCall:
        call = FakeCall(process, method, args, next(self._calls))
        if process.alive:
            self._queues[process.number].append(call)
        else:
            call.finish(error=WorkerDied(process.how_it_ended))
        return call

    def runnable(self) -> List[FakeCall]:
        """Each process's next call that can run (none behind a hung one), oldest first."""
        heads = [queue[0] for queue in self._queues.values() if queue and queue[0].state == "queued"]
        return sorted(heads, key=lambda call: call.number)

    def done(self, call: FakeCall) -> None:
        """``call`` ended (it left its process's queue)."""
        self._queues[call.process.number].remove(call)

    def end(self, process: FakeProcess, how: str, exit_code: Optional[int]) -> None:
        """The process is gone: its calls not yet ended fail, and so will any sent
        later; a call waiting in a collective on another worker fails (its peer is gone)."""
        process.alive, process.how_it_ended, process.exit_code = False, how, exit_code
        for call in self._queues.get(process.number, []):
            call.finish(error=WorkerDied(how))
        self._queues[process.number] = []
        if isinstance(process, FakeWorker):
            self._break_collectives()

    def _break_collectives(self) -> None:
        """As gloo: a rank waiting in a collective fails once a peer process is gone
        (only those that entered one are looked at: a shutdown kills every worker)."""
        for worker in list(self._in_collective):
            waiting = [entry for entry in worker.recorder if not entry.completed]
            queue = self._queues.get(worker.number, [])
            if not worker.alive:
                self._in_collective.remove(worker)
            if not worker.alive or not waiting or not queue or queue[0].state != "hung":
                continue
            worker.recorder = [replace(entry, completed=True, failed=True) if not entry.completed else entry for entry in worker.recorder]
            self._in_collective.remove(worker)
            call = queue[0]
            error = RuntimeError(f"[gloo] {waiting[0].op} #{waiting[0].seq}: Connection closed by peer")
            call.finish(failed_outcome(error) if call.method == "execute" else None, None if call.method == "execute" else error)
            self.done(call)

    def wait_in_collective(self, worker: FakeWorker, seq: int, entered: bool, now: float) -> None:
        """``worker`` completed all_reduces 1 to ``seq`` - 1 and, if ``entered``, waits in #``seq``."""

        def entry(number: int, done: bool) -> CollectiveEntry:
            return CollectiveEntry("0", number, "all_reduce", ((1,),), ("float32",), int(now * 1e9), done)

        worker.recorder = [entry(n, True) for n in range(1, seq)] + ([entry(seq, False)] if entered else [])
        if entered and worker not in self._in_collective:
            self._in_collective.append(worker)

    def straggle_step(self, straggler: FakeWorker, seq: int, late: float, now: float) -> None:
        """Every live rank of ``straggler``'s world completed all_reduce #``seq``,
        entered at ``now``; ``straggler`` entered it ``late`` seconds later."""
        attempt = straggler.env.get("TORCHELASTIC_RESTART_COUNT")
        for worker in self.workers:
            if worker.alive and worker.rank is not None and worker.env.get("TORCHELASTIC_RESTART_COUNT") == attempt:
                entered = now + (late if worker is straggler else 0.0)
                entry = CollectiveEntry("0", seq, "all_reduce", ((1,),), ("float32",), int(entered * 1e9), True)
                worker.recorder = [e for e in worker.recorder if e.group != "0" or e.seq != seq][-127:] + [entry]

    def recorded(self, pid: int) -> List[CollectiveEntry]:
        """A worker's flight recorder, as its node's agent reads it."""
        process = self._by_pid.get(pid)
        return list(process.recorder) if process is not None and process.alive else []

    def end_all(self, how: str, which: Callable[[FakeProcess], bool] = lambda process: True, exit_code: Optional[int] = None) -> None:
        """Every process still alive (``which`` of them) is gone."""
        for process in [*self.workers, *self.agents]:
            if process.alive and which(process):
                self.end(process, how, exit_code)

    def run(self, call: FakeCall, now: float, raising: Optional[Exception] = None) -> None:
        """``call`` on its process, now (``raising``: it raises that instead)."""
        try:
            if raising is not None:
                raise raising
            call.finish(getattr(call.process, call.method)(*call.args))
        except Exception as error:  # noqa: BLE001 - a raydist method that raised on the worker
            if call.method == "execute":  # the user's code reports its errors in an Outcome, as RayWorker does
                call.finish(failed_outcome(error, now))
            else:
                call.finish(error=CallFailed(f"{type(error).__name__}: {error}", error))
        self.done(call)

    def ended(self, pid: int) -> Tuple[Optional[str], Optional[int]]:
        """What a node's agent reads of the process ``pid``: (its stderr's tail, its exit status)."""
        process = next((w for w in self.workers if w.pid == pid), None)
        return (None, process.exit_code) if process is not None and not process.alive else (None, None)

    def killed(self, pid: int, signal_name: str) -> None:
        """A signal without a handler ended the worker ``pid`` (exit status: minus its number)."""
        process = next((w for w in self.workers if w.pid == pid and w.alive), None)
        if process is not None:
            self.end(process, f"the worker died unexpectedly (killed by {signal_name})", -int(getattr(signal, signal_name)))

    def alive(self) -> List[str]:
        return [repr(w) for w in self.workers if w.alive] + [f"agent on {a.node_id}" for a in self.agents if a.alive]
