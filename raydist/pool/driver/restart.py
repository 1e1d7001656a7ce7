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
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Collection, List, Sequence, Set, Tuple

import ray
from ray.exceptions import RayActorError

from raydist.config import RunConfig
from raydist.errors import InfeasibleResourcesError, RaydistError
from raydist.pool.cluster.placement import alive_nodes
from raydist.pool.driver.seats import as_placement, free_seats
from raydist.pool.driver.startup import GroupBuilder, Members
from raydist.pool.driver.waiting import Waited
from raydist.pool.records import CallEnd, GroupPhase
from raydist.pool.rules.policy import decide_restart, restart_line
from raydist.pool.rules.restart_plan import RestartPlan, plan_restart, restart_summary

if TYPE_CHECKING:
    from raydist.pool.driver.calls import WorkerFuture
    from raydist.pool.driver.group import WorkerGroup
    from raydist.pool.driver.watcher import GroupWatcher

logger = logging.getLogger("raydist")

# How often a restart that needs more room looks at the placement group again.
SEAT_POLL_S = 0.2


@dataclass
class Settled:
    """The old world's ranks after the failure: dead, and not back in time."""

    dead: Set[int]
    stuck: List[int]


def restart_group(
    group: "WorkerGroup", error: RaydistError, future: "WorkerFuture", waited: Waited,
    watch: Callable[["WorkerGroup"], "GroupWatcher"],
) -> bool:
    """Restart ``group`` in place after ``future`` failed with ``error``, if
    the restart policy says so; logs why and what was done. False: the
    group is to be torn down (no restart, or the warm restart failed)."""
    config, members = group.config, group._members
    driver_node = ray.get_runtime_context().get_node_id()
    left = config.max_restarts - group.restarts_used
    decision = decide_restart(error, retry_on_exception=config.retry_on_exception, restarts_left=left, driver_node=driver_node)
    if decision.restart is None or members is None or group.closed or error.end is CallEnd.GROW:
        return False  # growing needs a larger placement group: a fresh start
    if not _begin(group, future):
        return False
    old_size = len(members.workers)
    if group._watcher is not None:
        group._watcher.stop()
    group._diagnostics.pause()  # it must not read a half-changed world

    def live() -> None:  # between the restart's steps: a shutdown that began wins
        if group._phase is not GroupPhase.RESTARTING:
            raise RestartAborted("the group was shut down during its warm restart")

    try:  # the slow waits run without the group's lock: shutdown() and cancel() never wait on them
        done = restart_in_place(group._builder, members, future.refs, waited, future.number, config, group.drained_nodes, live)
    except RestartAborted:
        return False  # the caller's teardown releases what the restart made
    except BaseException:  # interrupted (Ctrl-C): no call may wait on a world that never comes
        group.shutdown(graceful=False)
        raise
    except Exception as failure:  # noqa: BLE001 - then the group is torn down, as a fresh restart would
        logger.error("raydist: warm restart failed (%s: %s); stopping the group", type(failure).__name__, failure)
        return False
    with group._lock:
        if group._phase is not GroupPhase.RESTARTING:
            return False
        group.restarts_used += int(decision.restart.counted)
        group._watcher = watch(group)
        group._diagnostics.start()  # the new world's ranks and pids, nothing of the old
        group._phase = GroupPhase.RUNNING
        group._changed.notify_all()
    logger.warning(restart_line(decision.restart, old_size, group.restart_count, config.max_restarts, group.restarts_used))
    logger.warning(done)
    return True


class RestartAborted(RuntimeError):
    """A shutdown began while the warm restart ran."""


def _begin(group: "WorkerGroup", future: "WorkerFuture") -> bool:
    """Enter the restarting phase, if the group runs and ``future`` is its newest call
    (an older call's failure: a newer one is queued behind it on the old actors)."""
    with group._lock:  # the check and the phase change at once: no call slips in between
        if group._phase is not GroupPhase.RUNNING or future.number != group._calls - 1:
            return False
        group._phase = GroupPhase.RESTARTING
        return True


def restart_in_place(
    builder: GroupBuilder, members: Members, refs: Sequence[ray.ObjectRef], waited: Waited, call: int,
    config: RunConfig, drained: Collection[str], live: Callable[[], None] = lambda: None,
) -> str:
    """Turn ``members`` (whose call ``call`` failed as ``waited`` says) into
    the next attempt's world, in place; the line that says what it did."""
    failed_at = min([f.timestamp for f in waited.failures] + [time.time()])
    old = list(members.workers)
    lost = {w.node_id for w in old} - {node.node_id for node in alive_nodes()}
    leaving = lost | set(drained)
    settled = settle_survivors(members.actors, refs, waited, old, lost, failed_at + config.survivor_timeout, live)
    _close_output(members, waited, call)
    plan = _plan(members, settled, leaving, config, live)
    live()
    doomed_ranks = sorted(settled.dead | set(plan.killed))
    for actor in [members.actors[r] for r in doomed_ranks] + members.spares.drop_on(leaving):
        ray.kill(actor, no_restart=True)
    # What the replaced processes left on their nodes goes with them (a lost node's went with it).
    members.agents.ask(old, [r for r in doomed_ranks if old[r].node_id not in lost], "remove", start_missing=False)
    for agent in _retire_agents(members, leaving):
        ray.kill(agent, no_restart=True)
    builder.restart(plan.node_order)
    _join(builder, members, plan)
    live()  # (new actors are in members: the teardown after an abort kills them)
    members.agents.start([w.node_id for w in members.workers])  # a replacement on a node new to the group
    seconds = time.time() - failed_at
    taken = {w.actor_index for w in members.workers} | members.spares.bundles()
    members.spares.refill(free_seats(members.pg, taken), lambda: [as_placement(w) for w in members.workers])
    return restart_summary(plan, old, len(old), len(members.workers), seconds, config.survivor_timeout)


