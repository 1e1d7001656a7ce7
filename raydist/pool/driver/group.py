"""WorkerGroup: a pool of Ray actors, one per rank, with a live process group.

Start-up is ``GroupBuilder``'s (two round trips). Calls are then one round
trip, sent to every rank under one lock, so calls from several threads run
in the same order on every rank and their collectives cannot pair across
calls. How a call ended is classified once (``classify_end``); any ending
but success tears the whole group down (peers stuck in a collective are
killed, not waited for) and raises the error for that ending.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence

import ray
import ray.cloudpickle

from raydist.config import RunConfig, check_call, check_seconds, make_config
from raydist.errors import (
    COLLECTIVES_HEADER,
    RaydistError,
    WorkerCallCancelled,
    WorkerGroupClosed,
    WorkerGroupError,
    WorkerGroupStopped,
    WorkerGroupTimeout,
)
from raydist.pool.cluster.connect import connect, connected_session
from raydist.pool.cluster.placement import room_for
from raydist.pool.driver import signals
from raydist.pool.driver.agents import explain_deaths
from raydist.pool.driver.diagnostics import GroupDiagnostics
from raydist.pool.driver.hooks import group_hooks
from raydist.pool.driver.log_files import RunLogs
from raydist.pool.driver.output import OutputRouter
from raydist.pool.driver.startup import GroupBuilder, Members, release
from raydist.pool.driver.waiting import Waited, wait_for_ranks
from raydist.pool.driver.watcher import GroupWatcher
from raydist.pool.records import CallEnd, Outcome, WorkerInfo
from raydist.pool.rules.logs import wants_files
from raydist.pool.rules.policy import classify_end
from raydist.pool.rules.stragglers import Straggler

if TYPE_CHECKING:  # the driver never needs torch: a run's start-up stays light
    from raydist.core.initialize import DistInfo

logger = logging.getLogger("raydist")

__all__ = ["WorkerGroup", "WorkerFuture", "WorkerInfo", "prepare_call"]

# Calls up to this size travel inside each actor task (no object-store round trip).
INLINE_CALL_BYTES = 64 * 1024


def prepare_call(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None) -> bytes:
    """Check a call and pickle it once for every rank (and every attempt);
    TypeError naming the part that cannot run on a worker."""
    args, kwargs = check_call(fn, args, kwargs)
    try:
        return ray.cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    except Exception as error:
        parts = [("fn", fn)] + [(f"args[{i}]", a) for i, a in enumerate(args)]
        parts += [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
        for name, part in parts:
            try:
                ray.cloudpickle.dumps(part)
            except Exception as part_error:
                raise TypeError(f"cannot pickle {name} ({part!r}) to send it to the workers: {part_error}") from error
        raise TypeError(f"cannot pickle the call to send it to the workers: {error}") from error


class WorkerFuture:
    """The pending result of ``WorkerGroup.submit``: one value per rank.

    Like ``concurrent.futures.Future``: ``result(timeout)`` raises
    ``TimeoutError`` and leaves the call running; the group's own
    ``timeout`` option is what tears a call down."""

    def __init__(self, group: "WorkerGroup", refs: List[ray.ObjectRef], actors: List[Any], number: int):
        self._group = group
        self.refs, self.actors, self.number = refs, actors, number
        limit = group.config.timeout
        self.deadline = None if limit is None else time.monotonic() + limit  # the group's timeout
        self._result: Optional[List[Any]] = None
        self._error: Optional[BaseException] = None

    def done(self) -> bool:
        if self._result is not None or self._error is not None:
            return True
        self._group._check_session()
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def result(self, timeout: Optional[float] = None) -> List[Any]:
        """Values ordered by rank. Raises WorkerGroupError or WorkerGroupTimeout
        (tearing the group down) if a rank fails or the group's timeout runs
        out, WorkerCallCancelled after ``cancel``, and TimeoutError (the call
        runs on) when ``timeout`` passes first. Asking again gives the same answer."""
        if self._error is not None:
            raise self._error
        if self._result is None:
            wait = None if timeout is None else check_seconds("timeout", timeout)
            try:
                self._result = self._group._finish(self, wait)
            except RaydistError as error:
                self._error = error
                raise
        return self._result

    def cancel(self) -> bool:
        """Stop the call by tearing the group down (a rank cannot leave a
        collective alone). Returns False if it had already finished."""
        if self.done():
            return False
        self._group._cancelled = True
        self._group.shutdown(graceful=False)
        return True


class WorkerGroup:
    """A pool of Ray actors, one per rank, kept alive across calls.

    ``WorkerGroup(4, backend="gloo")`` or ``WorkerGroup(config=RunConfig(...))``:
    the keyword options are ``raydist.RunConfig``'s fields. Use as a context
    manager; ``run`` and ``submit`` execute a function on every rank with
    torch.distributed already initialised, from any number of threads.
    """

    def __init__(
        self,
        num_workers: Optional[int] = None,
        *,
        config: Optional[RunConfig] = None,
        restart_count: int = 0,
        logs: Optional[RunLogs] = None,
        node_order: Sequence[str] = (),
        **options: Any,
    ):
        if num_workers is not None:
            options["num_workers"] = num_workers
        self.config: RunConfig = make_config(config, options)
        hooks = group_hooks(self.config)  # a missing backend library fails here, before Ray
        self._hooks = hooks
        self._lock = threading.RLock()  # orders submissions; guards the closed flag
        self._calls = 0
        self._closed = self._cancelled = False
        self._members: Optional[Members] = None
        self._watcher: Optional[GroupWatcher] = None
        connect(self.config.address, startup_timeout=self.config.startup_timeout)
        self._session = connected_session()
        self._diagnostics = GroupDiagnostics(self.config, lambda: self._members)
        try:
            builder = GroupBuilder(
                self.config, hooks, logs or RunLogs(self.config), _router(self.config), restart_count, node_order,
                extra_env=dict(self._diagnostics.env()),
            )
            self._members = builder.build()
        except BaseException:
            self._diagnostics.stop()
            raise
        self._watcher = _watch(self)
        self._diagnostics.start()

    # -- what the group is -------------------------------------------------

    @property
    def workers(self) -> List[WorkerInfo]:
        """Each rank's placement: rank, local rank, node rank, node id/IP, pid, devices."""
        return list(self._members.workers) if self._members else []

    @property
    def contexts(self) -> List[Optional["DistInfo"]]:
        """Each rank's initialization record (None where the process group was left to the code)."""
        return list(self._members.contexts) if self._members else []

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def held_resources(self) -> Dict[str, Dict[str, float]]:
        """What the group's workers hold on each node (node id -> amounts)."""
        return self._members.held_resources() if self._members else {}

    @property
    def node_order(self) -> List[str]:
        """The group's node ids in node-rank order."""
        return list(dict.fromkeys(worker.node_id for worker in self.workers))

    @property
    def drained_nodes(self) -> Dict[str, float]:
        """Nodes of this group that Ray started draining, with their deadlines."""
        return dict(self._watcher.drained) if self._watcher is not None else {}

    # -- calls -------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None) -> WorkerFuture:
        """Start ``fn(*args, **kwargs)`` on every rank; returns at once."""
        return self.submit_prepared(prepare_call(fn, args, kwargs))

    def submit_prepared(self, call: bytes) -> WorkerFuture:
        """Start a call made by ``prepare_call`` on every rank."""
        with self._lock:
            self._check_usable()
            sent: Any = ray.put(call) if len(call) > INLINE_CALL_BYTES else call  # big: stored once, read by every rank
            # One lock around the sends: every rank queues calls in the same order.
            actors = list(self._members.actors)  # type: ignore[union-attr]
            refs = [actor.execute.remote(sent) for actor in actors]
            number, self._calls = self._calls, self._calls + 1
        return WorkerFuture(self, refs, actors, number)

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank; the return values ordered by rank.

        ``timeout`` defaults to the group's ``timeout`` option."""
        return self.submit(fn, args, kwargs).result(timeout)

    def _finish(self, future: WorkerFuture, timeout: Optional[float]) -> List[Any]:
        """Wait for ``future``'s ranks; the values, or tear down and raise for how it ended."""
        self._check_session()
        group_left = None if future.deadline is None else max(0.0, future.deadline - time.monotonic())
        limit = group_left if timeout is None else timeout if group_left is None else min(timeout, group_left)
        try:
            waited = wait_for_ranks(future.refs, limit, self.workers, None, future.actors)
        except BaseException as error:  # KeyboardInterrupt included: leave nothing running
            try:
                _forward(self, error, future)
            finally:
                self.shutdown(graceful=False)
            if connected_session() != self._session:
                raise WorkerGroupClosed("Ray was shut down (ray.shutdown()) while this WorkerGroup's call ran") from error
            raise
        if waited.pending and not waited.failures and limit is not None and (group_left is None or limit < group_left):
            raise TimeoutError(f"call {future.number} had not finished after {limit:g} s; it is still running")
        grow_by = self._watcher.grow_by if self._watcher is not None else 0
        end = classify_end(
            waited.failures, waited.pending, cancelled=self._cancelled, closed=self._closed,
            grow_by=grow_by, drained_nodes=self.drained_nodes,
        )
        if end is CallEnd.FINISHED:
            output = self._members.output if self._members else None
            return output.settle(future.number, waited.results) if output is not None else waited.results
        ended = _error_for(self, end, waited, limit or 0.0, grow_by)
        ended.end = ended.end or end
        _stop_then_settle(self, future.number, waited)
        raise ended

    def stacks(self) -> str:
        """Where every rank is now: Python stacks grouped by location, the odd
        ones out marked, and where each rank is in its collectives (from the
        flight recorders: which rank did not enter the collective the others
        wait in, or entered another). The group keeps running."""
        self._check_usable()
        stacks = self._diagnostics.stacks(range(self.num_workers))
        collectives = self._diagnostics.collectives({})
        return f"{stacks}\n{COLLECTIVES_HEADER}\n{collectives}" if collectives else stacks

    def stragglers(self, refresh: bool = False) -> List[Straggler]:
        """The ranks that reach collectives consistently later than the others
        (over the last collectives the flight recorders hold), as of the last
        look (every 0.5 s; ``refresh``: look now); [] on an even run or with
        ``flight_recorder=False``."""
        if refresh:
            self._check_usable()
        return self._diagnostics.stragglers(refresh)

    def _check_usable(self) -> None:
        self._check_session()
        if self._closed:
            raise RuntimeError("this WorkerGroup has been shut down")

    def _check_session(self) -> None:
        if connected_session() != self._session:
            raise RuntimeError(
                "the Ray this WorkerGroup was started in has been shut down (ray.shutdown()); "
                "its workers are gone: start a new WorkerGroup"
            )

    # -- teardown ----------------------------------------------------------

    def shutdown(self, graceful: bool = True) -> None:
        """Leave the process group (if ``graceful``), kill the actors, free the placement group.

        Returns when the actors are dead. Safe to call more than once and
        from any thread; a call after an interrupted one finishes its work.
        Never starts a Ray (after ``ray.shutdown()`` the workers are gone with it).
        """
        with self._lock:
            first, self._closed = not self._closed, True
        if self._watcher is not None:
            self._watcher.stop()  # kept: what it saw explains the failure
        if getattr(self, "_diagnostics", None) is not None:
            self._diagnostics.stop()
        members = self._members
        if members is not None and connected_session() == self._session:
            release(members, graceful and first)
        self._hooks.stop()
        if members is not None and members.output is not None:
            members.output.close()
            members.output = None

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown(graceful=exc_info[0] is None)

    def __del__(self) -> None:  # a group dropped without shutdown() is freed when collected
        if getattr(self, "_members", None) is not None and not self._closed:
            try:
                self.shutdown(graceful=False)
            except Exception:  # noqa: BLE001 - best effort at interpreter or collection time
                pass


