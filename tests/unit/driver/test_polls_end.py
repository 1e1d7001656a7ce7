"""A run's polls end with the run: once it has ended, none of them reaches the
cluster. After ``ray.shutdown()`` a Ray call from any thread ends the
driver's whole process, so a poll still in a Ray call when the user shuts
Ray down right after a run would take their program with it.

The watchers' polls run on real threads here (as ``RayCluster.after`` runs
them), with a cluster whose calls wait for the test's say-so; the ask that
a straggler poll makes of a lost node's agent ends within one slice of the
watch's stop.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from raydist.pool.cluster.loop_thread import PollTimer
from raydist.pool.driver.agents import ASK_SLICE_S, NodeAgents
from raydist.pool.driver.watcher import GroupWatcher
from raydist.pool.records import WorkerEvidence, WorkerInfo

WAIT_S = 10.0  # a bound on every wait of the test itself (none is reached when the code is right)


class JoinSeen(PollTimer):
    """``RayCluster``'s timer, telling when a join begins."""

    def __init__(self, delay: float, fn: Callable[[], None], joining: threading.Event):
        super().__init__(delay, fn)
        self.daemon, self._joining = True, joining

    def join(self, timeout: Optional[float] = None) -> None:
        self._joining.set()
        super().join(timeout)


class SlowDrainsCluster:
    """A cluster whose ``draining_nodes`` call, once under way, returns only when ``release`` is set."""

    def __init__(self) -> None:
        self.in_call, self.release, self.joining = threading.Event(), threading.Event(), threading.Event()
        self.log: List[str] = []

    def after(self, delay: float, fn: Callable[[], None], name: str) -> JoinSeen:
        timer = JoinSeen(delay, fn, self.joining)
        timer.start()
        return timer

    def draining_nodes(self) -> Dict[str, float]:
        self.in_call.set()
        self.release.wait(WAIT_S)
        self.log.append("the poll's cluster call returned")
        return {}


def watcher_in_its_poll(cluster: SlowDrainsCluster) -> GroupWatcher:
    watcher = GroupWatcher([], lambda ranks, deadline: None, lambda: None, interval=0.0, cluster=cluster)  # type: ignore[arg-type]
    watcher.start()
    assert cluster.in_call.wait(WAIT_S), "the watcher never polled"
    return watcher


def test_the_runs_end_waits_for_a_poll_under_way_to_leave_the_cluster() -> None:
    cluster = SlowDrainsCluster()
    watcher = watcher_in_its_poll(cluster)
    threading.Thread(target=lambda: cluster.joining.wait(WAIT_S) and cluster.release.set(), daemon=True).start()
    watcher.stop()
    watcher.wait_stopped(WAIT_S)
    cluster.log.append("the run's end went on")
    assert cluster.log == ["the poll's cluster call returned", "the run's end went on"]


def test_a_poll_that_never_returns_holds_the_runs_end_only_for_its_bound() -> None:
    cluster = SlowDrainsCluster()
    watcher = watcher_in_its_poll(cluster)
    watcher.stop()
    watcher.wait_stopped(0.05)
    assert cluster.log == [] and cluster.joining.is_set()  # it waited, and went on without the poll
    cluster.release.set()


def test_a_poll_that_ends_the_run_itself_does_not_wait_for_itself() -> None:
    cluster = SlowDrainsCluster()
    cluster.release.set()
    ended: List[str] = []

    def stop_from_the_poll() -> None:  # as a watcher's callback (growth) ending the run from the poll's thread
        watcher.stop()
        watcher.wait_stopped(WAIT_S)
        ended.append("stopped")  # (a thread joining itself raises, and the poll would swallow it)

    watcher = GroupWatcher([], lambda ranks, deadline: None, stop_from_the_poll, room=lambda: 1, interval=0.0, cluster=cluster)  # type: ignore[arg-type]
    watcher.start()
    watcher.wait_stopped(WAIT_S)
    assert ended == ["stopped"]


class SilentAgentsCluster:
    """Agents that never answer (their node is gone); the clock moves by each wait's timeout."""

    def __init__(self) -> None:
        self.now = 0.0
        self.stop_at: Optional[float] = None

    def monotonic(self) -> float:
        return self.now

    def start_agent(self, node_id: str) -> str:
        return f"agent on {node_id}"

    def call(self, actor: Any, method: str, *args: Any) -> str:
        return f"{method} of {actor}"

    def wait(self, pending: Sequence[Any], num_returns: int, timeout: float) -> Tuple[List[Any], List[Any]]:
        self.now += timeout
        return [], list(pending)


def worker_on(node_id: str) -> WorkerInfo:
    evidence = WorkerEvidence(None, "exit", "stacks", "preemption")
    return WorkerInfo(0, 1, 0, 1, 0, 1, node_id, "10.0.0.2", 100, (), (), None, 0, evidence)


def test_an_ask_of_a_silent_agent_ends_within_a_slice_of_its_watch_stopping() -> None:
    cluster = SilentAgentsCluster()
    agents = NodeAgents(cluster, local_node="driver-node")  # type: ignore[arg-type]
    agents.start(["lost-node"])
    workers = [worker_on("lost-node")]

    assert agents.ask(workers, [0], "collectives", timeout=5.0, start_missing=False) == {}
    assert cluster.now == 5.0  # unstopped: it waits its whole timeout

    cluster.now = 0.0
    found = agents.ask(workers, [0], "collectives", timeout=5.0, start_missing=False, stopping=lambda: cluster.now >= 1.0)
    assert found == {} and 1.0 <= cluster.now <= 1.0 + ASK_SLICE_S + 1e-9
