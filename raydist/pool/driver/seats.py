"""Where a group's workers sit: one bundle of the group's placement group each.

A group keeps one placement group for its whole life: Ray cannot resize
one, but a bundle whose actor died is free again (same node, same devices),
and Ray re-places the bundles of a lost node wherever there is room. So a
warm restart puts each replacement (and each new spare) into a free bundle,
and the survivors never move. A bundle Ray cannot re-place (no room after a
node loss) stays pending; an elastic group restarts without it.
"""

from __future__ import annotations

from typing import Collection, List

from raydist.pool.cluster.seam import Cluster, Reservation
from raydist.pool.records import Placement, WorkerInfo
from raydist.pool.rules.restart_plan import Seat


def free_seats(cluster: Cluster, pg: Reservation, taken: Collection[int], avoid: Collection[str] = ()) -> List[Seat]:
    """Bundles of ``pg`` that no member holds, placed on a node that is alive,
    not draining and not in ``avoid`` (a bundle the cluster is still
    re-placing is not offered)."""
    if pg is None:
        return []
    draining = cluster.draining_nodes()
    usable = {node.node_id for node in cluster.alive_nodes() if node.node_id not in draining and node.node_id not in avoid}
    return [Seat(bundle, node) for bundle, node in sorted(cluster.bundle_nodes(pg).items()) if bundle not in taken and node in usable]


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
        hostname=worker.hostname,
    )
