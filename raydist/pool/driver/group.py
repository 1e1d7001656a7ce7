"""WorkerGroup: a pool of workers, one per rank, with a live process group.

The group holds its cluster resources (``startup.Holdings``, reached through
the cluster seam: ``raydist.pool.cluster.seam``), the current attempt's
``World`` (ranks, output, watchers: replaced whole by a warm restart) and
its phase (``lifecycle.Lifecycle``). Calls are one round trip, sent to every
rank under the phase's short lock, so calls from several threads run in the
same order on every rank and their collectives cannot pair across calls.
How a call ended is classified once (``classify_end``) and decided on once
(``decide_restart``); any ending but success either restarts the group in
place or tears it down, then raises."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from raydist.config import RunConfig, make_config
from raydist.errors import WorkerGroupClosed
from raydist.pool.cluster.seam import Cluster, Pending
from raydist.pool.driver.agents import explain_deaths
from raydist.pool.driver.calls import CallHooks, KeptCall, WorkerFuture, error_for, forward_signal, prepare_call, send_call
from raydist.pool.driver.datasets import CallData, WorldSplit, check_datasets, split_for_world
from raydist.pool.driver.hooks import GroupHooks, group_hooks
from raydist.pool.driver.lifecycle import Lifecycle, weak_stopper
from raydist.pool.driver.log_files import RunLogs
from raydist.pool.driver.output import router_for
from raydist.pool.driver.restart import RestartAborted, restart_in_place
from raydist.pool.driver.startup import GroupBuilder, Holdings, RunAttempt
from raydist.pool.driver.state import RunState
from raydist.pool.driver.waiting import Waited, wait_for_ranks
from raydist.pool.driver.world import Attachment, World
from raydist.pool.records import CallEnd, GroupPhase, Placement, WorkerInfo
from raydist.pool.rules.datasets import DataConfig
from raydist.pool.rules.policy import Decision, classify_end, decide_restart, restart_line
from raydist.pool.rules.stragglers import Straggler

if TYPE_CHECKING:  # the driver never needs torch: a run's start-up stays light
    from raydist.core.initialize import DistInfo

__all__ = ["WorkerFuture", "WorkerGroup", "WorkerInfo"]

logger = logging.getLogger("raydist")


class WorkerGroup:
    """A pool of workers, one per rank, kept alive across calls.

    ``WorkerGroup(4, backend="gloo")`` or ``WorkerGroup(config=RunConfig(...))``:
    the keyword options are ``raydist.RunConfig``'s fields; ``cluster``: where the
    workers run (default: Ray). Use as a context manager; ``run`` and ``submit``
    execute a function on every rank with torch.distributed initialised, from any
    number of threads. A failure a warm restart answers still raises (its
    ``restarted_in_place`` True), with the dead ranks already replaced in place."""

    # Set by _open_group.
    config: RunConfig
    _state: RunState
    _hooks: GroupHooks
    _life: Lifecycle
    _calls: int
    _last_call: KeptCall = None  # the call the current world's ranks keep (send_call)
    _holdings: Optional[Holdings]
    _world: Optional[World]
    _restarts_used: int
    _cluster: Cluster
    _session: Optional[str]
    _builder: GroupBuilder

    def __init__(
        self,
        num_workers: Optional[int] = None,
        *,
        config: Optional[RunConfig] = None,
        cluster: Optional[Cluster] = None,
        attempt: Optional[RunAttempt] = None,
        **options: Any,
    ):
        if num_workers is not None:
            options["num_workers"] = num_workers
        _open_group(self, cluster or _ray_cluster(), make_config(config, options), attempt or RunAttempt())

    # -- what the group is -------------------------------------------------

    @property
    def workers(self) -> List[WorkerInfo]:
        """Each rank's placement: rank, local rank, node rank, node id/IP, pid, devices."""
        return list(self._world.workers) if self._world else []

    @property
    def contexts(self) -> List[Optional["DistInfo"]]:
        """Each rank's initialization record (None where the process group was left to the code)."""
        return list(self._world.contexts) if self._world else []

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def phase(self) -> GroupPhase:
        return self._life.phase

    @property
    def closed(self) -> bool:
        return self._life.closing

    @property
    def restart_count(self) -> int:
        """The attempt the group runs (TORCHELASTIC_RESTART_COUNT); a warm restart raises it."""
        return self._world.attempt if self._world else self._builder.restart_count

    @property
    def restarts_used(self) -> int:
        """Restarts of this run counted against max_restarts, warm ones included."""
        return self._restarts_used

    @property
    def spares(self) -> List[Placement]:
        """Where each ready spare worker runs (node, pid, devices); not in the world."""
        return [spare.placement for spare in self._holdings.spares.ready] if self._holdings else []

    @property
    def held_resources(self) -> Dict[str, Dict[str, float]]:
        """What the group's workers and spares hold on each node (node id -> amounts)."""
        return self._holdings.held_resources(self.workers) if self._holdings else {}

    @property
    def node_order(self) -> List[str]:
        """The group's node ids in node-rank order."""
        return list(dict.fromkeys(worker.node_id for worker in self.workers))

    @property
    def drained_nodes(self) -> Dict[str, float]:
        """Nodes of this group that Ray started draining, with their deadlines."""
        return dict(self._world.drained) if self._world else {}

    # -- calls -------------------------------------------------------------

    def submit(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None,
        datasets: Optional[Mapping[str, Any]] = None,
        dataset_config: Optional[DataConfig] = None,
    ) -> WorkerFuture:
        """Start ``fn(*args, **kwargs)`` on every rank; returns at once. ``datasets``, ``dataset_config``: as in ``raydist.run``."""
        return self.submit_prepared(prepare_call(self._cluster, fn, args, kwargs), check_datasets(datasets, dataset_config))

    def submit_prepared(self, call: bytes, data: Optional[CallData] = None) -> WorkerFuture:
        """Start a call made by ``prepare_call`` on every rank (``data``: its datasets, split for this world)."""
        world, refs, number, split = _send_call(self, call, data)
        deadline = None if self.config.timeout is None else self._cluster.monotonic() + self.config.timeout
        hooks = CallHooks(partial(_finish_call, self), self._check_session, partial(self._stop, CallEnd.CANCELLED), self._cluster)
        return WorkerFuture(hooks, world, refs, number, deadline, split)

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        datasets: Optional[Mapping[str, Any]] = None,
        dataset_config: Optional[DataConfig] = None,
    ) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank; the values by rank. ``timeout``: the group's ``timeout`` option."""
        return self.submit(fn, args, kwargs, datasets, dataset_config).result(timeout)

    def stacks(self) -> str:
        """Where every rank is now: Python stacks grouped by location, the odd
        ones out marked, and where each rank is in its collectives (from the
        flight recorders: which rank did not enter the collective the others
        wait in, or entered another). The group keeps running."""
        self._check_usable()
        assert self._world is not None
        return self._world.where_ranks_are()

    def stragglers(self, refresh: bool = False) -> List[Straggler]:
        """The ranks that reach collectives consistently later than the others
        (over the last collectives the flight recorders hold), as of the last
        look (every 0.5 s; ``refresh``: look now); [] on an even run or with
        ``flight_recorder=False``."""
        if refresh:
            self._check_usable()
        return self._world.stragglers(refresh) if self._world else []

    def attach(self, name: str, thing: Attachment) -> None:
        """Keep ``thing`` with the group's current world: stopped when that world
        ends (the next warm restart, or the shutdown), as its watchers are."""
        with self._life.lock:
            if self._world is None or self._world.ended:
                raise RuntimeError("this WorkerGroup has no running world to attach to")
            self._world = self._world.attach(name, thing)

    def _check_usable(self) -> None:
        self._check_session()
        if self.closed:
            raise RuntimeError("this WorkerGroup has been shut down")

    def _check_session(self) -> None:
        if self._cluster.session() != self._session:
            raise RuntimeError(
                "the Ray this WorkerGroup was started in has been shut down (ray.shutdown()); its workers are gone: start a new WorkerGroup"
            )

    # -- teardown ----------------------------------------------------------

    def shutdown(self, graceful: bool = True) -> None:
        """Leave the process group (if ``graceful``), kill the actors, free the placement group.

        Returns when the actors are dead. Safe to call more than once and
        from any thread; a call after an interrupted one finishes its work.
        Never starts a Ray (after ``ray.shutdown()`` the workers are gone with it).
        """
        self._stop(CallEnd.SHUT_DOWN, graceful)

    def _stop(self, cause: CallEnd, graceful: bool = False, settle: Optional[Tuple[int, Waited]] = None) -> None:
        """Shut down for ``cause``; ``settle``: a failed call's output to wait for once the ranks are dead."""
        first = self._life.stop(cause)  # never waits on a restart: it holds the lock only between its steps
        world, holdings = self._world, self._holdings
        if world is not None:
            world.stop_watching()  # kept: what it saw explains the failure
        if holdings is not None and self._cluster.session() == self._session:
            holdings.release(graceful and first)
            self._state.release(self._cluster)  # after the ranks: the last step they saved is written out first
        self._hooks.stop()
        if world is not None:
            # A rank whose value could not come back marked only what it printed: not waited for.
            number, waited = settle if settle is not None else (None, Waited([]))
            failed = [f.rank for f in waited.failures if not f.crashed and f.rank not in waited.unsent]
            world.close_output(number, waited.results, failed)
        self._life.close()

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown(graceful=exc_info[0] is None)

    def __del__(self) -> None:  # a group dropped without shutdown() is freed when collected
        if getattr(self, "_holdings", None) is not None and not self.closed:
            try:
                self.shutdown(graceful=False)
            except Exception:  # noqa: BLE001 - best effort at interpreter or collection time
                pass


