"""A warm restart: the surviving workers keep their processes; only the dead
(and survivors that do not come back in time) are replaced.

After a failed call, every rank whose call came back leaves its process
group at once, so that peers blocked in a collective with it fail now
instead of at the process group's timeout; the others get until
``survivor_timeout`` after the failure, then are killed. The plan
(``raydist.pool.rules.restart_plan``) says who stays and where each
replacement comes from (a ready spare, else a new process in a free bundle
of the group's placement group); the next world is then described, ranked
(surviving nodes keep their order) and set up in one round trip each, the
kept processes included: new RANK, WORLD_SIZE, MASTER_PORT and
TORCHELASTIC_RESTART_COUNT, and a new process group.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Collection, List, Optional, Sequence, Set, Tuple

from raydist.errors import InfeasibleResourcesError, WorkerGroupClosed
from raydist.pool.cluster.seam import CallFailed, Cluster, Pending, Worker, WorkerDied
from raydist.pool.driver.attempt import Attempt
from raydist.pool.driver.seats import as_placement, free_seats
from raydist.pool.driver.startup import GroupBuilder, Holdings
from raydist.pool.driver.timeline_events import late_results, world_ready
from raydist.pool.driver.waiting import Waited
from raydist.pool.rules.restart_plan import RestartPlan, plan_restart, restart_summary

logger = logging.getLogger("raydist")

# How often a restart that needs more room looks at the placement group again.
SEAT_POLL_S = 0.2


@dataclass
class Settled:
    """The old world's ranks after the failure: dead, and not back in time."""

    dead: Set[int]
    stuck: List[int]
    late: Waited  # what the ranks whose call came back only now sent with it (their spans, for the summary)


class RestartAborted(RuntimeError):
    """A shutdown began while the warm restart ran."""


@dataclass
class WarmRestart:
    """Replaces a failed call's ranks in place, for a run in ``RESTARTING``
    (``stopping``: whether a stop was asked meanwhile; asked between the slow steps)."""

    builder: GroupBuilder
    holdings: Holdings
    stopping: Callable[[], bool]
    survivor_timeout: float  # seconds a survivor's call may take to come back after the failure
    startup_timeout: float  # seconds to wait for seats for the replacements
    sizes: Optional[Tuple[int, int]]  # the elastic size range (None: the world's size is fixed)
    ahead: Any = None  # the call kept processes run ahead after their teardown (run_ahead; None: not)

    def run(self, failed: Attempt, refs: Sequence[Pending], waited: Waited, call: int, number: int) -> Optional[Tuple[Attempt, str]]:
        """The next attempt (numbered ``number``: the run's one counter says it)
        after ``failed``'s call ``call`` failed as ``waited`` says, and the line
        that says what was done; None when a shutdown began
        meanwhile or the restart failed (then logged; the fresh start or
        the stop after it releases what it made)."""
        try:
            return self._replace(failed, refs, waited, call, number)
        except (RestartAborted, WorkerGroupClosed):  # a stop was asked meanwhile (a start-up wait gave way to it)
            return None
        except Exception as failure:  # noqa: BLE001 - then the run starts afresh, or stops
            logger.error("raydist: warm restart failed (%s: %s)", type(failure).__name__, failure)
            return None

    def live(self) -> None:
        """Raise ``RestartAborted`` once a stop was asked; asked between the slow steps."""
        if self.stopping():
            raise RestartAborted("the group was shut down during its warm restart")

    def _replace(self, failed: Attempt, refs: Sequence[Pending], waited: Waited, call: int, number: int) -> Tuple[Attempt, str]:
        builder, holdings, live = self.builder, self.holdings, self.live
        cluster = holdings.cluster
        failed_at = min([f.timestamp for f in waited.failures] + [cluster.time()])
        old = list(failed.workers)
        lost = {w.node_id for w in old} - {node.node_id for node in cluster.alive_nodes()}
        leaving = lost | set(failed.drained)
        failed.stop_watching()  # nothing may read or warn a half-changed attempt
        deadline = failed_at + self.survivor_timeout
        settled = settle_survivors(cluster, failed.actors, refs, waited, old, lost, deadline, live, self.ahead)
        failed.close_output(call, waited.results, [f.rank for f in waited.failures if not f.crashed])
        late_results(failed, settled.late)
        plan = _plan(holdings, failed, settled, leaving, builder.excluded, self.sizes, self.startup_timeout, live)
        live()
        doomed = [failed.actors[r] for r in sorted(settled.dead | set(plan.killed))]
        for actor in doomed + holdings.spares.drop_on(leaving | builder.excluded):
            cluster.kill(actor)
        holdings.forget(doomed)
        # What the replaced processes left on their nodes goes with them (a lost node's went with it).
        replaced = sorted(settled.dead | set(plan.killed))
        holdings.agents.remove_files([old[r] for r in replaced if old[r].node_id not in lost])
        for agent in holdings.agents.retire(sorted(leaving)):
            cluster.kill(agent)
        builder.restart(plan.node_order)
        spare_pids = {holdings.spares.ready[i].placement.pid for i in plan.spares}
        new = _join(builder, holdings, failed, plan, number)
        if self.stopping():
            new.end()  # (its actors are held: the teardown after the abort kills them)
            raise RestartAborted("the group was shut down during its warm restart")
        holdings.agents.start([w.node_id for w in new.workers])  # a replacement on a node new to the group
        world_ready(new, old, spare_pids)
        seconds = cluster.time() - failed_at
        cluster.record("raydist_recovery_seconds", seconds, {})
        taken = {w.actor_index for w in new.workers} | holdings.spares.bundles()
        holdings.spares.refill(free_seats(cluster, holdings.pg, taken, builder.excluded), lambda: [as_placement(w) for w in new.workers])
        return new, restart_summary(plan, old, len(old), len(new.workers), seconds, self.survivor_timeout)


