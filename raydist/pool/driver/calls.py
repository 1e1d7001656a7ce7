"""A call on a worker group: checked and pickled once (``prepare_call``),
its pending result (``WorkerFuture``), and the error for how it ended."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from raydist.config import check_seconds
from raydist.errors import (
    RaydistError,
    WorkerCallCancelled,
    WorkerFailure,
    WorkerGroupClosed,
    WorkerGroupError,
    WorkerGroupStopped,
    WorkerGroupTimeout,
)
from raydist.pool import signals
from raydist.pool.cluster.seam import CallFailed, Cluster, Pending, WorkerDied
from raydist.pool.driver.agents import explain_deaths
from raydist.pool.driver.attempt import Attachment, Attempt
from raydist.pool.driver.call_check import check_call
from raydist.pool.driver.timeline_events import call_ended
from raydist.pool.driver.waiting import CallWait, Waited
from raydist.pool.records import INLINE_CALL_BYTES, CallEnd, Outcome
from raydist.pool.rules.policy import classify_end

__all__ = [
    "INLINE_CALL_BYTES",
    "CallHooks",
    "KeptCall",
    "WorkerFuture",
    "ending_of",
    "error_for",
    "forward_signal",
    "prepare_call",
    "send_call",
]

logger = logging.getLogger("raydist")


def prepare_call(cluster: Cluster, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None) -> bytes:
    """Check a call and pickle it once for every rank (and every attempt);
    TypeError naming the part that cannot run on a worker."""
    args, kwargs = check_call(fn, args, kwargs)
    try:
        return cluster.pickle((fn, tuple(args), dict(kwargs)))
    except Exception as error:
        parts = [("fn", fn)] + [(f"args[{i}]", a) for i, a in enumerate(args)]
        parts += [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
        for name, part in parts:
            try:
                cluster.pickle(part)
            except Exception as part_error:  # noqa: BLE001 - any pickling failure names the part
                raise TypeError(f"cannot pickle {name} ({part!r}) to send it to the workers: {part_error}") from error
        raise TypeError(f"cannot pickle the call to send it to the workers: {error}") from error


KeptCall = Optional[Tuple[int, bytes]]  # (an attempt's number, the small call its ranks keep)


def send_call(cluster: Cluster, attempt: Attempt, call: bytes, kept: KeptCall) -> Tuple[List[Pending], KeptCall]:
    """Send ``call`` to every rank of ``attempt``; its refs, and what the ranks keep
    now (``kept``: what they kept before). A big call is stored once, read by
    every rank; a small one they kept goes without its bytes (an actor task's
    argument costs more than a warm call), unpickled afresh all the same."""
    if len(call) > INLINE_CALL_BYTES:
        stored = cluster.share(call)
        return [cluster.call(actor, "execute", stored) for actor in attempt.actors], None
    sent = () if kept == (attempt.number, call) else (call,)
    return [cluster.call(actor, "execute", *sent) for actor in attempt.actors], (attempt.number, call)


@dataclass(frozen=True)
class CallHooks:
    """What a future needs of its run, and nothing more."""

    wait: Callable[["WorkerFuture", Optional[float]], bool]  # until the run's loop ended the call (or the timeout): whether it did
    cancel: Callable[["WorkerFuture"], bool]  # ask the loop to stop the run for this call; whether it did


class WorkerFuture:
    """The pending result of ``WorkerGroup.submit``: one value per rank.

    Like ``concurrent.futures.Future``: ``result(timeout)`` raises
    ``TimeoutError`` and leaves the call running; the group's own
    ``timeout`` option is what tears a call down. The run's control loop
    ends it, once (``end``); a reader only waits for that."""

    def __init__(
        self,
        hooks: CallHooks,
        attempt: Attempt,
        refs: List[Pending],
        number: int,
        wait: CallWait,
        sent_at: float,
        split: Optional[Attachment] = None,
    ):
        self._hooks = hooks
        self._split = split  # the call's dataset split (kept with its attempt too), stopped when the call ends
        self.attempt, self.refs, self.number = attempt, refs, number  # the attempt the call was sent to
        self.wait = wait  # its ranks as they come back (read by the loop)
        self.sent_at = sent_at  # for the run's timeline
        self.ending = threading.Event()  # set once the loop ended the call
        self._values: List[Any] = []
        self._error: Optional[RaydistError] = None

    @property
    def ended(self) -> bool:
        return self.ending.is_set()

    def end(self, values: Optional[List[Any]] = None, error: Optional[RaydistError] = None) -> None:
        """The call's end, as the run's loop decided it (the loop only; once)."""
        assert not self.ending.is_set(), f"call {self.number} ended twice"
        self._values, self._error = values or [], error
        self.release_split()
        self.ending.set()

    def done(self) -> bool:
        return self._hooks.wait(self, 0.0)

    def result(self, timeout: Optional[float] = None) -> List[Any]:
        """Values ordered by rank. Raises WorkerGroupError or WorkerGroupTimeout
        (tearing the group down) if a rank fails or the group's timeout runs
        out, WorkerCallCancelled after ``cancel``, and TimeoutError (the call
        runs on) when ``timeout`` passes first. Asking again gives the same answer."""
        wait = None if timeout is None else check_seconds("timeout", timeout)
        if not self._hooks.wait(self, wait):
            raise TimeoutError(f"call {self.number} had not finished after {wait:g} s; it is still running")
        if self._error is not None:
            raise self._error
        return list(self._values)

    def release_split(self) -> None:
        """The call ended: stop its dataset split (a retry gets a fresh one)."""
        split, self._split = self._split, None
        if split is not None:
            split.stop()

    def cancel(self) -> bool:
        """Stop the call by tearing the group down (a rank cannot leave a
        collective alone). Returns False if it had already finished."""
        if self.done():
            return False
        return self._hooks.cancel(self)


def ending_of(
    future: WorkerFuture, stopped: Optional[CallEnd], config_timeout: Optional[float]
) -> Tuple[Optional[List[Any]], Optional[RaydistError]]:
    """How ``future``'s call ended, from what its ranks sent back
    (``future.wait``): (values, None) or (None, the error); ``stopped``: why
    the run stopped the call (a call every rank finished keeps its values)."""
    attempt, waited = future.attempt, future.wait.waited
    future.release_split()  # readers left in the split's epoch barrier fail now, not after survivor_timeout
    failures = waited.failures
    if stopped is None and any(f.crashed for f in failures):  # read on their nodes: a death may be a lost node
        failures = attempt.explain_killed(explain_deaths(failures, attempt.workers, attempt.agents))
    end = classify_end(failures, waited.pending, stopped=stopped, drained_nodes=attempt.drained, replaced=attempt.replaced)
    call_ended(attempt, future.number, future.sent_at, waited, failures)
    if end is CallEnd.FINISHED:
        return attempt.settle_output(future.number, waited.results), None
    return None, error_for(end, attempt, waited, failures, config_timeout or 0.0)  # a timeout says the one set


def error_for(end: CallEnd, attempt: Attempt, waited: Waited, failures: Sequence[WorkerFailure], limit: float) -> RaydistError:
    """The error for a call on ``attempt`` that ended as ``end`` (``failures``:
    its failed ranks, deaths explained); evidence and stacks are read before the teardown."""
    error: RaydistError
    if end is CallEnd.CANCELLED:
        error = WorkerCallCancelled("the call was cancelled (WorkerFuture.cancel()); its WorkerGroup was shut down")
    elif end is CallEnd.GROW:
        error = WorkerGroupStopped(f"the cluster has room for {attempt.grow_by} more worker(s)")
    elif end is CallEnd.SHUT_DOWN:
        error = WorkerGroupClosed("this WorkerGroup was shut down while the call ran")
    elif end is CallEnd.TIMED_OUT:
        error = WorkerGroupTimeout(limit, waited.pending, attempt.stacks(waited.pending), attempt.collectives({}))
    else:
        drained = attempt.drained
        known = {f.rank: f.collectives for f in failures if f.collectives}
        collectives = attempt.collectives(known) if known else ""  # a rank failed inside a collective
        preempted = sorted({f.node_id for f in failures if f.node_id in drained})
        error = WorkerGroupError(failures, preempted_nodes=preempted, collectives=collectives)
    error.end = end
    return error


def forward_signal(cluster: Cluster, attempt: Attempt, signum: Optional[int], future: WorkerFuture, shutdown_timeout: float) -> None:
    """For a handled signal ``signum`` (it interrupted the user's wait as a
    KeyboardInterrupt): send it to every rank (as torchrun does: their
    handlers can save state), then wait up to ``shutdown_timeout`` for them
    to finish and for what they printed meanwhile."""
    if signum is None or not attempt.actors:
        return
    logger.warning(
        "raydist: got %s: forwarding it to every rank, then stopping the workers (within %g s)",
        signals.SignalReceived(signum).name,
        shutdown_timeout,
    )
    attempt.agents.ask(attempt.workers, range(attempt.size), "signal", signum)
    attempt.timeline.instant(f"{signals.SignalReceived(signum).name} forwarded to every rank", "signal", attempt=attempt.number)
    deadline = cluster.monotonic() + shutdown_timeout
    pending = list(future.refs)
    while pending and not signals.hurried() and cluster.monotonic() < deadline:
        _, pending = cluster.wait(pending, num_returns=len(pending), timeout=min(0.25, max(0.0, deadline - cluster.monotonic())))
    values, failed = _finished_values(cluster, future.refs, pending)  # what the ranks' handlers printed, before the files close
    attempt.close_output(future.number, values, failed)


def _finished_values(cluster: Cluster, refs: Sequence[Pending], pending: Sequence[Pending]) -> Tuple[List[Any], List[int]]:
    """Each finished rank's value (None for the others) and the ranks whose
    code raised or exited (both their streams carry a marker)."""
    values: List[Any] = [None] * len(refs)
    failed: List[int] = []
    for rank, ref in enumerate(refs):
        if ref in pending:
            continue
        try:
            outcome = cluster.get([ref], timeout=0)[0]
        except (WorkerDied, CallFailed, TimeoutError):  # a rank that died marks nothing
            continue
        if isinstance(outcome, Outcome) and not outcome.ok:
            failed.append(rank)
        else:
            values[rank] = outcome.value if isinstance(outcome, Outcome) else outcome
    return values, failed
