"""Waiting for one step on every rank: the values by rank, or what went wrong.

The group decides what to raise and tears itself down; this module only
waits, spots the first failure early, and turns each failed rank into a
``WorkerFailure`` (who, where, and the traceback or how the process died).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from raydist.errors import WorkerFailure, WorkerGroupClosed
from raydist.pool.cluster.seam import CallFailed, Cluster, Pending, WorkerDied
from raydist.pool.records import Outcome, WorkerInfo
from raydist.pool.rules.outcomes import death_line, rank_failure, step_error_text

# After the first failure, how long to let other ranks report theirs (so that
# the same error on every rank is reported once, with all the ranks).
FAILURE_GRACE_S = 0.5
# The same for the start-up round trips: every rank does the same seconds of
# work (imports, the backend's init), so on a loaded machine the same error
# comes further apart; a failed start is rare, and waiting costs a success nothing.
STARTUP_FAILURE_GRACE_S = 2.0
# How often a start-up wait asks whether the run was asked to stop.
STOP_CHECK_S = 1.0
# How long a call's first, all-ranks wait lasts before failure-aware waiting.
FAST_PATH_S = 0.05
_FETCH_ONE = object()  # marks a result to fetch on its own after a failed batch


@dataclass
class Waited:
    """The end of a wait: values by rank, failed ranks, ranks still running."""

    results: List[Any]
    failures: List[WorkerFailure] = field(default_factory=list)
    pending: List[int] = field(default_factory=list)
    unsent: List[int] = field(default_factory=list)  # ranks whose value could not come back (markers unknown)
    spans: Dict[int, Tuple[Any, ...]] = field(default_factory=dict)  # rank -> what it recorded (``SpanBuffer.take``)
    waits: Dict[int, Tuple[Tuple[str, float], ...]] = field(default_factory=dict)  # rank -> its waits' sums

    def keep(self, rank: int, value: Any) -> Any:
        """``value`` as the rank's result: an Outcome's records are kept here."""
        if isinstance(value, Outcome):
            if value.spans:
                self.spans[rank] = value.spans
            if value.waits:
                self.waits[rank] = value.waits
        return value

    @property
    def marked_failures(self) -> List[int]:
        """Ranks whose code raised or exited, and whose output carries the call's end marker (not the dead, not the unsent)."""
        return [f.rank for f in self.failures if not f.crashed and f.rank not in self.unsent]


def wait_for_ranks(
    cluster: Cluster,
    refs: Sequence[Pending],
    timeout: Optional[float],
    workers: Sequence[WorkerInfo],
    progress: Optional[Any] = None,  # a tqdm-like bar
    actors: Optional[Sequence[Any]] = None,
    grace: float = FAILURE_GRACE_S,
    stopping: Optional[Callable[[], bool]] = None,
) -> Waited:
    """Wait for ``refs`` (indexed by rank) until all are done, one fails
    (then ``grace`` seconds for the others' failures), or ``timeout``;
    WorkerGroupClosed once ``stopping()`` (asked each second).

    ``actors`` (by rank) marks ``refs`` as user calls: an error that is not a
    death is then a return value that could not be sent back."""
    deadline = None if timeout is None else cluster.monotonic() + timeout
    pending: Dict[Pending, int] = {ref: rank for rank, ref in enumerate(refs)}
    waited = Waited(results=[None] * len(refs))
    # Fast path: a short call is usually back on every rank within
    # FAST_PATH_S, all of it fetched in one round trip; otherwise (or when
    # one rank failed) wait one at a time to spot failures early.
    try:
        waited.results = cluster.get(refs, timeout=min(timeout or FAST_PATH_S, FAST_PATH_S))
    except (TimeoutError, WorkerDied, CallFailed):  # not back yet, or a rank failed: the careful path reads each
        pass
    else:
        if not any(isinstance(value, Outcome) and not value.ok for value in waited.results):
            kept = [waited.keep(rank, value) for rank, value in enumerate(waited.results)]
            waited.results = [value.value if isinstance(value, Outcome) else value for value in kept]
            return waited
        waited.results = [None] * len(refs)
    while pending and not waited.failures:
        remaining = None if deadline is None else max(0.0, deadline - cluster.monotonic())
        if stopping is not None:  # asked each second: a stop asked meanwhile ends the wait
            if stopping():
                raise WorkerGroupClosed("this WorkerGroup was shut down while its workers started")
            slice_s = STOP_CHECK_S if remaining is None else min(remaining, STOP_CHECK_S)
            if not cluster.wait(list(pending), num_returns=1, timeout=slice_s)[0]:
                if remaining is not None and remaining <= STOP_CHECK_S:
                    break  # timed out
                continue
        elif not cluster.wait(list(pending), num_returns=1, timeout=remaining)[0]:
            break  # timed out
        # Take everything already finished in one go (cheap for warm calls).
        _take(cluster, cluster.wait(list(pending), num_returns=len(pending), timeout=0)[0], pending, waited, workers, actors)
        if progress is not None:
            progress.update(len(refs) - len(pending) - progress.n)
    if waited.failures and pending:
        ready, _ = cluster.wait(list(pending), num_returns=len(pending), timeout=grace)
        _take(cluster, ready, pending, waited, workers, actors)
    waited.pending = sorted(pending.values())
    return waited