def settle_survivors(
    cluster: Cluster,
    actors: Sequence[Worker],
    refs: Sequence[Pending],
    waited: Waited,
    workers: Sequence[Any],
    lost: Collection[str],
    deadline: float,
    live: Callable[[], None] = lambda: None,
    ahead: Any = None,
) -> Settled:
    """Make every live rank leave its process group: at once where its call is
    back, else when it comes back, until ``deadline`` (``cluster.time()``); then
    run ``ahead`` (the call sent again next) to its ``load_state``, when given."""

    def leave(rank: int) -> Pending:
        teardown = cluster.call(actors[rank], "teardown")
        if ahead is not None:  # queued behind the teardown: it starts once the process left its group
            cluster.call(actors[rank], "run_ahead", ahead)
        return teardown

    dead = {f.rank for f in waited.failures if f.crashed} | {w.rank for w in workers if w.node_id in lost}
    pending = {refs[rank]: rank for rank in waited.pending if rank not in dead}
    late = Waited([None] * len(refs))
    resets = {leave(r): r for r in range(len(refs)) if r not in dead and r not in waited.pending}
    while pending or resets:
        live()
        remaining = deadline - cluster.time()
        if remaining <= 0:
            break
        waiting = [*pending, *resets]
        if cluster.wait(waiting, num_returns=1, timeout=min(remaining, SEAT_POLL_S))[0]:
            # Everything already back, in one go: a wait per rank would be quadratic in the failed.
            ready, _ = cluster.wait(waiting, num_returns=len(waiting), timeout=0)
        else:
            ready = []
        for ref in ready:
            rank = pending.pop(ref, None)
            if rank is not None:
                died, value = _outcome(cluster, ref)
                if died:
                    dead.add(rank)
                else:
                    late.keep(rank, value)
                    resets[leave(rank)] = rank
                continue
            rank = resets.pop(ref)
            if _outcome(cluster, ref)[0]:
                dead.add(rank)
    return Settled(dead, sorted(set(pending.values()) | set(resets.values())), late)


def _outcome(cluster: Cluster, ref: Pending) -> Tuple[bool, Any]:
    """Whether the call's process died, else what it sent (None: a value that could not come back)."""
    try:
        [value] = cluster.get([ref], timeout=0)
    except WorkerDied:
        return True, None
    except (CallFailed, TimeoutError):  # a value that could not come back: the process lives
        return False, None
    return False, value


def _plan(
    holdings: Holdings,
    failed: Attempt,
    settled: Settled,
    leaving: Set[str],
    excluded: Collection[str],
    worker_range: Optional[Tuple[int, int]],
    startup_timeout: float,
    live: Callable[[], None],
) -> RestartPlan:
    """The plan, once the placement group has the places it needs (Ray
    re-places a lost node's bundles where there is room), or
    InfeasibleResourcesError after ``startup_timeout``; no replacement on an ``excluded`` node."""
    size = failed.size
    sizes = worker_range or (size, size)
    sizes = (sizes[0], min(sizes[1], size))  # growing is restart_to_grow's job
    gone = settled.dead | set(settled.stuck)
    cluster = holdings.cluster
    deadline = cluster.monotonic() + startup_timeout
    while True:
        live()
        taken = {w.actor_index for w in failed.workers if w.rank not in gone and w.node_id not in leaving}
        taken |= holdings.spares.bundles()
        plan = plan_restart(
            failed.workers,
            dead=settled.dead,
            stuck=settled.stuck,
            leaving_nodes=leaving,
            spares=holdings.spares.seats(),
            free_seats=free_seats(holdings.cluster, holdings.pg, taken),
            sizes=sizes,
            avoid_nodes=excluded,
        )
        if not plan.missing:
            return plan
        if cluster.monotonic() >= deadline:
            raise InfeasibleResourcesError(
                f"warm restart: {plan.missing} more worker(s) needed for a world of at least {sizes[0]}, and "
                f"no bundle of the group's placement group was free on a node that stays within {startup_timeout:g} s"
            )
        cluster.sleep(SEAT_POLL_S)  # Ray re-places a lost node's bundles within moments when there is room


def _join(builder: GroupBuilder, holdings: Holdings, failed: Attempt, plan: RestartPlan, number: int) -> Attempt:
    """The next attempt: kept processes, spares and new processes, described,
    ranked and set up together (kept ones leave their old group first)."""
    kept: List[Tuple[Any, int]] = [(failed.actors[r], failed.workers[r].actor_index) for r in plan.kept]
    spares = holdings.spares.take(plan.spares)
    holdings.actors.extend(
        s.actor for s in spares if all(s.actor is not a for a in holdings.actors)
    )  # held, so that a failure from here releases them too
    joining = [*kept, *[(s.actor, s.placement.index) for s in spares]]
    fresh_bundles = [seat.bundle for seat in plan.fresh]
    actors = [actor for actor, _ in joining] + builder.create(holdings, fresh_bundles)
    bundles = [bundle for _, bundle in joining] + fresh_bundles
    placements = builder.describe(holdings, actors, bundles)
    if fresh_bundles:  # new processes pass the health check before they host a rank (spares did when they started)
        builder.check_new(holdings, actors[-len(fresh_bundles) :], placements[-len(fresh_bundles) :], placements)
    standby = [s.placement for s in holdings.spares.ready]
    return builder.attempt(holdings, dict(zip(bundles, actors)), placements, number, standby)