def settle_survivors(
    actors: Sequence[Any], refs: Sequence[ray.ObjectRef], waited: Waited, workers: Sequence[Any],
    lost: Collection[str], deadline: float, live: Callable[[], None] = lambda: None,
) -> Settled:
    """Make every live rank leave its process group: at once where its call is
    back, else when it comes back, until ``deadline`` (``time.time()``)."""
    dead = {f.rank for f in waited.failures if f.crashed} | {w.rank for w in workers if w.node_id in lost}
    pending = {refs[rank]: rank for rank in waited.pending if rank not in dead}
    resets = {actors[r].teardown.remote(): r for r in range(len(refs)) if r not in dead and r not in waited.pending}
    while pending or resets:
        live()
        remaining = deadline - time.time()
        if remaining <= 0:
            break
        ready, _ = ray.wait([*pending, *resets], num_returns=1, timeout=min(remaining, SEAT_POLL_S))
        for ref in ready:
            rank = pending.pop(ref, None)
            if rank is not None:
                if _died(ref):
                    dead.add(rank)
                else:
                    resets[actors[rank].teardown.remote()] = rank
                continue
            rank = resets.pop(ref)
            if _died(ref):
                dead.add(rank)
    return Settled(dead, sorted(set(pending.values()) | set(resets.values())))


def _died(ref: ray.ObjectRef) -> bool:
    try:
        ray.get(ref, timeout=0)
    except RayActorError:
        return True
    except Exception:  # noqa: BLE001 - a value that could not come back: the process lives
        return False
    return False


def _close_output(members: Members, waited: Waited, call: int) -> None:
    """The failed call's lines (those of ranks that came back), then the attempt's files closed."""
    output, members.output = members.output, None
    if output is not None:
        output.settle(call, waited.results, [f.rank for f in waited.failures if not f.crashed])
        output.close()


def _plan(members: Members, settled: Settled, leaving: Set[str], config: RunConfig, live: Callable[[], None]) -> RestartPlan:
    """The plan, once the placement group has the places it needs (Ray
    re-places a lost node's bundles where there is room), or
    InfeasibleResourcesError after ``startup_timeout``."""
    size = len(members.workers)
    sizes = config.worker_range or (size, size)
    sizes = (sizes[0], min(sizes[1], size))  # growing is restart_to_grow's job
    gone = settled.dead | set(settled.stuck)
    deadline = time.monotonic() + config.startup_timeout
    while True:
        live()
        taken = {w.actor_index for w in members.workers if w.rank not in gone and w.node_id not in leaving}
        taken |= members.spares.bundles()
        plan = plan_restart(
            members.workers, dead=settled.dead, stuck=settled.stuck, leaving_nodes=leaving,
            spares=members.spares.seats(), free_seats=free_seats(members.pg, taken), sizes=sizes,
        )
        if not plan.missing:
            return plan
        if time.monotonic() >= deadline:
            raise InfeasibleResourcesError(
                f"warm restart: {plan.missing} more worker(s) needed for a world of at least {sizes[0]}, and "
                f"no bundle of the group's placement group was free on a node that stays within {config.startup_timeout:g} s"
            )
        time.sleep(SEAT_POLL_S)  # Ray re-places a lost node's bundles within moments when there is room


def _retire_agents(members: Members, leaving: Set[str]) -> List[Any]:
    """The node agents of nodes that leave the group, to kill."""
    return members.agents.retire(sorted(leaving))


def _join(builder: GroupBuilder, members: Members, plan: RestartPlan) -> None:
    """The next world: kept processes, spares and new processes, described,
    ranked and set up together (kept ones leave their old group first)."""
    kept: List[Tuple[Any, int]] = [(members.actors[r], members.workers[r].actor_index) for r in plan.kept]
    spares = members.spares.take(plan.spares)
    joining = [*kept, *[(s.actor, s.placement.index) for s in spares]]
    members.actors = [actor for actor, _ in joining]  # held, so that a failure from here releases them too
    fresh_bundles = [seat.bundle for seat in plan.fresh]
    actors = [actor for actor, _ in joining] + builder.create(members, fresh_bundles)
    bundles = [bundle for _, bundle in joining] + fresh_bundles
    placements = builder.describe(members, actors, bundles)
    standby = [s.placement for s in members.spares.ready]
    builder.assign(members, dict(zip(bundles, actors)), placements, standby)
    master = next(p for p in placements if p.index == members.workers[0].actor_index)
    builder.set_up(members, master.free_port)
