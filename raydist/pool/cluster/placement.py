"""What each worker asks of the cluster, whether the cluster can ever give it,
and the placement group that reserves it."""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from raydist.errors import InfeasibleResourcesError, WorkerGroupClosed
from raydist.pool import ray_private
from raydist.pool.progress import progress
from raydist.pool.records import ClusterNode
from raydist.pool.rules.sizing import Request, elastic_size, selection_text, spares_text
from raydist.pool.rules.text import fmt_resources, per_node_text


def alive_nodes() -> List[ClusterNode]:
    return [
        ClusterNode(n["NodeID"], n["NodeManagerAddress"], dict(n["Resources"]), dict(n.get("Labels") or {}))
        for n in ray.nodes()
        if n["Alive"]
    ]


def usable_nodes() -> List[ClusterNode]:
    """Alive nodes that are not draining (Ray places nothing new on a draining node)."""
    draining = ray_private.draining_nodes()
    return [node for node in alive_nodes() if node.node_id not in draining]


def reserve(request: Request, startup_timeout: float, stopping: Callable[[], bool] = lambda: False) -> Tuple[PlacementGroup, int]:
    """A placed placement group of ``request.bundle`` x n, and n.

    With ``request.sizes`` = (min, max) and min < max, n is as many as fit
    now (up to max) once at least min fit. Raises InfeasibleResourcesError
    at once when the nodes the request may use can never host min (and no
    autoscaler can add nodes), or after ``startup_timeout`` seconds;
    WorkerGroupClosed once ``stopping()`` (asked each second).
    """
    min_size, max_size = request.sizes
    nodes = usable_nodes()
    reason = request.infeasibility(nodes)
    if reason is not None and not ray_private.cluster_has_autoscaler():
        raise InfeasibleResourcesError(reason)
    bundle, selector = request.bundle, request.selection.ray_selector(alive_nodes())
    deadline = time.monotonic() + startup_timeout
    with progress(min_size, "raydist: workers placed", unit="bundle" if request.per_bundle > 1 else "worker") as bar:
        while True:
            size = max_size if min_size == max_size else elastic_size(min_size, max_size, room_for(request))
            if size is not None:
                pg = placement_group(
                    [dict(bundle)] * size,
                    strategy=request.strategy,
                    name=f"raydist-{uuid.uuid4().hex[:12]}",
                    bundle_label_selector=[dict(selector)] * size if selector else None,
                )
                # An elastic size was right a moment ago; if others took the room meanwhile, look again.
                wait = deadline if min_size == max_size else min(deadline, time.monotonic() + ELASTIC_PLACE_S)
                try:
                    placed = _wait_until_placed(pg, bundle, size, bar, wait, stopping)
                except BaseException:
                    remove_placement_group(pg)
                    raise
                if placed:
                    return pg, size
                remove_placement_group(pg)
            if time.monotonic() >= deadline:
                raise InfeasibleResourcesError(_gave_up(request, startup_timeout))
            _check(stopping)
            bar.set_postfix_str(f"waiting for room for {min_size} of {fmt_resources(bundle)}; free: {fmt_resources(_free(bundle))}")
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


def room_for(request: Request, taken: Sequence[str] = ()) -> int:
    """How many more of ``request``'s bundles fit now on the nodes it may use
    that are not draining, leaving out the nodes in ``taken``."""
    nodes = usable_nodes()
    return request.room(ray_private.available_resources_per_node(), nodes, taken)


def _wait_until_placed(
    pg: PlacementGroup, bundle: Mapping[str, float], size: int, bar: Any, deadline: float, stopping: Callable[[], bool]
) -> bool:
    ready = pg.ready()
    while True:
        _check(stopping)
        remaining = deadline - time.monotonic()
        done, _ = ray.wait([ready], timeout=max(0.0, min(1.0, remaining)))
        if done:
            bar.update(bar.total - bar.n)
            return True
        if remaining <= 0:
            return False
        bar.set_postfix_str(f"waiting for {fmt_resources(bundle)} x {size}; free: {fmt_resources(_free(bundle))}")


def _check(stopping: Callable[[], bool]) -> None:
    if stopping():
        raise WorkerGroupClosed("this WorkerGroup was shut down while it waited for room")


def _gave_up(request: Request, startup_timeout: float) -> str:
    bundle, sizes = request.bundle, request.sizes
    count = (str(sizes[0]) if sizes[0] == sizes[1] else f"at least {sizes[0]}") + spares_text(sizes[0], request.spares)
    what = f"node(s) of {request.per_bundle} workers" if request.node_layout else "workers"
    nodes = alive_nodes()
    totals = [{name: n.resources.get(name, 0.0) for name in bundle} for n in request.selection.matching(nodes)]
    chosen = f"; {selection_text(request.selection, nodes)}" if request.selection.active else ""
    return (
        f"gave up after {startup_timeout:g} s waiting for {count} {what} of {fmt_resources(bundle)} each "
        f"({request.strategy}); the nodes it may use have {per_node_text(totals)} in total, currently free "
        f"{fmt_resources(_free(bundle))}{chosen}"
    )


def _free(bundle: Mapping[str, float]) -> Dict[str, float]:
    available = ray.available_resources()
    return {name: available.get(name, 0.0) for name in bundle}
