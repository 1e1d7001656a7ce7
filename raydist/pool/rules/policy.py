"""How a call on a worker group ended, and whether the run goes on.

Pure: ``classify_end`` turns what the driver saw into a ``CallEnd``, and
``decide`` turns that and the run's ``Facts`` into a ``Decision``: restart
warm, fresh or larger (why, counted against ``max_restarts`` or not), or
raise (and why not). The run's controller asks, once per failure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Collection, Optional, Sequence, Tuple

from raydist.errors import RaydistError, WorkerFailure, WorkerGroupError, root_cause
from raydist.pool.records import CallEnd
from raydist.pool.rules.explain import NODE_LOST_TEXT
from raydist.pool.rules.hangs import NotArrived
from raydist.pool.rules.restart_plan import Seat
from raydist.pool.rules.stragglers import Straggler


def classify_end(
    failures: Sequence[WorkerFailure],
    pending: Sequence[int],
    *,
    stopped: Optional[CallEnd] = None,
    drained_nodes: Collection[str] = (),
    replaced: Collection[int] = (),
) -> CallEnd:
    """How a call ended, from its failed and unfinished ranks and why the
    driver stopped the group meanwhile, if it did (``stopped``: CANCELLED,
    GROW or SHUT_DOWN; ``replaced``: stragglers it killed to replace them).
    What raydist did itself explains the ranks' failures before anything the
    ranks reported; a call every rank finished keeps its values whatever came after."""
    finished = not failures and not pending  # every rank's value came back: a later stop cannot take it
    if stopped is not None and not finished:
        return stopped
    if failures:
        if any(failure.node_id in drained_nodes for failure in failures):
            return CallEnd.DRAINED
        root = root_cause(failures)
        if root.crashed and root.rank in replaced:
            return CallEnd.REPLACED
        return CallEnd.NODE_LOST if root.crashed and NODE_LOST_TEXT in (root.died or "") else CallEnd.RANK_FAILED
    return CallEnd.TIMED_OUT if pending else CallEnd.FINISHED


@dataclass(frozen=True)
class RestartReason:
    """Why a group is restarted, for the one line each restart logs."""

    kind: str  # "failure", "node lost", "preemption", "scale-up"
    detail: str
    counted: bool  # against max_restarts


class Action(enum.Enum):
    """What a run does after a failure: the one answer of ``decide``."""

    WARM = "warm"  # replace the failed ranks in place; the survivors keep their processes
    FRESH = "fresh"  # tear the attempt down and start the next one in new processes
    RESIZE = "resize"  # the same, larger: the cluster has room for more workers
    RAISE = "raise"  # the run ends with the error


@dataclass(frozen=True)
class Facts:
    """What the policy needs to know besides how the call ended."""

    restarts_left: int  # max_restarts minus the restarts counted so far
    retry_on_exception: bool
    driver_node: Optional[str]  # the node the driver runs on (None: unknown, a remote client)
    started: bool  # the failed attempt had started (False: it failed while starting)
    warm_restarts: bool  # the run restarts in place where it can (restart_mode="warm")
    node_layout: bool  # torchrun's node layout: a restart replaces whole nodes, so it starts afresh
    fresh_allowed: bool  # the run may start new attempts (raydist.run, raydist run); a WorkerGroup raises instead
    warm_failed: bool = False  # a warm restart for this failure was tried and could not finish
    stopping: bool = False  # a stop (shutdown, cancel, Ctrl-C) was asked meanwhile: the run ends


@dataclass(frozen=True)
class Decision:
    """One failure's answer: the action, why (``reason``, for the log line
    and whether it counts against max_restarts), and why not restart."""

    action: Action
    reason: Optional[RestartReason] = None
    why_not: Optional[str] = None

    @property
    def restarts(self) -> bool:
        return self.action in (Action.WARM, Action.FRESH, Action.RESIZE)


def decide(error: BaseException, facts: Facts) -> Decision:
    """What the run does after ``error``: asked by the run's control loop
    (``raydist.pool.driver.controller``) once per failure, and once more when
    the warm restart it chose could not finish; nothing else decides.

    A preemption and a growth are not counted against ``max_restarts``; a
    dead rank or a lost node are; code that raised only with
    ``retry_on_exception``; nor a straggler raydist replaced. Time-outs,
    cancellations and shut-downs end the run. A restart is warm when the run restarts in place, its attempt had
    started, no node layout binds whole nodes and no warm restart for this
    failure failed already; otherwise it starts afresh where the run may,
    else raises. A run asked to stop meanwhile ends.
    """
    if facts.stopping:
        return Decision(Action.RAISE)
    end = error.end if isinstance(error, RaydistError) else None
    reason = _reason(end, error, facts.retry_on_exception)
    if reason is None:
        return Decision(Action.RAISE)
    if end is CallEnd.DRAINED and isinstance(error, WorkerGroupError) and facts.driver_node in error.preempted_nodes:
        # Ray starts no new actors anywhere while the driver's own node drains.
        return Decision(Action.RAISE, why_not="the driver's node is being drained: no restart; run the driver on a node that stays")
    if reason.counted and facts.restarts_left <= 0:
        return Decision(Action.RAISE)
    if facts.started and facts.warm_restarts and not facts.node_layout and not facts.warm_failed:
        return Decision(Action.WARM, reason)
    return Decision(Action.FRESH if facts.fresh_allowed else Action.RAISE, reason)


def replace_hung(hang: NotArrived, stopping: bool) -> Tuple[int, ...]:
    """The ranks to kill now for ``hang`` (ranks that have not reached a
    collective the others waited in for ``hang_timeout``): those that did not
    arrive, unless a stop was asked meanwhile. Their death is then a failure
    like any other, put to ``decide``: a warm restart (a spare, the state from
    memory) where the budget allows, else the run ends at once, naming the hang,
    instead of after the process group's timeout."""
    return () if stopping else hang.behind


