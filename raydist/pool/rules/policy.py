"""How a call on a worker group ended, and whether the run goes on.

Pure: ``classify_end`` turns what the driver saw into a ``CallEnd``, and
``decide_restart`` turns that into a ``Decision``: restart (why, counted
against ``max_restarts`` or not) or raise (and why not). ``WorkerGroup``
classifies; ``raydist.run`` and ``raydist run`` decide with the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Optional, Sequence

from raydist.errors import RaydistError, WorkerFailure, WorkerGroupError, root_cause
from raydist.pool.records import CallEnd
from raydist.pool.rules.explain import NODE_LOST_TEXT


def classify_end(
    failures: Sequence[WorkerFailure],
    pending: Sequence[int],
    *,
    stopped: Optional[CallEnd] = None,
    drained_nodes: Collection[str] = (),
) -> CallEnd:
    """How a call ended, from its failed and unfinished ranks and why the
    driver stopped the group meanwhile, if it did (``stopped``: CANCELLED,
    GROW or SHUT_DOWN). What raydist did itself explains the ranks' failures
    before anything the ranks reported; a call every rank finished keeps
    its values whatever came after."""
    finished = not failures and not pending  # every rank's value came back: a later stop cannot take it
    if stopped is not None and not finished:
        return stopped
    if failures:
        if any(failure.node_id in drained_nodes for failure in failures):
            return CallEnd.DRAINED
        root = root_cause(failures)
        return CallEnd.NODE_LOST if root.crashed and NODE_LOST_TEXT in (root.died or "") else CallEnd.RANK_FAILED
    return CallEnd.TIMED_OUT if pending else CallEnd.FINISHED


@dataclass(frozen=True)
class RestartReason:
    """Why a group is restarted, for the one line each restart logs."""

    kind: str  # "failure", "node lost", "preemption", "scale-up"
    detail: str
    counted: bool  # against max_restarts


@dataclass(frozen=True)
class Decision:
    """Restart (``restart`` says why) or raise (``why_not`` may say why not)."""

    restart: Optional[RestartReason] = None
    why_not: Optional[str] = None


def decide_restart(
    error: BaseException,
    *,
    retry_on_exception: bool,
    restarts_left: int,
    driver_node: Optional[str] = None,
) -> Decision:
    """Whether a run whose group raised ``error`` runs again. Asked once per
    failure: by the group for a failed call (kept on the error as
    ``decision``), by the runner for a failed start.

    A preemption and a growth are not counted against ``max_restarts``; a
    dead rank or a lost node are; code that raised only with
    ``retry_on_exception``. Time-outs, cancellations and shut-downs end the run.
    """
    end = error.end if isinstance(error, RaydistError) else None
    reason = _reason(end, error, retry_on_exception)
    if reason is None:
        return Decision()
    if end is CallEnd.DRAINED and isinstance(error, WorkerGroupError) and driver_node in error.preempted_nodes:
        # Ray starts no new actors anywhere while the driver's own node drains.
        return Decision(why_not="the driver's node is being drained: no restart; run the driver on a node that stays")
    if reason.counted and restarts_left <= 0:
        return Decision()
    return Decision(restart=reason)


def _reason(end: Optional[CallEnd], error: BaseException, retry_on_exception: bool) -> Optional[RestartReason]:
    if end is CallEnd.GROW:
        return RestartReason("scale-up", str(error), counted=False)
    if not isinstance(error, WorkerGroupError) or end not in (CallEnd.DRAINED, CallEnd.NODE_LOST, CallEnd.RANK_FAILED):
        return None
    root = error.root_cause
    if end is CallEnd.DRAINED:
        nodes = ", ".join(node[:12] for node in error.preempted_nodes)
        return RestartReason("preemption", f"node(s) {nodes} drained by Ray", counted=False)
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
