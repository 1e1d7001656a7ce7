"""The driver's side of a group's node agents: start one per node, ask them
for evidence, stacks or a preemption warning, and explain dead ranks."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple, cast

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raydist.errors import WorkerFailure
from raydist.pool.records import WorkerEvidence, WorkerInfo
from raydist.pool.rules.explain import explain_death
from raydist.pool.worker.evidence import NodeAgent

EVIDENCE_TIMEOUT_S = 10.0


def start_agents(node_ids: Sequence[str]) -> Dict[str, object]:
    """One NodeAgent per node, pinned there."""

    remote_agent = ray.remote(num_cpus=0, max_restarts=0)(NodeAgent)
    return {
        node_id: remote_agent.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
        for node_id in dict.fromkeys(node_ids)
    }

def ask_agents(
    agents: Dict[str, object],
    workers: Sequence["WorkerInfo"],
    ranks: Sequence[int],
    method: str,
    *args: object,
    timeout: float = EVIDENCE_TIMEOUT_S,
) -> Dict[int, object]:
    """``NodeAgent.<method>`` for ``ranks``, one call per node, in parallel;
    ranks whose node (or agent) does not answer within ``timeout`` are left out."""

    by_node: Dict[str, List[Tuple[int, int, WorkerEvidence]]] = {}
    for rank in ranks:
        worker = workers[rank]
        if worker.evidence is not None and worker.node_id in agents:
            by_node.setdefault(worker.node_id, []).append((rank, worker.pid, worker.evidence))
    refs = [getattr(agents[node], method).remote(requests, *args) for node, requests in by_node.items()]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    found: Dict[int, object] = {}
    for ref in ready:
        try:
            found.update(ray.get(ref))
        except Exception:  # noqa: BLE001 - an agent whose node went away: that evidence is missing
            pass
    return found

def explain_deaths(failures: Sequence["WorkerFailure"], workers: Sequence["WorkerInfo"], agents: Dict[str, object]) -> List["WorkerFailure"]:
    """``failures`` with each dead process's cause and last stderr lines,
    read on its node (a rank whose node is gone says so)."""
    dead = [f.rank for f in failures if f.crashed and f.rank < len(workers)]
    if not dead or not ray.is_initialized():
        return list(failures)
    found = ask_agents(agents, workers, dead, "evidence")
    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    explained = []
    for failure in failures:
        if failure.rank in dead:
            tail, code = cast(Tuple[Optional[str], Optional[int]], found.get(failure.rank, (None, None)))
            cause = explain_death(failure.died or "", tail, code, workers[failure.rank].node_id in alive)
            failure = dataclasses.replace(failure, died=cause, output=tail)
        explained.append(failure)
    return explained
