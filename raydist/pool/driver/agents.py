"""The driver's side of a group's node agents: what reads evidence, dumps
stacks, forwards signals and warns of a preemption on each node.

On the driver's own node the driver does it itself (a plain ``NodeAgent``
in this process: the ranks there are this machine's processes), so a
single-node run starts no extra process. On every other node a
``NodeAgent`` actor starts once the group is up, off the start path: it
must exist before a drain, since a draining node accepts no new actors.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Dict, Iterable, List, Optional, Protocol, Sequence, Set, Tuple, cast

from raydist.errors import WorkerFailure
from raydist.pool.cluster.seam import Cluster, Worker
from raydist.pool.records import WorkerEvidence, WorkerInfo
from raydist.pool.rules.explain import explain_death
from raydist.pool.worker.evidence import NodeAgent

EVIDENCE_TIMEOUT_S = 10.0
ASK_SLICE_S = 0.1  # a poll's ask looks this often whether its watch was stopped (``ask(stopping=)``)
Requests = List[Tuple[int, int, WorkerEvidence]]  # (rank, pid, evidence) on one node


class Process(Protocol):
    """A worker process as the agents see it (a ``WorkerInfo``, a spare's ``Placement``)."""

    @property
    def node_id(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def evidence(self) -> Optional[WorkerEvidence]: ...


class NodeAgents:
    """One group's agents: this process on ``local_node``, an actor elsewhere."""

    def __init__(self, cluster: Cluster, local_node: Optional[str]):
        self._cluster = cluster
        self.local_node = local_node
        self._here = NodeAgent()
        self._actors: Dict[str, Worker] = {}  # node id -> NodeAgent actor
        self._lock = threading.Lock()  # spares are noted from their own threads
        self._started: Dict[Tuple[str, int], Process] = {}  # (node, pid) -> every process whose files are still there

    def note(self, processes: Iterable[Process]) -> None:
        """``processes`` the group started: their files are removed once they are gone (``remove_files``)."""
        with self._lock:
            self._started.update(((p.node_id, p.pid), p) for p in processes if p.evidence is not None)

    def remove_files(self, processes: Optional[Sequence[Process]] = None, timeout: float = EVIDENCE_TIMEOUT_S) -> None:
        """Remove what ``processes`` (by default every one noted) left on their
        nodes, each once it is gone; a node without an agent is skipped (a
        lost node's files went with it; the next start there removes them)."""
        with self._lock:
            chosen = list(self._started.values()) if processes is None else list(processes)
        if chosen:
            self.ask(chosen, range(len(chosen)), "remove", timeout=timeout, start_missing=False)
        with self._lock:  # after: an interrupted removal is done again by the next one
            for process in chosen:
                self._started.pop((process.node_id, process.pid), None)

    def start(self, node_ids: Sequence[str]) -> None:
        """An actor on each of ``node_ids`` but the driver's (returns at once)."""
        for node_id in dict.fromkeys(node_ids):
            if node_id != self.local_node and node_id not in self._actors:
                self._actors[node_id] = self._cluster.start_agent(node_id)

    @property
    def actors(self) -> List[Worker]:
        return list(self._actors.values())

    def actor_on(self, node_id: str) -> Optional[Worker]:
        """The agent actor on ``node_id``; None on the driver's node (answered here) or where none started."""
        return self._actors.get(node_id)

    def retire(self, node_ids: Sequence[str]) -> List[Worker]:
        """The actors on ``node_ids`` (nodes leaving the group), handed over to be killed."""
        return [self._actors.pop(node) for node in list(self._actors) if node in node_ids]

    def forget(self) -> List[Worker]:
        """The actors, handed over to be killed."""
        actors, self._actors = self.actors, {}
        return actors

    def ask(
        self,
        workers: Sequence[Process],
        ranks: Sequence[int],
        method: str,
        *args: object,
        timeout: float = EVIDENCE_TIMEOUT_S,
        start_missing: bool = True,
        stopping: Optional[Callable[[], bool]] = None,
    ) -> Dict[int, object]:
        """``NodeAgent.<method>`` for ``ranks``, one call per node, in parallel;
        ranks whose node (or agent) does not answer within ``timeout`` are
        left out, and so are nodes without an agent unless ``start_missing``.
        With ``stopping``, the wait ends (what arrived so far kept) within
        ``ASK_SLICE_S`` of it turning True: a poll's ask on a lost node's agent
        never holds up the run's end."""
        by_node: Dict[str, Requests] = {}
        for rank in ranks:
            worker = workers[rank]
            if worker.evidence is not None:
                by_node.setdefault(worker.node_id, []).append((rank, worker.pid, worker.evidence))
        here = by_node.pop(self.local_node, []) if self.local_node is not None else []
        if start_missing:
            self.start(list(by_node))  # agents that are not there yet (a failure during start-up)
        cluster = self._cluster
        refs = [cluster.call(self._actors[node], method, requests, *args) for node, requests in by_node.items() if node in self._actors]
        found: Dict[int, object] = dict(getattr(self._here, method)(here, *args)) if here else {}
        ready = self._wait(refs, timeout, stopping)
        for ref in ready:
            try:
                found.update(cluster.get([ref])[0])
            except Exception:  # noqa: BLE001 - an agent whose node went away: that evidence is missing
                pass
        return found

    def _wait(self, refs: List[object], timeout: float, stopping: Optional[Callable[[], bool]]) -> List[object]:
        """The calls of ``refs`` that ended within ``timeout`` (or before ``stopping()``)."""
        cluster = self._cluster
        if stopping is None:
            return cluster.wait(refs, num_returns=len(refs), timeout=timeout)[0]
        deadline, ready, pending = cluster.monotonic() + timeout, [], list(refs)
        while pending and not stopping():
            left = deadline - cluster.monotonic()
            if left <= 0:
                break
            done, pending = cluster.wait(pending, num_returns=len(pending), timeout=min(ASK_SLICE_S, left))
            ready += done
        return ready

    def clock(self, node_id: str, timeout: float) -> Optional[int]:
        """``time.time_ns()`` read by the agent on ``node_id``; None where there
        is none (the driver's node: answered in this process)."""
        actor = self._actors.get(node_id)
        if actor is None:
            return None
        return int(self._cluster.get([self._cluster.call(actor, "clock")], timeout=timeout)[0])

    @property
    def connected(self) -> bool:
        """Whether the cluster session the agents run in is still there."""
        return self._cluster.session() is not None

    def alive_nodes(self) -> Set[str]:
        """The cluster's nodes alive now (empty once its session is gone)."""
        return {node.node_id for node in self._cluster.alive_nodes()} if self._cluster.session() is not None else set()


def explain_deaths(failures: Sequence[WorkerFailure], workers: Sequence[WorkerInfo], agents: NodeAgents) -> List[WorkerFailure]:
    """``failures`` with each dead process's cause and last stderr lines,
    read on its node (a rank whose node is gone says so)."""
    dead = [f.rank for f in failures if f.crashed and f.rank < len(workers)]
    alive = agents.alive_nodes() if dead else set()
    if not alive:  # no death, or the cluster is gone
        return list(failures)
    found = agents.ask(workers, dead, "evidence")
    explained = []
    for failure in failures:
        if failure.rank in dead:
            tail, code = cast(Tuple[Optional[str], Optional[int]], found.get(failure.rank, (None, None)))
            cause = explain_death(failure.died or "", tail, code, workers[failure.rank].node_id in alive)
            failure = dataclasses.replace(failure, died=cause, output=tail)
        explained.append(failure)
    # Read: the dead processes' files go now (a lost node's went with it), whatever the group does next.
    agents.remove_files([workers[rank] for rank in dead if workers[rank].node_id in alive])
    return explained
