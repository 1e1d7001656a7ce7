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

from raydist.config import RunConfig, make_config
from raydist.errors import COLLECTIVES_HEADER, RaydistError, WorkerGroupClosed
from raydist.pool.cluster.connect import connect, connected_session
from raydist.pool.cluster.placement import room_for
from raydist.pool.driver.calls import INLINE_CALL_BYTES, WorkerFuture, error_for, forward_signal, prepare_call
from raydist.pool.driver.diagnostics import GroupDiagnostics
from raydist.pool.driver.hooks import group_hooks
from raydist.pool.driver.log_files import RunLogs
from raydist.pool.driver.output import OutputRouter
from raydist.pool.driver.restart import restart_group
from raydist.pool.driver.seats import free_seats
from raydist.pool.driver.startup import GroupBuilder, Members, release
from raydist.pool.driver.state import abort_state, new_state_name, release_state, state_env
from raydist.pool.driver.waiting import Waited, wait_for_ranks
from raydist.pool.driver.watcher import GroupWatcher
from raydist.pool.records import CallEnd, GroupPhase, Placement, WorkerInfo
from raydist.pool.rules.explain import format_stacks
from raydist.pool.rules.logs import wants_files
from raydist.pool.rules.policy import classify_end
from raydist.pool.rules.stragglers import Straggler

if TYPE_CHECKING:  # the driver never needs torch: a run's start-up stays light
    from raydist.core.initialize import DistInfo

__all__ = ["WorkerGroup", "WorkerFuture", "WorkerInfo", "prepare_call", "INLINE_CALL_BYTES"]

logger = logging.getLogger("raydist")

class WorkerGroup:
    """A pool of Ray actors, one per rank, kept alive across calls.

    ``WorkerGroup(4, backend="gloo")`` or ``WorkerGroup(config=RunConfig(...))``:
    the keyword options are ``raydist.RunConfig``'s fields. Use as a context
    manager; ``run`` and ``submit`` execute a function on every rank with
    torch.distributed already initialised, from any number of threads. With
    warm restarts, a failure that ``raydist.run`` would restart after still
    raises, but the group has replaced its dead ranks in place first.
    """

    def __init__(
        self,
        num_workers: Optional[int] = None,
        *,
        config: Optional[RunConfig] = None,
        restart_count: int = 0,
        logs: Optional[RunLogs] = None,
        node_order: Sequence[str] = (),
        restarts_used: int = 0,
        state_name: Optional[str] = None,
        **options: Any,
    ):
        if num_workers is not None:
            options["num_workers"] = num_workers
        self.config: RunConfig = make_config(config, options)
        hooks = group_hooks(self.config)  # a missing backend library fails here, before Ray
        self._hooks = hooks
        self._lock = threading.RLock()  # orders submissions; guards the phase, held only briefly
        self._changed = threading.Condition(self._lock)  # the phase changed
        self._phase = GroupPhase.STARTING
        self._calls = 0
        self._closed = self._cancelled = False
        self._members: Optional[Members] = None
        self._watcher: Optional[GroupWatcher] = None
        self.restarts_used = restarts_used  # restarts counted against max_restarts, this run's
        self._state_name, self._owns_state = state_name or new_state_name(), state_name is None
        connect(self.config.address, startup_timeout=self.config.startup_timeout)
        self._session = connected_session()
        self._diagnostics = GroupDiagnostics(self.config, lambda: self._members)
        try:
            self._builder = GroupBuilder(
                self.config, hooks, logs or RunLogs(self.config), _router(self.config), restart_count, node_order,
                extra_env={**self._diagnostics.env(), **state_env(self.config, self._state_name)},
            )
            self._members = self._builder.build()
        except BaseException:
            self._diagnostics.stop()
            raise
        self._watcher = _watch(self)
        self._diagnostics.start()
        with self._lock:
            if self._phase is GroupPhase.STARTING:
                self._phase = GroupPhase.RUNNING

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
    def closed(self) -> bool:
        return self._closed

    @property
    def restart_count(self) -> int:
        """The attempt the group runs (TORCHELASTIC_RESTART_COUNT); a warm restart raises it."""
        return self._builder.restart_count

    @property
    def spares(self) -> List[Placement]:
        """Where each ready spare worker runs (node, pid, devices); not in the world."""
        return [spare.placement for spare in self._members.spares.ready] if self._members else []

    @property
    def held_resources(self) -> Dict[str, Dict[str, float]]:
        """What the group's workers and spares hold on each node (node id -> amounts)."""
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
            # A call sent during a warm restart runs in the new world (or raises once the group is shut down).
            self._changed.wait_for(lambda: self._phase is not GroupPhase.RESTARTING)
            self._check_usable()
            sent: Any = ray.put(call) if len(call) > INLINE_CALL_BYTES else call  # big: stored once, read by every rank
            # One lock around the sends: every rank queues calls in the same order.
            actors = list(self._members.actors)  # type: ignore[union-attr]
            refs = [actor.execute.remote(sent) for actor in actors]
            number, self._calls = self._calls, self._calls + 1
        return WorkerFuture(self, refs, actors, number)

    def run(
        self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None, timeout: Optional[float] = None
    ) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank; the values by rank. ``timeout``: the group's ``timeout`` option."""
        return self.submit(fn, args, kwargs).result(timeout)

    def _finish(self, future: WorkerFuture, timeout: Optional[float]) -> List[Any]:
        """Wait for ``future``'s ranks; the values, or restart in place / tear down, and raise."""
        return _finish_call(self, future, timeout)

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
        with self._lock:  # never waits on a restart: it holds the lock only between its steps
            first, self._closed = not self._closed, True
            self._phase = GroupPhase.SHUTTING_DOWN
            self._changed.notify_all()
        if self._watcher is not None:
            self._watcher.stop()  # kept: what it saw explains the failure
        if getattr(self, "_diagnostics", None) is not None:
            self._diagnostics.stop()
        members = self._members
        if members is not None and connected_session() == self._session:
            release(members, graceful and first)
            release_state(self._state_name, owned=self._owns_state)  # save_state's copies, when this group made them
        self._hooks.stop()
        if members is not None and members.output is not None:
            members.output.close()
            members.output = None
        with self._lock:
            self._phase = GroupPhase.CLOSED

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