def _stop_then_settle(group: WorkerGroup, number: int, waited: Waited) -> None:
    """Kill the group first (peers stuck in a collective need not wait),
    then wait for the failed call's output: its markers are already in the files."""
    output = group._members.output if group._members else None
    if group._members is not None:
        group._members.output = None
    group.shutdown(graceful=False)
    if output is not None:
        # A rank whose value could not come back marked only what it printed: not waited for.
        output.settle(number, waited.results, [f.rank for f in waited.failures if not f.crashed and f.rank not in waited.unsent])
        output.close()


def _error_for(group: WorkerGroup, end: CallEnd, waited: Waited, limit: float, grow_by: int) -> RaydistError:
    """The error for a call that ended as ``end``; evidence and stacks are read before the teardown."""
    if end is CallEnd.CANCELLED:
        return WorkerCallCancelled("the call was cancelled (WorkerFuture.cancel()); its WorkerGroup was shut down")
    if end is CallEnd.GROW:
        return WorkerGroupStopped(f"the cluster has room for {grow_by} more worker(s)")
    if end is CallEnd.SHUT_DOWN:
        return WorkerGroupClosed("this WorkerGroup was shut down while the call ran")
    if end is CallEnd.TIMED_OUT:
        return WorkerGroupTimeout(limit, waited.pending, group._diagnostics.stacks(waited.pending), group._diagnostics.collectives({}))
    failures = waited.failures
    if (end is CallEnd.RANK_FAILED or end is CallEnd.NODE_LOST) and group._members is not None:
        failures = explain_deaths(failures, group.workers, group._members.agents)
    drained = group.drained_nodes
    known = {f.rank: f.collectives for f in failures if f.collectives}
    collectives = group._diagnostics.collectives(known) if known else ""  # a rank failed inside a collective
    error = WorkerGroupError(
        failures, preempted_nodes=sorted({f.node_id for f in failures if f.node_id in drained}), collectives=collectives
    )
    error.end = classify_end(failures, [], drained_nodes=drained)  # an explained death may be a lost node
    return error