def _open_group(group: WorkerGroup, cluster: Cluster, config: RunConfig, attempt: RunAttempt) -> None:
    """The group's first world on ``cluster`` (the constructor's work; the run controller will own it)."""
    group.config = config
    group._state = RunState.of(attempt.state_name)  # save_state's copies: the run's, or this group's own
    group._hooks = group_hooks(config)  # a missing backend library fails here, before Ray
    group._life = Lifecycle()
    group._calls = 0
    group._holdings = None
    group._world = None
    group._restarts_used = attempt.restarts_used  # restarts counted against max_restarts, this run's
    cluster.connect(config.address, config.startup_timeout)
    group._cluster, group._session = cluster, cluster.session()
    group._builder = GroupBuilder(
        cluster,
        config,
        group._hooks,
        attempt.logs or RunLogs(config),
        router_for(config, cluster),
        weak_stopper(group._stop, CallEnd.GROW),  # held weakly: a group dropped without shutdown() is freed
        attempt.number,
        attempt.node_order,
        group._state.env(config, cluster),
    )
    try:
        group._holdings = group._builder.reserve()  # held at once: a shutdown() from another thread releases it
        world = group._builder.build(group._holdings)
    except BaseException:  # the builder released what it made; the group is closed, never started
        group._life.stop(CallEnd.SHUT_DOWN)
        group._life.close()
        raise
    with group._life.lock:
        group._world = world
        if group._life.phase is GroupPhase.STARTING:
            group._life.move(GroupPhase.RUNNING)
            return
    world.end()  # shut down while it started: its resources went with the shutdown
    raise WorkerGroupClosed("this WorkerGroup was shut down while it started")