def _finish_call(group: WorkerGroup, future: WorkerFuture, timeout: Optional[float]) -> List[Any]:
    """Wait for ``future``'s ranks; the values, or restart in place / tear down, and raise."""
    group._check_session()
    group_left = None if future.deadline is None else max(0.0, future.deadline - time.monotonic())
    limit = group_left if timeout is None else timeout if group_left is None else min(timeout, group_left)
    try:
        waited = wait_for_ranks(future.refs, limit, group.workers, None, future.actors)
    except BaseException as error:  # KeyboardInterrupt included: leave nothing running
        try:
            forward_signal(group, error, future)
        finally:
            group.shutdown(graceful=False)
        if connected_session() != group._session:
            raise WorkerGroupClosed("Ray was shut down (ray.shutdown()) while this WorkerGroup's call ran") from error
        raise
    if waited.pending and not waited.failures and limit is not None and (group_left is None or limit < group_left):
        raise TimeoutError(f"call {future.number} had not finished after {limit:g} s; it is still running")
    grow_by = group._watcher.grow_by if group._watcher is not None else 0
    end = classify_end(
        waited.failures, waited.pending, cancelled=group._cancelled, closed=group._closed,
        grow_by=grow_by, drained_nodes=group.drained_nodes,
    )
    if end is CallEnd.FINISHED:
        output = group._members.output if group._members else None
        return output.settle(future.number, waited.results) if output is not None else waited.results
    ended = error_for(group, end, waited, limit or 0.0, grow_by)
    ended.end = ended.end or end
    abort_state(group._state_name, group.restart_count)  # no rank waits on a step a dead rank never saves
    if not _restart_in_place(group, ended, future, waited):
        _stop_then_settle(group, future.number, waited)
    raise ended


def _restart_in_place(group: WorkerGroup, error: RaydistError, future: WorkerFuture, waited: Waited) -> bool:
    """Warm restarts: keep the survivors and replace the rest when the
    restart policy says so (see ``restart_group``); False: tear down instead."""
    members = group._members
    if not group.config.warm_restarts or members is None or members.request.node_layout:
        return False  # (a node layout restarts whole)
    return restart_group(group, error, future, waited, _watch)


def _stop_then_settle(group: WorkerGroup, number: int, waited: Waited) -> None:
    """Kill the group first (peers stuck in a collective need not wait),
    then wait for the failed call's output: its markers are already in the files."""
    members = group._members
    output = members.output if members else None
    if members is not None:
        members.output = None
    group.shutdown(graceful=False)
    if output is not None:
        # A rank whose value could not come back marked only what it printed: not waited for.
        output.settle(number, waited.results, [f.rank for f in waited.failures if not f.crashed and f.rank not in waited.unsent])
        output.close()


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
        if not request.node_layout:  # bundles of a lost node that Ray re-placed after a warm shrink: the group holds them
            seats = {w.actor_index for w in members.workers} | members.spares.bundles()
            more += len(free_seats(members.pg, seats))
        return min(sizes[1] - len(members.workers), more) if sizes else 0

    growable = config.restart_to_grow and sizes is not None and len(members.workers) < sizes[1]
    return GroupWatcher(members.workers, warn, stop, room if growable else None, config.monitor_interval).start()
