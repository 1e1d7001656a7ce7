"""Where a group's workers sit: one bundle of the group's placement group each.

A group keeps one placement group for its whole life: Ray cannot resize
one, but a bundle whose actor died is free again (same node, same devices),
and Ray re-places the bundles of a lost node wherever there is room. So a
warm restart puts each replacement (and each new spare) into a free bundle,
and the survivors never move. A bundle Ray cannot re-place (no room after a
node loss) stays pending; an elastic group restarts without it.
"""

from __future__ import annotations

from typing import Any, Collection, Dict, List, Mapping, Optional

import ray
from ray.util.placement_group import PlacementGroup, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raydist.pool.cluster.placement import usable_nodes
from raydist.pool.records import Placement, WorkerInfo
from raydist.pool.rules.restart_plan import Seat
from raydist.pool.worker.actor import RayWorker

_RemoteWorker = ray.remote(RayWorker)


def new_worker(
    pg: Optional[PlacementGroup], slot: int, bundle: Mapping[str, float], ray_resource: Optional[str], per_bundle: int = 1
) -> Any:
    """A worker actor (of ``bundle``'s resources) in slot ``slot`` of ``pg``:
    its bundle ``slot // per_bundle`` (under the node layout, a node's
    bundle holds ``per_bundle`` workers)."""
    # Ray takes its own resources as actor options; a bundle takes them all as amounts.
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
    memory = {"memory": bundle["memory"]} if bundle.get("memory") else {}
    return _RemoteWorker.options(
        num_cpus=bundle.get("CPU", 0),
        num_gpus=bundle.get("GPU", 0),
        resources=custom,
        **memory,
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=slot // per_bundle),  # type: ignore[arg-type]
    ).remote(ray_resource)


def free_seats(pg: Optional[PlacementGroup], taken: Collection[int]) -> List[Seat]:
    """Bundles of ``pg`` that no member holds, placed on a node that is alive
    and not draining (a bundle Ray is still re-placing is not offered)."""
    if pg is None:
        return []
    placed: Dict[int, str] = placement_group_table(pg).get("bundles_to_node_id", {}) or {}
    usable = {node.node_id for node in usable_nodes()}
    return [Seat(int(i), node) for i, node in sorted(placed.items()) if int(i) not in taken and node in usable]


def as_placement(worker: WorkerInfo) -> Placement:
    """A kept worker's placement, for the layout rules."""
    return Placement(
        index=worker.actor_index,
        node_id=worker.node_id,
        node_ip=worker.node_ip,
        pid=worker.pid,
        accelerator_ids=worker.device_ids,
        free_port=0,
        evidence=worker.evidence,
    )
