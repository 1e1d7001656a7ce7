"""How many workers of which kind, with which resources, and whether the
cluster can ever host them. Pure: the cluster's nodes come in as records."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from raydist.core.accelerators import AUTO_ORDER, BY_NAME, CPU, Accelerator
from raydist.pool.records import ClusterNode
from raydist.pool.rules.text import fmt_resources, per_node_text


def resolve_accelerator(accelerator: str, resources_per_worker: Mapping[str, float], nodes: List[ClusterNode]) -> Accelerator:
    """The accelerator kind each worker gets.

    "auto" takes a device resource named in ``resources_per_worker`` (so
    ``{"GPU": 2}`` means GPU workers), else the first kind the cluster has,
    else CPU.
    """
    if accelerator != "auto":
        return BY_NAME[accelerator]
    for row in AUTO_ORDER:
        if resources_per_worker.get(row.ray_resource or "", 0) > 0:
            return row
    for row in AUTO_ORDER:
        if row.ray_resource not in resources_per_worker and any(
            node.resources.get(row.ray_resource or "", 0) >= 1 for node in nodes
        ):
            return row
    return CPU

def worker_bundle(accelerator: Accelerator, resources_per_worker: Mapping[str, float]) -> Dict[str, float]:
    """One worker's bundle: 1 CPU (+1 device) unless ``resources_per_worker`` says otherwise."""
    bundle: Dict[str, float] = {"CPU": 1.0}
    if accelerator.ray_resource is not None:
        bundle[accelerator.ray_resource] = 1.0
    bundle.update(resources_per_worker)
    bundle = {name: amount for name, amount in bundle.items() if amount > 0}
    if not bundle:
        raise ValueError(
            f"resources_per_worker={dict(resources_per_worker)!r} leaves a worker with no resources; "
            "Ray places a worker only with at least one (e.g. a fraction of a CPU)"
        )
    return bundle

def default_num_workers(accelerator: Accelerator, bundle: Mapping[str, float], nodes: List[ClusterNode]) -> int:
    """One worker per device of the chosen kind (per share of one, for
    fractional amounts), or per CPU slot when workers have no device; 0 when
    the cluster has none."""
    resource = accelerator.ray_resource or "CPU"
    amount = bundle.get(resource)
    if not amount:  # CPU workers asking for no CPU: as many as their other resources allow
        return workers_that_fit(bundle, [node.resources for node in nodes], "PACK")
    return sum(int(node.resources.get(resource, 0.0) // amount) for node in nodes)

def spares_text(num_workers: int, spares: int) -> str:
    """" (3 + 1 spare)" after a count of workers that includes spares; "" without."""
    return f" ({num_workers - spares} + {spares} spare)" if spares else ""


def infeasibility(
    bundle: Mapping[str, float], num_workers: int, strategy: str, nodes: List[ClusterNode], spares: int = 0
) -> Optional[str]:
    """Why the cluster as it is can never host these workers, or None if it can.

    All bundles are equal, so counting how many fit on each node is exact.
    ``spares`` of ``num_workers`` are spare workers.
    """
    possible = workers_that_fit(bundle, [node.resources for node in nodes], strategy)
    how = {"STRICT_PACK": "on one node", "STRICT_SPREAD": "on distinct nodes"}.get(strategy, "in the cluster")
    if possible >= num_workers:
        return None
    totals: Dict[str, float] = {}
    for node in nodes:
        for name, amount in node.resources.items():
            totals[name] = totals.get(name, 0.0) + amount
    asked = {name: amount * num_workers for name, amount in bundle.items()}
    has = {name: totals.get(name, 0.0) for name in bundle}
    per_node = [{name: node.resources.get(name, 0.0) for name in bundle} for node in nodes]
    return (
        f"{num_workers} workers{spares_text(num_workers, spares)} of {fmt_resources(bundle)} each ({strategy}) asked for {fmt_resources(asked)} in all, "
        f"but at most {possible} such workers fit {how}: the cluster has {fmt_resources(has)} "
        f"over {len(nodes)} node(s) {per_node_text(per_node)}"
    )


def workers_that_fit(bundle: Mapping[str, float], free_per_node: Sequence[Mapping[str, float]], strategy: str) -> int:
    """How many workers of ``bundle`` fit in ``free_per_node`` under ``strategy``
    (all bundles are equal, so counting per node is exact)."""
    fits = [int(min(free.get(name, 0.0) // amount for name, amount in bundle.items())) for free in free_per_node]
    if strategy == "STRICT_PACK":
        return max(fits, default=0)
    if strategy == "STRICT_SPREAD":
        return sum(1 for fit in fits if fit >= 1)
    return sum(fits)

def elastic_size(min_workers: int, max_workers: int, fit_now: int) -> Optional[int]:
    """As many workers as fit now, up to ``max_workers``; None below ``min_workers``."""
    size = min(max_workers, fit_now)
    return size if size >= min_workers else None