def _forward(group: WorkerGroup, error: BaseException, future: WorkerFuture) -> None:
    """For a handled signal (it interrupts the wait as a KeyboardInterrupt):
    send it to every rank (as torchrun does: their handlers can save state),
    then wait up to ``shutdown_timeout`` for them to finish and for what they
    printed meanwhile."""
    signum = signals.received() if isinstance(error, KeyboardInterrupt) else None
    members = group._members
    if signum is None or members is None or not members.actors:
        return
    logger.warning(
        "raydist: got %s: forwarding it to every rank, then stopping the workers (within %g s)",
        signals.SignalReceived(signum).name, group.config.shutdown_timeout,
    )
    members.agents.ask(group.workers, range(group.num_workers), "signal", signum)
    deadline = time.monotonic() + group.config.shutdown_timeout
    pending = list(future.refs)
    while pending and not signals.hurried() and time.monotonic() < deadline:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(0.25, max(0.0, deadline - time.monotonic())))
    if members.output is not None:  # what the ranks' handlers printed, before the files close
        values, failed = _finished_values(future.refs, pending)
        members.output.settle(future.number, values, failed)


def _finished_values(refs: Sequence[ray.ObjectRef], pending: Sequence[ray.ObjectRef]) -> "tuple[List[Any], List[int]]":
    """Each finished rank's value (None for the others) and the ranks whose
    code raised or exited (both their streams carry a marker)."""
    values: List[Any] = [None] * len(refs)
    failed: List[int] = []
    for rank, ref in enumerate(refs):
        if ref in pending:
            continue
        try:
            outcome = ray.get(ref, timeout=0)
        except Exception:  # noqa: BLE001 - a rank that died marks nothing
            continue
        if isinstance(outcome, Outcome) and not outcome.ok:
            failed.append(rank)
        else:
            values[rank] = outcome.value if isinstance(outcome, Outcome) else outcome
    return values, failed


