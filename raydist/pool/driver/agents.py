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
from typing import Any, Dict, Iterable, List, Optional, Protocol, Sequence, Tuple, cast

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raydist.errors import WorkerFailure
from raydist.pool.records import WorkerEvidence, WorkerInfo
from raydist.pool.rules.explain import explain_death
from raydist.pool.worker.evidence import NodeAgent

EVIDENCE_TIMEOUT_S = 10.0
Requests = List[Tuple[int, int, WorkerEvidence]]  # (rank, pid, evidence) on one node


class Process(Protocol):
    """A worker process as the agents see it (a ``WorkerInfo``, a spare's ``Placement``)."""

    @property
    def node_id(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def evidence(self) -> Optional[WorkerEvidence]: ...


def driver_node() -> Optional[str]:
    """This driver's node id; None through Ray Client (its files are on another machine)."""
    try:
        if ray.util.client.ray.is_connected():
            return None
    except Exception:  # noqa: BLE001 - no Ray Client support in this Ray: a plain driver
        pass
    return ray.get_runtime_context().get_node_id()


class NodeAgents:
    """One group's agents: this process on ``local_node``, an actor elsewhere."""

    def __init__(self, local_node: Optional[str]):
        self.local_node = local_node
        self._here = NodeAgent()
        self._actors: Dict[str, Any] = {}  # node id -> NodeAgent actor
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
        remote_agent = ray.remote(num_cpus=0, max_restarts=0)(NodeAgent)
        for node_id in dict.fromkeys(node_ids):
            if node_id != self.local_node and node_id not in self._actors:
                strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
                self._actors[node_id] = remote_agent.options(scheduling_strategy=strategy).remote()

    @property
    def actors(self) -> List[Any]:
        return list(self._actors.values())

    def actor_on(self, node_id: str) -> Optional[Any]:
        """The agent actor on ``node_id``; None on the driver's node (answered here) or where none started."""
        return self._actors.get(node_id)

    def retire(self, node_ids: Sequence[str]) -> List[Any]:
        """The actors on ``node_ids`` (nodes leaving the group), handed over to be killed."""
        return [self._actors.pop(node) for node in list(self._actors) if node in node_ids]

    def forget(self) -> List[Any]:
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
    ) -> Dict[int, object]:
        """``NodeAgent.<method>`` for ``ranks``, one call per node, in parallel;
        ranks whose node (or agent) does not answer within ``timeout`` are
        left out, and so are nodes without an agent unless ``start_missing``."""
        by_node: Dict[str, Requests] = {}
        for rank in ranks:
            worker = workers[rank]
            if worker.evidence is not None:
                by_node.setdefault(worker.node_id, []).append((rank, worker.pid, worker.evidence))
        here = by_node.pop(self.local_node, []) if self.local_node is not None else []
        if start_missing:
            self.start(list(by_node))  # agents that are not there yet (a failure during start-up)
        refs = [getattr(self._actors[node], method).remote(requests, *args) for node, requests in by_node.items() if node in self._actors]
        found: Dict[int, object] = dict(getattr(self._here, method)(here, *args)) if here else {}
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout) if refs else ([], [])
        for ref in ready:
            try:
                found.update(ray.get(ref))
            except Exception:  # noqa: BLE001 - an agent whose node went away: that evidence is missing
                pass
        return found


def explain_deaths(failures: Sequence[WorkerFailure], workers: Sequence[WorkerInfo], agents: NodeAgents) -> List[WorkerFailure]:
    """``failures`` with each dead process's cause and last stderr lines,
    read on its node (a rank whose node is gone says so)."""
    dead = [f.rank for f in failures if f.crashed and f.rank < len(workers)]
    if not dead or not ray.is_initialized():
        return list(failures)
    found = agents.ask(workers, dead, "evidence")
    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
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
