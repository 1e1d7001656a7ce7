"""What each worker asks of the cluster, whether the cluster can ever give it,
and the placement group that reserves it."""

from __future__ import annotations

import json
import uuid
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from tqdm.auto import tqdm

from raydist.pool.errors import InfeasibleResourcesError

ACCELERATORS = ("auto", "gpu", "npu", "cpu")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

# Ray resource name of each accelerator, and the variable Ray sets for it.
ACCELERATOR_RESOURCE = {"gpu": "GPU", "npu": "NPU"}
VISIBLE_DEVICES_VAR = {"GPU": "CUDA_VISIBLE_DEVICES", "NPU": "ASCEND_RT_VISIBLE_DEVICES"}
# torch device kind each Ray accelerator resource maps to.
DEVICE_OF_RESOURCE = {"GPU": "cuda", "NPU": "npu"}


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


def resolve_accelerator(accelerator: str, nodes: List[ClusterNode]) -> Optional[str]:
    """The Ray resource to give each worker ("GPU", "NPU") or None for CPU-only workers."""
    if accelerator != "auto":
        return ACCELERATOR_RESOURCE.get(accelerator)
    for resource in ("GPU", "NPU"):
        if any(node.resources.get(resource, 0) >= 1 for node in nodes):
            return resource
    return None


def default_num_workers(accelerator_resource: Optional[str], cpus_per_worker: float, nodes: List[ClusterNode]) -> int:
    """One worker per accelerator in the cluster, else one per CPU slot."""
    if accelerator_resource is not None:
        return int(sum(node.resources.get(accelerator_resource, 0) for node in nodes))
    return max(1, int(sum(node.resources.get("CPU", 0) for node in nodes) // cpus_per_worker))


def worker_bundle(accelerator_resource: Optional[str], resources_per_worker: Optional[Mapping[str, float]]) -> Dict[str, float]:
    """One worker's bundle: 1 CPU (+1 accelerator) unless the user says otherwise."""
    bundle: Dict[str, float] = {"CPU": 1.0}
    if accelerator_resource is not None:
        bundle[accelerator_resource] = 1.0
    for name, amount in (resources_per_worker or {}).items():
        bundle[name] = float(amount)
    return {name: amount for name, amount in bundle.items() if amount > 0}


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


def cluster_has_autoscaler() -> bool:
    """True when an autoscaler may add nodes (so an unmet request may still be met).

    Every head runs a monitor; without a cluster config it uses Ray's
    read-only provider, whose node types are just ``node_<node id>``.
    """
    try:
        from ray._private import ray_constants
        from ray.autoscaler._private.util import format_readonly_node_type
        from ray.experimental.internal_kv import internal_kv_get_gcs_client

        gcs = internal_kv_get_gcs_client()
        v2 = gcs.internal_kv_get(
            ray._raylet.GCS_AUTOSCALER_V2_ENABLED_KEY.encode(),
            namespace=ray._raylet.GCS_AUTOSCALER_STATE_NAMESPACE.encode(),
        )
        if v2 == b"1":
            return True
        status = gcs.internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS.encode(), namespace=None)
        report = json.loads(status).get("autoscaler_report") or {} if status else {}
        types = (report.get("node_type_mapping") or {}).items()
        return any(node_type != format_readonly_node_type(node) for node, node_type in types)
    except Exception:
        return False


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
    if reason is not None and not cluster_has_autoscaler():
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
                    f"in total, currently available {_fmt(ray.available_resources())}"
                )
            bar.set_postfix_str(f"waiting for {_fmt(bundle)} x {num_workers}; free: {_fmt(_free(bundle))}")


def _free(bundle: Mapping[str, float]) -> Dict[str, float]:
    available = ray.available_resources()
    return {name: available.get(name, 0.0) for name in bundle}
