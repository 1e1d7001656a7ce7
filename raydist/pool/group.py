"""WorkerGroup: a pool of Ray actors, one per rank, with a live process group.

Start-up is two round trips: every actor reports where it landed (node,
device ids, a free port), the driver derives the ranks, then every actor
gets its launcher environment and initialises. Calls are then one round trip,
sent to every rank under one lock, so calls from several threads run in the
same order on every rank and their collectives cannot pair across calls.
Any failure tears the whole group down: peers stuck in a collective are
killed, not waited for.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import ray
import ray.cloudpickle
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from tqdm.auto import tqdm

from raydist.config import RunConfig, check_seconds, check_call, make_config
from raydist.core.accelerators import Accelerator
from raydist.pool.backend_hooks import GroupHooks, group_hooks
from raydist.pool.connect import connect, connected_session
from raydist.pool.diagnostics import ask_agents, explain_deaths, format_stacks, start_agents
from raydist.pool.elastic import GroupWatcher
from raydist.pool.errors import (
    InfeasibleResourcesError,
    WorkerCallCancelled,
    WorkerGroupError,
    WorkerGroupRestart,
    WorkerGroupTimeout,
    WorkerStartupTimeout,
)
from raydist.pool.layout import Placement, WorkerInfo, assign_ranks, worker_env
from raydist.pool.logs import RunLogs, wants_files
from raydist.pool.output import GroupOutput, OutputRouter
from raydist.pool.placement import alive_nodes, default_num_workers, reserve, resolve_accelerator, room_for, worker_bundle
from raydist.pool.waiting import wait_for_ranks
from raydist.pool.worker import RayWorker

if TYPE_CHECKING:  # the driver never needs torch: a run's start-up stays light
    from raydist.core.initialize import DistInfo

__all__ = ["WorkerGroup", "WorkerFuture", "WorkerInfo"]

# How long a graceful shutdown waits for workers to leave the process group.
TEARDOWN_TIMEOUT_S = 5.0
# Calls up to this size travel inside each actor task (no object-store round trip).
INLINE_CALL_BYTES = 64 * 1024
_RemoteWorker = ray.remote(RayWorker)


def pickle_call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> bytes:
    """Pickle a call once for all ranks; TypeError naming the part that fails."""
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
    """The pending result of ``WorkerGroup.submit``: one value per rank."""

    def __init__(self, group: "WorkerGroup", refs: List[ray.ObjectRef], actors: List[Any], timeout: Optional[float], call: int):
        self._group = group
        self._refs = refs
        self._actors = actors
        self._call = call  # the group's count of calls before this one
        self._timeout = timeout
        self._result: Optional[List[Any]] = None

    def done(self) -> bool:
        if self._result is not None:
            return True
        self._group._check_session()
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)

    def result(self, timeout: Optional[float] = None) -> List[Any]:
        """Values ordered by rank. Raises WorkerGroupError or WorkerGroupTimeout
        (tearing the group down) if a rank fails or the time runs out, and
        WorkerCallCancelled after ``cancel``."""
        if self._result is None:
            limit = self._timeout if timeout is None else check_seconds("timeout", timeout)
            self._result = self._group._collect(self._refs, limit, actors=self._actors, call=self._call)
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
        self._hooks: GroupHooks = group_hooks(self.config)  # a missing backend library fails here, before Ray
        self._restart_count = restart_count
        self._logs = logs or RunLogs(self.config)  # raydist.run shares one across attempts
        self._output: Optional[GroupOutput] = None
        self._calls = 0
        self._lock = threading.RLock()  # orders submissions; guards teardown
        self._actors: List[Any] = []
        self._workers: List[WorkerInfo] = []
        self._contexts: List[Optional["DistInfo"]] = []
        self._pg: Optional[PlacementGroup] = None
        self._closed = False
        self._cancelled = False  # closed by WorkerFuture.cancel
        self._agents: Dict[str, Any] = {}  # node id -> NodeAgent (diagnostics, preemption warnings)
        self._node_order = tuple(node_order)  # a restart keeps the surviving nodes' order
        self._bundle: Dict[str, float] = {}
        self._watcher: Optional[GroupWatcher] = None
        connect(self.config.address, startup_timeout=self.config.startup_timeout)
        self._session = connected_session()
        try:
            self._start()
        except BaseException:
            self.shutdown(graceful=False)
            raise

    # -- start-up -----------------------------------------------------------

    def _start(self) -> None:
        config = self.config
        router = OutputRouter.install()
        if router is None and (wants_files(config) or config.local_ranks_filter is not None):
            raise ValueError(
                "log_dir, redirects, tee and local_ranks_filter need Ray to forward worker output "
                "to this driver (ray.init(log_to_driver=True); not Ray Client)"
            )
        accelerator, bundle, num_workers = self._reserve()
        self._actors = [self._create_actor(accelerator, bundle, index) for index in range(num_workers)]
        # Round trip 1: where did each worker land?
        placements: List[Placement] = self._gather(
            [actor.describe.remote(i) for i, actor in enumerate(self._actors)], "started"
        )
        self._workers = assign_ranks(placements, ray.get_runtime_context().get_node_id(), self._node_order)
        self._agents = start_agents([w.node_id for w in self._workers])  # ready by the time they are needed
        self._actors = [self._actors[w.actor_index] for w in self._workers]  # now indexed by rank
        self._output = GroupOutput(self._workers, self._logs.attempt(self._restart_count, self._workers), router)
        # Round trip 2: environment + initialization, concurrently on all ranks.
        master_port = placements[self._workers[0].actor_index].free_port
        envs = self._worker_envs(accelerator, bundle, master_port)
        init_kwargs = self._init_kwargs(accelerator)
        threshold = config.object_store_threshold
        setups = [actor.setup.remote(w, env, init_kwargs, threshold) for w, actor, env in zip(self._workers, self._actors, envs)]
        self._contexts = self._gather(setups, "initialised")
        self._watcher = self._watch()

    def _reserve(self) -> Tuple[Accelerator, Dict[str, float], int]:
        """The workers' kind and bundle, and a placed placement group of as many as the run gets."""
        config = self.config
        nodes = alive_nodes()
        accelerator = resolve_accelerator(config.accelerator, config.resources_per_worker, nodes)
        self._bundle = bundle = worker_bundle(accelerator, config.resources_per_worker)
        sizes = config.worker_range
        if sizes is None:
            count = default_num_workers(accelerator, bundle, nodes)
            if count < 1:
                raise InfeasibleResourcesError(
                    f"num_workers=None means one worker per {accelerator.ray_resource}, "
                    f"but the cluster has none ({accelerator.name} workers of {bundle})"
                )
            sizes = (count, count)
        self._pg, num_workers = reserve(bundle, sizes, config.placement_strategy, config.startup_timeout)
        return accelerator, bundle, num_workers

    def _watch(self) -> GroupWatcher:
        """Warn ranks on draining nodes; with restart_to_grow, stop to grow."""
        sizes, config = self.config.worker_range, self.config

        def warn(ranks: List[int], deadline: float) -> None:
            ask_agents(self._agents, self._workers, ranks, "preempt", deadline, config.preemption_signal)

        def room() -> int:
            more = room_for(self._bundle, config.placement_strategy)
            return min(sizes[1] - len(self._workers), more) if sizes else 0  # type: ignore[index]

        growable = config.restart_to_grow and sizes is not None and len(self._workers) < sizes[1]
        return GroupWatcher(self._workers, warn, lambda: self.shutdown(graceful=False), room if growable else None).start()

    @property
    def held_resources(self) -> Dict[str, Dict[str, float]]:
        """What the group's workers hold on each node (node id -> amounts)."""
        held: Dict[str, Dict[str, float]] = {}
        for worker in self._workers:
            amounts = held.setdefault(worker.node_id, {})
            for name, amount in self._bundle.items():
                amounts[name] = amounts.get(name, 0.0) + amount
        return held

    @property
    def node_order(self) -> List[str]:
        """The group's node ids in node-rank order."""
        return list(dict.fromkeys(worker.node_id for worker in self._workers))

    @property
    def drained_nodes(self) -> Dict[str, float]:
        """Nodes of this group that Ray started draining, with their deadlines."""
        return dict(self._watcher.drained) if self._watcher is not None else {}

    def _create_actor(self, accelerator: Accelerator, bundle: Mapping[str, float], index: int) -> Any:
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        return _RemoteWorker.options(
            num_cpus=bundle.get("CPU", 0),
            num_gpus=bundle.get("GPU", 0),
            resources=custom,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=index),
        ).remote(accelerator.ray_resource)

    def _worker_envs(self, accelerator: Accelerator, bundle: Mapping[str, float], master_port: int) -> List[Dict[str, str]]:
        """Each rank's launcher environment: torchrun's variables, the node's
        visible devices and this worker's device index, the backend's
        variables (its driver side starts here), then the user's ``env``."""
        master = self._workers[0]
        extra = self._hooks.start(self._workers)
        output_env = self._output.worker_env() if self._output is not None else {}
        return [
            worker_env(
                worker,
                master_addr=master.node_ip,
                master_port=master_port,
                run_id=self._logs.run_id,
                restart_count=self._restart_count,
                config=self.config,
                accelerator=accelerator,
                cpus=bundle.get("CPU", 1),
                extra={**backend_env, **output_env},
            )
            for worker, backend_env in zip(self._workers, extra)
        ]

    def _init_kwargs(self, accelerator: Accelerator) -> Optional[Dict[str, Any]]:
        """What each worker passes to init_distributed (None: the code initialises itself)."""
        backend_kwargs = self._hooks.init_kwargs()
        if backend_kwargs is None:
            return None
        return {"device": accelerator.device_type, "timeout": self.config.pg_timeout, **backend_kwargs}

    def _gather(self, refs: List[ray.ObjectRef], stage: str) -> List[Any]:
        """Wait for a start-up step on every worker, with progress if it is slow."""
        with tqdm(total=len(refs), desc=f"raydist: workers {stage}", unit="worker", delay=5.0) as bar:
            return self._collect(refs, self.config.startup_timeout, progress=bar, stage=stage)

    # -- calls --------------------------------------------------------------

    @property
    def workers(self) -> List[WorkerInfo]:
        """Each rank's placement: rank, local rank, node rank, node id/IP, pid, devices."""
        return list(self._workers)

    @property
    def contexts(self) -> List[Optional["DistInfo"]]:
        """Each rank's initialization record (None where the process group was left to the code)."""
        return list(self._contexts)

    @property
    def num_workers(self) -> int:
        return len(self._workers)

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

    def submit(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None) -> WorkerFuture:
        """Start ``fn(*args, **kwargs)`` on every rank; returns at once."""
        args, kwargs = check_call(fn, args, kwargs)
        call: Any = pickle_call(fn, args, kwargs)
        with self._lock:
            self._check_usable()
            if len(call) > INLINE_CALL_BYTES:
                call = ray.put(call)  # big arguments: stored once, read by every rank
            # One lock around the sends: every rank queues calls in the same order.
            actors = list(self._actors)
            refs = [actor.execute.remote(call) for actor in actors]
            number, self._calls = self._calls, self._calls + 1
        return WorkerFuture(self, refs, actors, self.config.timeout, number)

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

    def _collect(
        self,
        refs: List[ray.ObjectRef],
        timeout: Optional[float],
        progress: Optional[tqdm] = None,
        stage: Optional[str] = None,
        actors: Optional[List[Any]] = None,
        call: Optional[int] = None,
    ) -> List[Any]:
        """Every rank's value (``refs`` is indexed by rank); on a failure or
        timeout, tear the group down and raise, saying why ranks died or
        where unfinished ranks were. After call number ``call``, first wait
        for the lines its ranks printed."""
        self._check_session()
        try:
            waited = wait_for_ranks(refs, timeout, self._workers, progress, actors)
        except BaseException as error:  # KeyboardInterrupt included: leave nothing running
            self.shutdown(graceful=False)
            if connected_session() != self._session:
                raise RuntimeError("Ray was shut down (ray.shutdown()) while this WorkerGroup's call ran") from error
            raise
        if waited.failures:
            # Read the dead ranks' evidence while their node agents still run.
            grow_by = self._watcher.grow_by if self._watcher is not None else 0
            stopped_here = self._cancelled or grow_by
            failures = waited.failures if stopped_here else explain_deaths(waited.failures, self._workers, self._agents)
            self._shutdown_then_settle(call, waited.results, [failure.rank for failure in waited.failures if not failure.crashed])
            if self._cancelled:
                raise WorkerCallCancelled("the call was cancelled (WorkerFuture.cancel()); its WorkerGroup was shut down")
            if grow_by:
                raise WorkerGroupRestart(f"the cluster has room for {grow_by} more worker(s)", len(self._workers))
            # Ranks on a drained node that failed: a preemption, not a fault of the code.
            drained = self.drained_nodes
            raise WorkerGroupError(failures, preempted_nodes=sorted({f.node_id for f in failures if f.node_id in drained}))
        if waited.pending:
            if stage is not None:
                self.shutdown(graceful=False)
                raise WorkerStartupTimeout(timeout or 0.0, stage, len(refs), self._pending_text(waited.pending, stage))
            stacks = self._stacks_of(waited.pending)
            self.shutdown(graceful=False)
            raise WorkerGroupTimeout(timeout or 0.0, waited.pending, stacks)
        return self._settle(call, waited.results)

    def _settle(self, call: Optional[int], results: List[Any]) -> List[Any]:
        if call is None or self._output is None:
            return results
        return self._output.settle(call, results)

    def _shutdown_then_settle(self, call: Optional[int], results: List[Any], failed_ranks: Sequence[int]) -> None:
        """Kill the group first (peers stuck in a collective need not wait),
        then wait for the failed call's output: its markers are already in the files."""
        with self._lock:
            output, self._output = self._output, None
        self.shutdown(graceful=False)
        if output is not None:
            if call is not None:
                output.settle(call, results, failed_ranks)
            output.close()

    def stacks(self) -> str:
        """Where every rank is now: Python stacks grouped by location, the odd
        ones out marked. The group keeps running."""
        self._check_usable()
        return self._stacks_of(range(len(self._workers)))

    def _stacks_of(self, ranks: Sequence[int]) -> str:
        found = ask_agents(self._agents, self._workers, list(ranks), "stacks")
        return format_stacks({rank: found.get(rank) for rank in ranks})  # type: ignore[misc]

    def _pending_text(self, indices: List[int], stage: str) -> List[str]:
        """Who is still starting: ranks with their node once ranks are known."""
        if stage == "started" or not self._workers:
            return [f"worker {i} (not yet reported where it runs)" for i in indices]
        return [f"rank {i} (node {self._workers[i].node_id[:12]}, {self._workers[i].node_ip})" for i in indices]

    # -- teardown -----------------------------------------------------------

    def shutdown(self, graceful: bool = True) -> None:
        """Leave the process group (if ``graceful``), kill the actors, free the placement group.

        Returns when the actors are dead. Safe to call more than once, and
        from any thread; never starts a Ray (after ``ray.shutdown()`` the
        workers are gone with it).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            actors, self._actors = self._actors, []
            pg, self._pg = self._pg, None
            output, self._output = self._output, None
            agents, self._agents = list(self._agents.values()), {}
        if self._watcher is not None:
            self._watcher.stop()  # kept: what it saw explains the failure
        if connected_session() == self._session:
            _stop_actors(actors, pg, graceful, agents)
        self._hooks.stop()
        if output is not None:
            output.close()

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown(graceful=exc_info[0] is None)

    def __del__(self) -> None:  # pragma: no cover - best effort when the user forgets
        if not getattr(self, "_closed", True):
            try:
                self.shutdown(graceful=False)
            except Exception:
                pass


def _stop_actors(actors: List[Any], pg: Optional[PlacementGroup], graceful: bool, agents: List[Any]) -> None:
    if graceful and actors:
        try:
            ray.get([actor.teardown.remote() for actor in actors], timeout=TEARDOWN_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the actors are killed below regardless
            pass
    for actor in [*actors, *agents]:
        ray.kill(actor, no_restart=True)
    if pg is not None:
        remove_placement_group(pg)
    if actors or agents:
        # A call on a killed actor fails once Ray knows it is dead.
        pings = [actor.ping.remote() for actor in [*actors, *agents]]
        ray.wait(pings, num_returns=len(pings), timeout=TEARDOWN_TIMEOUT_S)