def replace_straggler(
    straggler: Straggler, node: str, spares: Sequence[Seat], excluded: Collection[str], stopping: bool
) -> Tuple[int, ...]:
    """The ranks to kill now for ``straggler`` (late for ``straggler_windows``
    windows in a row, on ``node``): the straggler, when a ready spare stands
    on another node that is not ``excluded`` (a replacement on its own node
    would be as slow), and no stop was asked. Its death is then put to
    ``decide`` as a replacement: a warm restart, not counted; the node hosts
    no rank again. Without such a spare, the straggler is only reported."""
    if stopping or not any(spare.node_id != node and spare.node_id not in excluded for spare in spares):
        return ()
    return (straggler.rank,)


def scale_to(size: int, more: int, sizes: Optional[Tuple[int, int]], fresh_allowed: bool) -> Optional[int]:
    """The size to restart a running world of ``size`` at, now that the
    cluster has room for ``more`` workers (``restart_to_grow``): up to the
    elastic maximum; None to stay (no room, no elastic size, at the maximum,
    or a ``WorkerGroup``, which starts no new attempt). Growth is not a
    failure: it is charged to no restart budget."""
    if not fresh_allowed or sizes is None or more <= 0 or size >= sizes[1]:
        return None
    return min(sizes[1], size + more)


def _reason(end: Optional[CallEnd], error: BaseException, retry_on_exception: bool) -> Optional[RestartReason]:
    if not isinstance(error, WorkerGroupError) or end not in (CallEnd.DRAINED, CallEnd.NODE_LOST, CallEnd.RANK_FAILED, CallEnd.REPLACED):
        return None
    root = error.root_cause
    if end is CallEnd.DRAINED:
        nodes = ", ".join(node[:12] for node in error.preempted_nodes)
        return RestartReason("preemption", f"node(s) {nodes} drained by Ray", counted=False)
    if end is CallEnd.REPLACED:
        return RestartReason("straggler", f"rank {root.rank} on node {root.node_id[:12]} {root.died}", counted=False)
    if root.crashed:
        kind = "node lost" if end is CallEnd.NODE_LOST else "failure"
        return RestartReason(kind, f"rank {root.rank} on node {root.node_id[:12]}: {root.died}", counted=True)
    if retry_on_exception:
        return RestartReason("failure", f"rank {root.rank}: {root.summary()}", counted=True)
    return None


def restart_line(reason: RestartReason, old_size: int, attempt: int, max_restarts: int, restarts_used: int) -> str:
    """One line per restart: why, the old world size (0: the group failed
    while starting), and which attempt of how many counted."""
    budget = f"restart {restarts_used} of {max_restarts}" if reason.counted else "not counted against max_restarts"
    size = f"world size was {old_size}" if old_size else "the group failed while starting"
    return f"raydist: {reason.kind}: {reason.detail}; {size}; starting attempt {attempt} ({budget})"