def _router(config: RunConfig) -> Optional[OutputRouter]:
    router = OutputRouter.install()
    if router is None and (wants_files(config) or config.local_ranks_filter is not None):
        raise ValueError(
            "log_dir, redirects, tee and local_ranks_filter need Ray to forward worker output "
            "to this driver (ray.init(log_to_driver=True); not Ray Client)"
        )
    return router


def _watch(group: WorkerGroup) -> GroupWatcher:
    """Warn ranks on draining nodes; with restart_to_grow, stop to grow. The
    watcher holds the group weakly, so a group dropped without shutdown() is freed."""
    config, members, ref = group.config, group._members, weakref.ref(group)
    assert members is not None
    sizes = config.worker_range

    def warn(ranks: List[int], deadline: float) -> None:
        members.agents.ask(members.workers, ranks, "preempt", deadline, config.preemption_signal, start_missing=False)

    def stop() -> None:
        alive = ref()
        if alive is not None:
            alive.shutdown(graceful=False)

    def room() -> int:
        # Whole nodes under the node layout: never a second bundle on a node the group holds.
        request = members.request
        taken = list(dict.fromkeys(w.node_id for w in members.workers)) if request.node_layout else []
        more = room_for(request, taken) * request.per_bundle
        return min(sizes[1] - len(members.workers), more) if sizes else 0

    growable = config.restart_to_grow and sizes is not None and len(members.workers) < sizes[1]
    return GroupWatcher(members.workers, warn, stop, room if growable else None, config.monitor_interval).start()