def _ray_cluster() -> Cluster:
    """The Ray this process connects to (imported here: the engine itself imports without Ray)."""
    from raydist.pool.cluster.ray_cluster import RayCluster

    return RayCluster()


def _send_call(group: WorkerGroup, call: bytes, data: Optional[CallData]) -> Tuple[World, List[Pending], int, Optional[WorldSplit]]:
    """Send ``call`` to the current world's ranks: its world, refs, number and dataset split."""
    with group._life.lock:
        # A call sent during a warm restart runs in the new world (or raises once the group is shut down).
        group._life.changed.wait_for(lambda: group._life.phase is not GroupPhase.RESTARTING)
        group._check_usable()
        split = split_for_world(group._cluster, group._world, data, lambda: group.held_resources, group.attach)  # queued before the call
        world = group._world
        assert world is not None
        # One lock around the sends: every rank queues calls in the same order.
        refs, group._last_call = send_call(group._cluster, world, call, group._last_call)
        number, group._calls = group._calls, group._calls + 1
    return world, refs, number, split


def _finish_call(group: WorkerGroup, future: WorkerFuture, timeout: Optional[float]) -> List[Any]:
    """Wait for ``future``'s ranks; the values, or restart in place / tear down, and raise."""
    group._check_session()
    world = future.world
    group_left = None if future.deadline is None else max(0.0, future.deadline - group._cluster.monotonic())
    limit = group_left if timeout is None else timeout if group_left is None else min(timeout, group_left)
    try:
        waited = wait_for_ranks(group._cluster, future.refs, limit, world.workers, None, future.actors)
    except BaseException as error:  # KeyboardInterrupt included: leave nothing running
        try:
            forward_signal(group._cluster, world, error, future, group.config.shutdown_timeout)
        finally:
            group.shutdown(graceful=False)
        if group._cluster.session() != group._session:
            raise WorkerGroupClosed("Ray was shut down (ray.shutdown()) while this WorkerGroup's call ran") from error
        raise
    if waited.pending and not waited.failures and limit is not None and (group_left is None or limit < group_left):
        raise TimeoutError(f"call {future.number} had not finished after {limit:g} s; it is still running")
    future.release_split()  # readers left in the split's epoch barrier fail now, not after survivor_timeout
    stopped, failures = group._life.stopped, waited.failures
    if stopped is None and any(f.crashed for f in failures):  # read on their nodes: a death may be a lost node
        failures = explain_deaths(failures, world.workers, world.agents)
    end = classify_end(failures, waited.pending, stopped=stopped, drained_nodes=world.drained)
    if end is CallEnd.FINISHED:
        return world.settle_output(future.number, waited.results)
    ended = error_for(end, world, waited, failures, group.config.timeout or 0.0)  # a timeout says the one set, not the time left
    group._state.abort(group._cluster, world.attempt)  # no rank waits on a step a dead rank never saves
    decision = decide_restart(
        ended,
        retry_on_exception=group.config.retry_on_exception,
        restarts_left=group.config.max_restarts - group._restarts_used,
        driver_node=group._cluster.driver_node(),
    )
    ended.decision = decision  # the runner acts on it: one decision per failure
    if _restart_in_place(group, future, waited, decision):
        ended.note_restarted_in_place(group.restart_count)
    else:
        group._stop(CallEnd.SHUT_DOWN, settle=(future.number, waited))  # peers stuck in a collective need not wait
    raise ended