class CallWait:
    """A call's ranks as they come back, read on each turn of the run's loop
    (``take``, which never blocks but for ``grace`` after a failure)."""

    def __init__(
        self, cluster: Cluster, refs: Sequence[Pending], workers: Sequence[WorkerInfo], actors: Sequence[Any], deadline: Optional[float]
    ):
        self._cluster, self._workers, self._actors = cluster, workers, actors
        self.deadline = deadline  # the group's timeout for the call (on the cluster's clock), if any
        self._pending: Dict[Pending, int] = {ref: rank for rank, ref in enumerate(refs)}
        self.waited = Waited(results=[None] * len(refs), pending=list(range(len(refs))))  # no rank is back until read
        self._news = False  # a rank's call ended since the last read (``Cluster.when_ended``)

    def news(self) -> None:
        """A rank's call ended (the cluster's thread: only noted)."""
        self._news = True

    def due(self) -> bool:
        """Whether a read may end the call: a rank came back, or the deadline passed."""
        return self._news or (self.deadline is not None and self._cluster.monotonic() >= self.deadline)

    def take(self, grace: float = FAILURE_GRACE_S) -> bool:
        """Read the ranks that came back; whether the call ended: every rank
        back, a rank failed (then ``grace`` for the others' failures), or the
        deadline passed (then ``waited.pending`` names the ranks still running)."""
        cluster, pending = self._cluster, self._pending
        self._news = False
        if pending:
            ready = cluster.wait(list(pending), num_returns=len(pending), timeout=0)[0]
            _take(cluster, ready, pending, self.waited, self._workers, self._actors)
        if self.waited.failures and pending:
            ready = cluster.wait(list(pending), num_returns=len(pending), timeout=grace)[0]
            _take(cluster, ready, pending, self.waited, self._workers, self._actors)
        self.waited.pending = sorted(pending.values())
        timed_out = self.deadline is not None and cluster.monotonic() >= self.deadline
        return not pending or bool(self.waited.failures) or timed_out


def _take(
    cluster: Cluster,
    ready: List[Pending],
    pending: Dict[Pending, int],
    waited: Waited,
    workers: Sequence[WorkerInfo],
    actors: Optional[Sequence[Any]],
) -> None:
    """Move finished ranks from ``pending`` into the results or the failures."""
    try:
        values: List[Any] = cluster.get(ready)  # one call for the common case
    except (WorkerDied, CallFailed):  # the ranks' errors are read one by one below
        values = [_FETCH_ONE] * len(ready)
    for ref, value in zip(ready, values):
        rank = pending.pop(ref)
        worker = workers[rank] if rank < len(workers) else None
        try:
            value = cluster.get([ref])[0] if value is _FETCH_ONE else value
        except WorkerDied as error:
            waited.failures.append(rank_failure(rank, worker, died=death_line(str(error)), now=cluster.time()))
            continue
        except CallFailed as error:  # a start-up step raised, or a result could not travel
            text = _unsendable_result(cluster, rank, error, actors[rank]) if actors is not None else step_error_text(str(error))
            waited.failures.append(rank_failure(rank, worker, traceback=text, now=cluster.time()))
            if actors is not None:
                waited.unsent.append(rank)
            continue
        if isinstance(waited.keep(rank, value), Outcome):
            if not value.ok:
                waited.failures.append(rank_failure(rank, worker, outcome=value, now=cluster.time()))
                continue
            value = value.value
        waited.results[rank] = value


def _unsendable_result(cluster: Cluster, rank: int, error: CallFailed, actor: Any) -> str:
    """The call ran, but its return value could not be pickled to come back,
    or came back and could not be unpickled here."""
    cause = error.cause
    last = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
    if error.unreadable:
        return (
            f"the return value of rank {rank} was sent but cannot be unpickled on the driver: "
            f"{type(cause).__name__}: {last} (is its class importable here?)"
        )
    try:
        kind = cluster.get([cluster.call(actor, "returned_type")], timeout=5)[0]
    except Exception:  # noqa: BLE001 - the type is a detail; the message stands without it
        kind = ""
    of_type = f" (a {kind})" if kind else ""
    hint = "; return a list of its items instead" if kind.endswith(".generator") else ""
    return f"the return value of rank {rank}{of_type} cannot be pickled to send it back: {type(cause).__name__}: {last}{hint}"
