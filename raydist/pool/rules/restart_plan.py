"""Which workers a warm restart keeps, which it replaces, and from where.

Pure: the driver says who died, who did not come back in time, which nodes
are leaving, which spares are ready and which placement-group bundles are
free on nodes that stay; ``plan_restart`` answers with the next world. Ranks
are then assigned by ``assign_ranks`` with the plan's node order, so
surviving nodes keep their order and a replacement in a dead rank's own
bundle (same node, same devices) gets that rank back.

Replacements come from ready spares first (their processes already run),
then from fresh processes in free bundles, the dead ranks' own first. A
fixed size must be met; an elastic one (``min < max``) takes what there is,
up to max, and at least min.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, List, Optional, Sequence, Tuple

from raydist.pool.records import WorkerInfo
from raydist.pool.rules.text import ranks_text


@dataclass(frozen=True)
class Seat:
    """A place for one worker: a bundle of the group's placement group, on a node."""

    bundle: int
    node_id: str


@dataclass(frozen=True)
class RestartPlan:
    """The next world of a warm restart."""

    kept: Tuple[int, ...]  # old ranks whose process stays, in rank order
    spares: Tuple[int, ...]  # positions in the ready spares that join the world
    fresh: Tuple[Seat, ...]  # where new processes start
    killed: Tuple[int, ...]  # old ranks whose live process is killed (not back in time, or on a leaving node)
    size: int  # the new world size (0 when ``missing``)
    node_order: Tuple[str, ...]  # the old node order without the nodes that left
    missing: int = 0  # places still needed to reach the minimum size; the plan is not usable while > 0


def plan_restart(
    workers: Sequence[WorkerInfo],
    *,
    dead: Collection[int],
    stuck: Collection[int],
    leaving_nodes: Collection[str],
    spares: Sequence[Seat],
    free_seats: Sequence[Seat],
    sizes: Tuple[int, int],
    avoid_nodes: Collection[str] = (),
) -> RestartPlan:
    """The next world, from the old one (``workers`` by rank).

    ``dead``: ranks whose process died; ``stuck``: survivors whose call did
    not return in time; ``leaving_nodes``: nodes lost or draining (their
    ranks leave; no spare or free seat there is offered); ``spares``: ready
    spares, best first; ``free_seats``: bundles free on nodes that stay;
    ``sizes``: (min, max) workers, equal for a fixed size; ``avoid_nodes``:
    nodes where no replacement goes (a replaced straggler's), their kept ranks staying.
    """
    dead, leaving_nodes = set(dead), set(leaving_nodes)  # (looked up once per rank)
    gone = dead | set(stuck)
    kept = tuple(w.rank for w in workers if w.rank not in gone and w.node_id not in leaving_nodes)
    kept_ranks = set(kept)
    killed = tuple(w.rank for w in workers if w.rank not in dead and w.rank not in kept_ranks)
    node_order = tuple(node for node in dict.fromkeys(w.node_id for w in workers) if node not in leaving_nodes)
    low, high = sizes
    closed = leaving_nodes | set(avoid_nodes)  # no replacement there
    usable_spares = [i for i, spare in enumerate(spares) if spare.node_id not in closed]
    seats = _seats_in_order(free_seats, workers, gone, node_order, closed)
    available = len(kept) + len(usable_spares) + len(seats)
    if available < low:
        return RestartPlan(kept, (), (), killed, 0, node_order, missing=low - available)
    size = min(high, available)
    need = max(0, size - len(kept))
    from_spares = tuple(usable_spares[:need])
    fresh = tuple(seats[: need - len(from_spares)])
    return RestartPlan(kept, from_spares, fresh, killed, size, node_order)


def _seats_in_order(
    free_seats: Sequence[Seat],
    workers: Sequence[WorkerInfo],
    gone: Collection[int],
    node_order: Sequence[str],
    leaving_nodes: Collection[str],
) -> List[Seat]:
    """Free seats on nodes that stay: the replaced ranks' own bundles first
    (same node and devices: the same rank again), then by node order."""
    own = {w.actor_index for w in workers if w.rank in gone}
    position = {node: i for i, node in enumerate(node_order)}
    staying = [seat for seat in free_seats if seat.node_id not in leaving_nodes]
    return sorted(staying, key=lambda s: (s.bundle not in own, position.get(s.node_id, len(position)), s.bundle))


def restart_summary(
    plan: Optional[RestartPlan],
    workers: Sequence[WorkerInfo],
    old_size: int,
    new_size: int,
    seconds: float,
    survivor_timeout: float,
) -> str:
    """One line per restart: ranks kept, replaced (spare / fresh), ranks killed
    and why, and the time from the failure to every rank initialised.
    ``plan`` None: a restart in fresh processes."""
    timing = f"every rank initialised {seconds:.2f} s after the failure"
    if plan is None:
        return f"raydist: restart in fresh processes: world size {new_size} (was {old_size}), all {new_size} ranks new; {timing}"
    spare, fresh = len(plan.spares), len(plan.fresh)
    line = (
        f"raydist: warm restart: world size {new_size} (was {old_size}): {len(plan.kept)} rank(s) kept their "
        f"process, {spare + fresh} replaced ({spare} from a spare, {fresh} fresh)"
    )
    stuck = [workers[rank] for rank in plan.killed]
    if stuck:
        where = ", ".join(f"rank {w.rank} (node {w.node_id[:12]}, pid {w.pid})" for w in stuck)
        line += (
            f"; {ranks_text([w.rank for w in stuck])} killed and replaced: {where} had not returned "
            f"{survivor_timeout:g} s after the failure or ran on a leaving node"
        )
    return f"{line}; {timing}"