def _restart_in_place(group: WorkerGroup, future: WorkerFuture, waited: Waited, decision: Decision) -> bool:
    """Warm restarts: keep the survivors and replace the rest when the
    restart policy says so (see ``restart_in_place``); False: tear down instead."""
    config, life, holdings = group.config, group._life, group._holdings
    if decision.restart is None or decision.restart.kind == "scale-up" or not config.warm_restarts:
        return False  # growing needs a larger placement group: a fresh start
    if holdings is None or holdings.request.node_layout:
        return False  # (a node layout restarts whole)
    with life.lock:  # only the newest call restarts (a newer one is queued behind it on the old actors)
        old = group._world  # the call's world, with whatever was attached to it since
        if life.phase is not GroupPhase.RUNNING or future.number != group._calls - 1 or old is None or old.attempt != future.world.attempt:
            return False
        life.move(GroupPhase.RESTARTING)

    def live() -> None:  # between the restart's steps: a shutdown that began wins
        if life.phase is not GroupPhase.RESTARTING:
            raise RestartAborted("the group was shut down during its warm restart")

    try:  # the slow waits run without the lock: shutdown() and cancel() never wait on them
        world, done = restart_in_place(group._builder, holdings, old, future.refs, waited, future.number, config, live)
    except RestartAborted:
        return False  # the caller's teardown releases what the restart made
    except Exception as failure:  # noqa: BLE001 - then the group is torn down, as a fresh restart would
        logger.error("raydist: warm restart failed (%s: %s); stopping the group", type(failure).__name__, failure)
        return False
    except BaseException:  # interrupted (Ctrl-C): no call may wait on a world that never comes
        group.shutdown(graceful=False)
        raise
    with life.lock:
        if life.phase is not GroupPhase.RESTARTING:
            world.end()
            return False
        group._world = world
        group._restarts_used += int(decision.restart.counted)
        life.move(GroupPhase.RUNNING)
    logger.warning(restart_line(decision.restart, old.size, world.attempt, config.max_restarts, group._restarts_used))
    logger.warning(done)
    return True
