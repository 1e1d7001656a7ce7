"""What each worker asks of the cluster, whether the cluster can ever give it,
and the placement group that reserves it."""

from __future__ import annotations

import time
import uuid
from typing import Any, Dict, List, Mapping, Optional, Tuple

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from raydist.pool.cluster import ray_private
from raydist.pool.rules.sizing import elastic_size, workers_that_fit
from raydist.errors import InfeasibleResourcesError
from raydist.pool.progress import progress
from raydist.pool.records import ClusterNode
from raydist.pool.rules.sizing import infeasibility
from raydist.pool.rules.text import fmt_resources, per_node_text


def alive_nodes() -> List[ClusterNode]:
    return [
        ClusterNode(n["NodeID"], n["NodeManagerAddress"], dict(n["Resources"]))
        for n in ray.nodes()
        if n["Alive"]
    ]


def usable_nodes() -> List[ClusterNode]:
    """Alive nodes that are not draining (Ray places nothing new on a draining node)."""
    draining = ray_private.draining_nodes()
    return [node for node in alive_nodes() if node.node_id not in draining]


def reserve(
    bundle: Mapping[str, float],
    sizes: Tuple[int, int],
    strategy: str,
    startup_timeout: float,
) -> Tuple[PlacementGroup, int]:
    """A placed placement group of ``bundle`` x n, and n.

    ``sizes`` is (min, max) workers: with min < max, n is as many as fit now
    (up to max) once at least min fit. Raises InfeasibleResourcesError at
    once when the cluster can never host min (and no autoscaler can grow
    it), or after ``startup_timeout`` seconds.
    """
    min_workers, max_workers = sizes
    reason = infeasibility(bundle, min_workers, strategy, usable_nodes())
    if reason is not None and not ray_private.cluster_has_autoscaler():
        raise InfeasibleResourcesError(reason)
    deadline = time.monotonic() + startup_timeout
    with progress(min_workers, "raydist: workers placed") as bar:
        while True:
            size = max_workers if min_workers == max_workers else _elastic_size_now(bundle, sizes, strategy)
            if size is not None:
                pg = placement_group([dict(bundle)] * size, strategy=strategy, name=f"raydist-{uuid.uuid4().hex[:12]}")
                # An elastic size was right a moment ago; if others took the room meanwhile, look again.
                wait = deadline if min_workers == max_workers else min(deadline, time.monotonic() + ELASTIC_PLACE_S)
                try:
                    placed = _wait_until_placed(pg, bundle, size, bar, wait)
                except BaseException:
                    remove_placement_group(pg)
                    raise
                if placed:
                    return pg, size
                remove_placement_group(pg)
            if time.monotonic() >= deadline:
                raise InfeasibleResourcesError(_gave_up(bundle, sizes, strategy, startup_timeout))
            bar.set_postfix_str(f"waiting for room for {min_workers} of {fmt_resources(bundle)}; free: {fmt_resources(_free(bundle))}")
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))  # polling the cluster, with a deadline


# How long an elastic placement may take before the free room is looked at again.
ELASTIC_PLACE_S = 3.0
# How long to wait for a torn-down group's resources to show as free again.
RELEASE_WAIT_S = 5.0


def wait_until_released(held: Mapping[str, Mapping[str, float]], timeout: float = RELEASE_WAIT_S) -> None:
    """Wait until the resources a torn-down group ``held`` (node id -> amounts)
    show as free on the nodes still alive, so that the next elastic size
    counts them (Ray updates free resources a moment after a removal)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        free = ray_private.available_resources_per_node()
        if all(
            node_id not in free or all(free[node_id].get(name, 0.0) + 1e-6 >= amount for name, amount in amounts.items())
            for node_id, amounts in held.items()
        ):
            return
        time.sleep(0.1)  # polling Ray's view of free resources, with a deadline


def _elastic_size_now(bundle: Mapping[str, float], sizes: Tuple[int, int], strategy: str) -> Optional[int]:
    return elastic_size(sizes[0], sizes[1], room_for(bundle, strategy))


def room_for(bundle: Mapping[str, float], strategy: str) -> int:
    """How many more workers of ``bundle`` fit now on nodes that are not draining."""
    usable = {node.node_id for node in usable_nodes()}
    free = [resources for node_id, resources in ray_private.available_resources_per_node().items() if node_id in usable]
    return workers_that_fit(bundle, free, strategy)


def _wait_until_placed(pg: PlacementGroup, bundle: Mapping[str, float], size: int, bar: Any, deadline: float) -> bool:
    ready = pg.ready()
    while True:
        remaining = deadline - time.monotonic()
        done, _ = ray.wait([ready], timeout=max(0.0, min(1.0, remaining)))
        if done:
            bar.update(bar.total - bar.n)
            return True
        if remaining <= 0:
            return False
        bar.set_postfix_str(f"waiting for {fmt_resources(bundle)} x {size}; free: {fmt_resources(_free(bundle))}")


def _gave_up(bundle: Mapping[str, float], sizes: Tuple[int, int], strategy: str, startup_timeout: float) -> str:
    count = str(sizes[0]) if sizes[0] == sizes[1] else f"at least {sizes[0]}"
    totals = [{name: n.resources.get(name, 0.0) for name in bundle} for n in alive_nodes()]
    return (
        f"gave up after {startup_timeout:g} s waiting for {count} workers of {fmt_resources(bundle)} each "
        f"({strategy}); cluster nodes have {per_node_text(totals)} in total, currently free {fmt_resources(_free(bundle))}"
    )


def _free(bundle: Mapping[str, float]) -> Dict[str, float]:
    available = ray.available_resources()
    return {name: available.get(name, 0.0) for name in bundle}
