"""``FakeCluster``: the cluster seam in memory, deterministic, for the engine's own tests.

Everything the engine asks of a cluster (``raydist.pool.cluster.seam``)
happens here without a process: workers are ``FakeWorker`` objects whose
calls queue in the order sent and run, in that order, when the engine waits
for one (``wait``, ``get``, ``sleep``); the clock is virtual and moves only
when the engine waits with a timeout and nothing it waits for can end; the
engine's timers (polls, spare refills) run at their virtual moment. So the
same test, with the same ``Fault`` list, takes the same path every time.

``Fault`` (``raydist.testing.faults``) makes something go wrong at a chosen moment: the ``nth`` call of a
method on a chosen worker raises, kills its process, never returns, takes
its node down or starts draining it (gone at the drain's deadline), or runs an action (``shutdown()`` from
another thread). The ``Ledger`` lists what is still alive or held, so that
"nothing is left" after a shutdown is one assertion. A wait that could never
end raises ``EngineStuck``.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from raydist.pool.cluster.seam import Printer
from raydist.pool.records import ClusterNode
from raydist.pool.rules.sizing import Request
from raydist.pool.worker.metrics import FIGURES
from raydist.testing.clock import EPOCH, VirtualClock, VirtualTimer, in_action
from raydist.testing.faults import Fault, FaultBook
from raydist.testing.nodes import DRIVER_NODE, FakeNodes, FakeReservation
from raydist.testing.processes import FakeCall, FakeProcesses
from raydist.testing.workers import FakeAgent, FakeProcess, FakeWorker

DRAIN_NOTICE_S = 20.0  # a "drain-node" fault's deadline: the node is gone this long after
STRAGGLE_STEP_S = 0.1  # a "straggle" fault's world completes one all_reduce this often


class FakeCluster:
    """An in-memory cluster of ``nodes`` (name -> resources), plus the driver's node."""

    def __init__(
        self, nodes: Mapping[str, Mapping[str, float]], faults: Sequence[Fault] = (), speeds: Optional[Mapping[str, float]] = None
    ):
        self.nodes = FakeNodes(nodes)
        self.faults = FaultBook(faults)
        self.clock = VirtualClock()
        self.connected = True
        self._table: Dict[bytes, Any] = {}  # what pickle() stood for
        self.processes = FakeProcesses(self._table.__getitem__, speeds)  # speeds: node -> its workers' GFLOP/s
        self.recorded: List[Tuple[str, float, Dict[str, str]]] = []  # the run's figures (``record``), in order
        self._lock = threading.RLock()

    # -- who is there ---------------------------------------------------------
    def connect(self, address: Optional[str], startup_timeout: float) -> None:
        if not self.connected:
            raise ConnectionError("the fake cluster was shut down")

    def session(self) -> Optional[str]:
        return "fake-session" if self.connected else None

    def driver_node(self) -> Optional[str]:
        return DRIVER_NODE

    def driver_ip(self) -> str:
        return "127.0.0.1"  # the pdb relay really listens on it

    def alive_nodes(self) -> List[ClusterNode]:
        return self.nodes.alive()

    def draining_nodes(self) -> Dict[str, float]:
        return self.nodes.draining()

    def free_resources(self) -> Dict[str, Dict[str, float]]:
        return self.nodes.free()

    def forward_output(self, wrap: Callable[[Printer], Printer], drop: Callable[[List[str]], bool]) -> bool:
        return False  # fake workers print nothing of their own

    # -- the clock ------------------------------------------------------------
    def monotonic(self) -> float:
        return self.clock.now

    def time(self) -> float:
        return EPOCH + self.clock.now

    def record(self, figure: str, value: float, tags: Mapping[str, str]) -> None:
        assert figure in FIGURES, figure
        self.recorded.append((figure, value, dict(tags)))

    def sleep(self, seconds: float) -> None:
        self._until([], 0, self.clock.now + seconds)

    def after(self, delay: float, fn: Callable[[], None], name: str) -> VirtualTimer:
        return self.clock.after(delay, fn, name)

    def run_loop(self, turn: Callable[[], Optional[float]], name: str) -> "FakeLoop":
        return FakeLoop(self.clock, turn, name)

    def park(self, done: threading.Event, timeout: Optional[float], on_interrupt: Callable[[], None] = lambda: None) -> bool:
        if in_action():  # a timer or action never waits on the engine: it runs while the engine is held
            return done.is_set()
        deadline = None if timeout is None else self.clock.now + timeout
        with self.clock.parked(on_interrupt):
            self.clock.run_until(done.is_set, deadline, self._run_queued, lambda: "the run's loop to end a call or a request")
        return done.is_set()

    def when_ended(self, pending: Sequence[FakeCall], notify: Callable[[], None]) -> None:
        with self._lock:
            for call in pending:
                if call.ended:
                    notify()
                else:
                    call.on_end.append(notify)

    # -- placement ------------------------------------------------------------
    def reserve(self, request: Request, timeout: float, stopping: Callable[[], bool] = lambda: False) -> Tuple[FakeReservation, int]:
        reservation = self.nodes.reserve(request, timeout, self.monotonic, self.sleep, stopping)
        return reservation, len(reservation.nodes)

    def bundle_nodes(self, reservation: Optional[FakeReservation]) -> Dict[int, str]:
        if reservation is None:
            return {}
        return {bundle: node for bundle, node in reservation.nodes.items() if node is not None}

    def free(self, reservation: FakeReservation) -> None:
        with self._lock:
            self.nodes.release(reservation)
            self.processes.end_all("the placement group was removed", lambda p: getattr(p, "reservation", None) == reservation.number, -9)

    def wait_released(self, held: Mapping[str, Mapping[str, float]]) -> None:
        pass  # freed at once here

    def room_for(self, request: Request, taken: Sequence[str] = ()) -> int:
        return self.nodes.room_for(request, taken)

    # -- workers --------------------------------------------------------------
    def start_worker(
        self, reservation: FakeReservation, slot: int, bundle: Mapping[str, float], accelerator_resource: Optional[str], per_bundle: int = 1
    ) -> FakeWorker:
        with self._lock:
            node = None if reservation.freed else reservation.nodes.get(slot // per_bundle)
            return self.processes.start_worker(node, reservation.number, slot)

    def start_agent(self, node_id: str) -> FakeAgent:
        with self._lock:
            return self.processes.start_agent(node_id, self.nodes.nodes[node_id].alive)

    def find(self, name: str, namespace: str) -> None:  # the fake's ranks save no training state
        return None

    def call(self, worker: FakeProcess, method: str, *args: Any) -> FakeCall:
        with self._lock:
            return self.processes.call(worker, method, args)

    def pickle(self, value: Any) -> bytes:
        key = b"fake-call-%d" % len(self._table)
        self._table[key] = value
        return key

    def share(self, data: bytes) -> bytes:
        return data

    def kill(self, worker: FakeProcess) -> None:
        with self._lock:
            if worker.alive:
                self.processes.end(worker, "killed by raydist", -9)

    # -- waiting --------------------------------------------------------------
    def wait(self, pending: Sequence[FakeCall], num_returns: int, timeout: Optional[float]) -> Tuple[List[FakeCall], List[FakeCall]]:
        if not pending or all(call.ended for call in pending):  # (nothing to run for: what is queued runs when it is waited for)
            return list(pending), []
        return self._until(pending, min(num_returns, len(pending)), None if timeout is None else self.clock.now + timeout)

    def _until(self, pending: Sequence[FakeCall], count: int, deadline: Optional[float]) -> Tuple[List[FakeCall], List[FakeCall]]:
        """Run what can run and move the clock until ``count`` of ``pending`` ended or ``deadline`` came."""
        settled = lambda: bool(pending) and sum(call.ended for call in pending) >= count  # noqa: E731
        self.clock.run_until(settled, deadline, self._run_queued, lambda: str([c for c in pending if not c.ended]))
        return [call for call in pending if call.ended], [call for call in pending if not call.ended]

    def get(self, pending: Sequence[FakeCall], timeout: Optional[float] = None) -> List[Any]:
        _, not_ended = self.wait(pending, len(pending), timeout)
        if not_ended:
            raise TimeoutError(f"{len(not_ended)} call(s) had not ended within {timeout} s")
        for call in pending:
            if call.error is not None:
                raise call.error
        return [call.value for call in pending]

    def _run_queued(self) -> None:
        """Run every call that can run, oldest first, each process's in order."""
        with self._lock:
            while not self.clock.busy and (runnable := self.processes.runnable()):
                for call in runnable:
                    if call.state == "queued":  # (else its process died with an earlier call of this round: a lost node)
                        self._run(call)
                    if self.clock.busy:
                        return  # an action runs before the next call

    def _run(self, call: FakeCall) -> None:
        """Run ``call``, or do what the fault that strikes it says instead."""
        process = call.process
        fault = self.faults.strike(call.method, process) if isinstance(process, FakeWorker) else None
        kind = fault.kind if fault is not None else None
        if fault is not None and fault.action is not None:
            self.clock.soon(fault.action)  # "act": as another thread, before the call runs
        if kind == "interrupt":
            self.clock.interrupt()
        if kind == "drain-node":  # (a call given ``seconds`` runs on while its node drains, as training does)
            self.drain_node(process.node_id, self.time() + DRAIN_NOTICE_S)
            kind = "slow" if fault.seconds else None  # type: ignore[union-attr]
        if kind == "die":
            self.processes.end(process, f"the worker died unexpectedly (exit code {fault.exit_code})", fault.exit_code)  # type: ignore[union-attr]
        elif kind == "lose-node":
            self.lose_node(process.node_id)
        elif kind in ("hang", "slow", "straggle"):
            call.state = "hung"
            if kind == "hang" and fault.collective and isinstance(process, FakeWorker):  # type: ignore[union-attr]
                self.processes.wait_in_collective(process, fault.collective, fault.entered, self.time())  # type: ignore[union-attr]
            if kind in ("slow", "straggle"):
                self.clock.after(fault.seconds, partial(self._finish_slow, call), "fake-slow-call")  # type: ignore[union-attr]
            if kind == "straggle":
                self._straggle(call, fault.late, 1)  # type: ignore[union-attr]
        else:
            raising = RuntimeError(f"fault injected into {call.method} (rank/slot {fault.who})") if fault and kind == "raise" else None
            self.processes.run(call, self.time(), raising)

    def _straggle(self, call: FakeCall, late: float, seq: int) -> None:
        """While ``call`` runs, its world completes all_reduce #``seq``, its rank ``late`` s after the others; the next soon."""
        with self._lock:
            if call.state != "hung" or not isinstance(call.process, FakeWorker):
                return  # it ended (or its process died)
            self.processes.straggle_step(call.process, seq, late, self.time())
            self.clock.after(STRAGGLE_STEP_S, partial(self._straggle, call, late, seq + 1), "fake-straggle-step")

    def _finish_slow(self, call: FakeCall) -> None:
        with self._lock:
            if call.state == "hung":  # (else its process died meanwhile)
                self.processes.run(call, self.time())

    # -- what happens to nodes and processes, and what is left ----------------
    def lose_node(self, node_id: str) -> None:
        with self._lock:
            self.nodes.lose(node_id)
            self.processes.end_all("the actor's node died", lambda p: p.node_id == node_id)

    def drain_node(self, node_id: str, deadline: float) -> None:
        """The node drains: no new bundle goes there, and at ``deadline`` it is gone."""
        with self._lock:
            self.nodes.nodes[node_id].drain_deadline = deadline
            self.clock.after(max(0.0, deadline - self.time()), partial(self.lose_node, node_id), "fake-drain-end")

    def add_node(self, node_id: str, resources: Mapping[str, float]) -> None:
        with self._lock:
            self.nodes.add(node_id, resources)

    def shutdown(self) -> None:
        """As ``ray.shutdown()``: the session ends, and every process with it."""
        with self._lock:
            self.connected = False
            self.processes.end_all("the cluster was shut down")
            self.nodes.release_all()  # gone with it

    def leftovers(self) -> List[str]:
        """Everything still alive or held: workers, agents, placements, timers (empty after a clean shutdown)."""
        alive = self.processes.alive()
        held = [f"reservation #{r.number}" for r in self.nodes.reservations if not r.freed]
        return alive + held + [f"timer {name}" for name in self.clock.pending() if not name.startswith("fake-")]


class FakeLoop:
    """A run's control loop on the virtual clock: each turn runs as one of its
    functions (at the next step after a wake, or at the moment the last turn
    asked for), never two at once; a wake during a turn turns it once more after."""

    def __init__(self, clock: VirtualClock, turn: Callable[[], Optional[float]], name: str):
        self._clock, self._turn, self._name = clock, turn, name
        self._lock = threading.Lock()
        self._scheduled = self._turning = self._again = self._stopped = False
        self._thread: Optional[threading.Thread] = None  # the action thread of the turn in progress
        self._timer: Optional[VirtualTimer] = None

    def wake(self) -> None:
        with self._lock:
            if self._stopped:
                return
            if self._turning:
                self._again = True
            elif not self._scheduled:
                self._scheduled = True
                self._clock.soon(self._run)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._timer is not None:
                self._timer.cancel()

    def in_turn(self) -> bool:
        return self._turning and threading.current_thread() is self._thread

    def _run(self) -> None:
        with self._lock:
            self._scheduled = False
            if self._stopped or self._turning:
                return
            self._turning, self._again, self._thread = True, False, threading.current_thread()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        try:
            due = self._turn()
        finally:
            with self._lock:
                self._turning = False
                again = self._again and not self._stopped
        if again:
            self.wake()
        elif due is not None:
            with self._lock:
                if not self._stopped:
                    self._timer = self._clock.after(max(0.0, due - self._clock.now), self.wake, "fake-loop-turn")
