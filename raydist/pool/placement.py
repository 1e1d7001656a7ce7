"""What each worker asks of the cluster, whether the cluster can ever give it,
and the placement group that reserves it."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from tqdm.auto import tqdm

from raydist.core.accelerators import AUTO_ORDER, BY_NAME, CPU, Accelerator
from raydist.pool import ray_private
from raydist.pool.errors import InfeasibleResourcesError


@dataclass(frozen=True)
class ClusterNode:
    node_id: str
    ip: str
    resources: Mapping[str, float]


def alive_nodes() -> List[ClusterNode]:
    return [
        ClusterNode(n["NodeID"], n["NodeManagerAddress"], dict(n["Resources"]))
        for n in ray.nodes()
        if n["Alive"]
    ]


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
        return sum(_workers_that_fit(bundle, node) for node in nodes)
    return sum(int(node.resources.get(resource, 0.0) // amount) for node in nodes)


def _workers_that_fit(bundle: Mapping[str, float], node: ClusterNode) -> int:
    return int(min(node.resources.get(name, 0.0) // amount for name, amount in bundle.items()))


def infeasibility(bundle: Mapping[str, float], num_workers: int, strategy: str, nodes: List[ClusterNode]) -> Optional[str]:
    """Why the cluster as it is can never host these workers, or None if it can.

    All bundles are equal, so counting how many fit on each node is exact.
    """
    fits = [_workers_that_fit(bundle, node) for node in nodes]
    if strategy == "STRICT_PACK":
        possible, how = max(fits, default=0), "on one node"
    elif strategy == "STRICT_SPREAD":
        possible, how = sum(1 for f in fits if f >= 1), "on distinct nodes"
    else:
        possible, how = sum(fits), "in the cluster"
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
        f"{num_workers} workers of {_fmt(bundle)} each ({strategy}) asked for {_fmt(asked)} in all, "
        f"but at most {possible} such workers fit {how}: the cluster has {_fmt(has)} "
        f"over {len(nodes)} node(s) {per_node_text(per_node)}"
    )


def _fmt(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in resources.items()) + "}"


def per_node_text(per_node: List[Mapping[str, float]]) -> str:
    return "[" + ", ".join(_fmt(r) for r in per_node) + "]"


def reserve(
    bundle: Mapping[str, float],
    num_workers: int,
    strategy: str,
    startup_timeout: float,
) -> PlacementGroup:
    """Create the placement group and wait until it is placed.

    Raises InfeasibleResourcesError at once when the cluster can never host
    it (and no autoscaler can grow it), or after ``startup_timeout`` seconds.
    """
    nodes = alive_nodes()
    reason = infeasibility(bundle, num_workers, strategy, nodes)
    if reason is not None and not ray_private.cluster_has_autoscaler():
        raise InfeasibleResourcesError(reason)
    pg = placement_group([dict(bundle)] * num_workers, strategy=strategy, name=f"raydist-{uuid.uuid4().hex[:12]}")
    try:
        _wait_until_placed(pg, bundle, num_workers, strategy, startup_timeout)
    except BaseException:
        remove_placement_group(pg)
        raise
    return pg


def _wait_until_placed(pg: PlacementGroup, bundle: Mapping[str, float], num_workers: int, strategy: str, startup_timeout: float) -> None:
    ready = pg.ready()
    deadline = time.monotonic() + startup_timeout
    # The bar only appears if placement takes more than a moment.
    with tqdm(total=num_workers, desc="raydist: workers placed", unit="worker", delay=5.0) as bar:
        while True:
            remaining = deadline - time.monotonic()
            done, _ = ray.wait([ready], timeout=max(0.0, min(1.0, remaining)))
            if done:
                bar.update(num_workers - bar.n)
                return
            if remaining <= 0:
                available = [
                    {name: n.resources.get(name, 0.0) for name in bundle}
                    for n in alive_nodes()
                ]
                raise InfeasibleResourcesError(
                    f"gave up after {startup_timeout:g} s waiting for {num_workers} workers of "
                    f"{_fmt(bundle)} each ({strategy}); cluster nodes have {per_node_text(available)} "
                    f"in total, currently free {_fmt(_free(bundle))}"
                )
            bar.set_postfix_str(f"waiting for {_fmt(bundle)} x {num_workers}; free: {_fmt(_free(bundle))}")


def _free(bundle: Mapping[str, float]) -> Dict[str, float]:
    available = ray.available_resources()
    return {name: available.get(name, 0.0) for name in bundle}
