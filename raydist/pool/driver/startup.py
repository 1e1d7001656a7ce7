"""Start-up of a worker group, one step at a time.

reserve (a placement group) -> create (one actor per bundle) -> describe
(round trip 1: where did each land?) -> assign ranks (pure, from where they
landed) -> set up (round trip 2: launcher environment + initialization).
``GroupBuilder`` owns everything it made until the group is complete: a
failure or an interrupt at any step releases all of it before it propagates.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Set, Tuple

from raydist.config import RunConfig
from raydist.core.accelerators import Accelerator
from raydist.core.backend import TORCH_BACKEND
from raydist.errors import InfeasibleResourcesError, UnhealthyWorkers, WorkerGroupError, WorkerStartupTimeout
from raydist.pool.cluster.seam import Cluster, Pending, Reservation, Worker
from raydist.pool.driver.agents import NodeAgents, explain_deaths
from raydist.pool.driver.attempt import Attempt
from raydist.pool.driver.debug_relay import DebugRelay
from raydist.pool.driver.hooks import GroupHooks
from raydist.pool.driver.log_files import RunLogs
from raydist.pool.driver.output import GroupOutput, OutputRouter
from raydist.pool.driver.preflight import PreFlight
from raydist.pool.driver.seats import free_seats
from raydist.pool.driver.spares import Spare, SparePool
from raydist.pool.driver.stragglers import HangSeen, SlowSeen, StragglerWatch
from raydist.pool.driver.summary import RunSummary
from raydist.pool.driver.timeline_events import world_ready
from raydist.pool.driver.waiting import STARTUP_FAILURE_GRACE_S, wait_for_ranks
from raydist.pool.driver.watcher import GroupWatcher
from raydist.pool.progress import progress
from raydist.pool.records import CallEnd, Placement, WorkerInfo, WorkerSpec
from raydist.pool.rules.health import health_mode, split_healthy
from raydist.pool.rules.layout import assign_ranks, backend_for_devices, node_layout_broken, pinning_envs, worker_env
from raydist.pool.rules.logs import RankRoute
from raydist.pool.rules.policy import classify_end
from raydist.pool.rules.sizing import (
    NodeSelection,
    Request,
    default_num_workers,
    placement_request,
    resolve_accelerator,
    selection_text,
    worker_bundle,
)
from raydist.pool.timeline import ENV_VAR as TIMELINE_ENV
from raydist.pool.timeline import Timeline
from raydist.pool.worker.script import TRACEBACK_TO_STDERR_VAR

logger = logging.getLogger("raydist")

# How long a graceful shutdown waits for workers to leave the process group.
TEARDOWN_TIMEOUT_S = 5.0
GROW_PLACE_S = 10.0  # how long a growth waits to be placed at the size whose room it saw
POLL_END_S = 2.0  # a run's end waits this long at most for its polls under way (each ends within a slice of its stop)


@dataclass
class Holdings:
    """What a group holds on the cluster across its worlds, from the first step on."""

    cluster: Cluster
    accelerator: Accelerator
    bundle: Dict[str, float]  # one worker's resources
    request: Request  # what the group asked of the cluster (bundles, nodes allowed)
    pg: Optional[Reservation]  # None once released
    spares: SparePool  # empty unless spare_workers
    agents: NodeAgents
    actors: List[Worker] = field(default_factory=list)  # every worker held (any order): released with the group
    slots: int = 0  # worker places in the placement group (bundles x workers per bundle)

    def held_resources(self, workers: Sequence[WorkerInfo]) -> Dict[str, Dict[str, float]]:
        """What ``workers`` and the spares hold on each node (node id -> amounts)."""
        held: Dict[str, Dict[str, float]] = {}
        nodes = [w.node_id for w in workers] + [s.placement.node_id for s in self.spares.ready]
        for node_id in nodes:
            amounts = held.setdefault(node_id, {})
            for name, amount in self.bundle.items():
                amounts[name] = amounts.get(name, 0.0) + amount
        return held

    def forget(self, actors: Sequence[Worker]) -> None:
        """``actors`` (killed by a warm restart) are no longer held."""
        gone = {id(actor) for actor in actors}
        self.actors = [actor for actor in self.actors if id(actor) not in gone]

    def release(self, graceful: bool) -> None:
        """Leave the process group (if ``graceful``), kill the workers and
        spares, free the placement, remove the files of every process the
        group started, kill the node agents; returns once the cluster reports them dead."""
        cluster, spares, actors = self.cluster, self.spares.close(), list(self.actors)
        try:
            if graceful and actors:
                try:
                    cluster.get([cluster.call(actor, "teardown") for actor in actors], timeout=TEARDOWN_TIMEOUT_S)
                except Exception:  # noqa: BLE001 - the workers are killed below regardless
                    pass
        finally:  # an interrupt during the graceful part must not leave the workers alive
            for actor in [*actors, *spares]:
                cluster.kill(actor)
            if self.pg is not None:
                cluster.free(self.pg)
            self.actors, self.pg = [], None
            _wait_dead(cluster, [*actors, *spares])
            try:  # the processes are gone: what they left on their nodes goes too (spares' and earlier worlds' included)
                self.agents.remove_files(timeout=TEARDOWN_TIMEOUT_S)
            finally:
                agents = self.agents.forget()
                for agent in agents:
                    cluster.kill(agent)
                _wait_dead(cluster, agents)
                self.spares.wait_closed(POLL_END_S)  # a spare being started makes no cluster call after


def _wait_dead(cluster: Cluster, actors: List[Worker]) -> None:
    """Until the cluster reports ``actors`` dead (a call on a killed worker fails once it knows)."""
    if actors:
        pings = [cluster.call(actor, "ping") for actor in actors]
        cluster.wait(pings, num_returns=len(pings), timeout=TEARDOWN_TIMEOUT_S)


def _shared_device_backend(hooks: GroupHooks, holdings: Holdings, workers: Sequence[WorkerInfo]) -> Optional[Dict[str, Any]]:
    """The backend's init arguments, with torch.distributed's backend fit for
    ranks that share a device (gloo for the device's default; nccl refused)."""
    init_kwargs = hooks.init_kwargs()
    if init_kwargs is None or getattr(hooks.entry, "name", None) != TORCH_BACKEND:
        return init_kwargs
    return {**init_kwargs, "backend": backend_for_devices(init_kwargs.get("backend"), holdings.accelerator, workers)}


class GroupBuilder:
    """Builds one group's holdings, then each ``Attempt``; see the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        config: RunConfig,
        hooks: GroupHooks,
        logs: RunLogs,
        router: Optional[OutputRouter],
        stop_group: Callable[[], None],
        node_order: Sequence[str] = (),
        extra_env: Optional[Mapping[str, str]] = None,
        stopping: Callable[[], bool] = lambda: False,
        hang_seen: Optional[HangSeen] = None,
        slow_seen: Optional[SlowSeen] = None,
    ):
        self.config = config
        self._cluster = cluster
        self.timeline = Timeline(config.timeline, cluster.time)  # the run's, every attempt in it: each world records into it
        self.summary = RunSummary()  # the run's, too
        on = {TIMELINE_ENV: "1"} if self.timeline.on else {}
        self._extra_env = {**(extra_env or {}), **on}  # the run's variables for every rank (its training state, the timeline)
        self._hooks = hooks
        self._logs = logs
        self._router = router
        self._stop_group = stop_group  # what the drain watcher calls to stop the group to grow
        self._hang_seen = hang_seen  # what the straggler watch calls when ranks hang (with hang_timeout)
        self._slow_seen = slow_seen  # ... and when a straggler stays late (with straggler_action="replace")
        self._stopping = stopping  # whether the run was asked to stop: a start-up wait gives way
        self._node_order = tuple(node_order)
        self._grow_to: Optional[int] = None  # a growth's size, for the next reservation (``restart``)
        self._master_ports: Set[int] = set()  # every attempt's MASTER_PORT: a warm restart takes a new one
        self._excluded: Set[str] = set()  # nodes that host no new rank or spare for the rest of the run
        self._excluded_lock = threading.Lock()  # the loop excludes, and so does a spare's check in the background
        self._health = PreFlight(
            cluster, config.health_check, config.health_threshold, self.summary, self.timeline, self._await
        )  # its probes and their figures

    @property
    def excluded(self) -> FrozenSet[str]:
        with self._excluded_lock:
            return frozenset(self._excluded)

    def exclude(self, node_id: str) -> None:
        """``node_id`` hosts no new rank, replacement or spare from now on (an
        unhealthy node, a straggler's), in this placement and every later one."""
        with self._excluded_lock:
            self._excluded.add(node_id)

    def build(self, holdings: Holdings, number: int) -> Attempt:
        """Attempt ``number`` on new ``holdings`` (from ``reserve``); on
        any failure everything made so far is released."""
        try:
            actors = self.create(holdings, range(holdings.slots))
            placements = self.describe(holdings, actors, range(len(actors)))
            placements, spares = self._preflight(holdings, actors, placements)
            ranked, standby = _split_spares(placements, spares, self._cluster.driver_node(), self._node_order)
            holdings.spares.adopt([Spare(actors[p.index], p) for p in standby], ranked)
            attempt = self.attempt(holdings, {p.index: actors[p.index] for p in placements}, ranked, number, standby)
            world_ready(attempt)
            # Off the start path: the other nodes' agents start while the first call runs.
            holdings.agents.start([worker.node_id for worker in attempt.workers] + [spare.node_id for spare in standby])
            return attempt
        except BaseException:  # KeyboardInterrupt included: leave nothing running
            self.abandon(holdings)
            raise

    def _preflight(self, holdings: Holdings, actors: Sequence[Worker], placements: List[Placement]) -> Tuple[List[Placement], int]:
        """The health check of a new group's workers (spares included): the
        workers that stay and how many of them are spares. An unhealthy
        worker's node is excluded and its workers killed; spares fill in, an
        elastic world shrinks; with too few left, UnhealthyWorkers (the run
        places its workers again, without the excluded nodes)."""
        config, spares = self.config, self.config.spare_workers
        mode = health_mode(config.health_check, holdings.accelerator)
        if mode is None:
            return placements, spares
        checked = self._health.probe(holdings.accelerator, holdings.bundle, [actors[p.index] for p in placements], placements, mode)
        if checked is None:
            return placements, spares
        probed, verdict = checked
        world = len(placements) - spares
        minimum = config.worker_range[0] if config.worker_range else world
        kept, spares, why = split_healthy(probed, verdict, world, min(minimum, world))
        for node in verdict.nodes:
            self.exclude(node)
        if why is not None:
            raise UnhealthyWorkers(f"health check: {why}")
        gone = [actors[p.index] for p in placements if p.index not in kept]
        for actor in gone:
            self._cluster.kill(actor)
        holdings.forget(gone)
        return [p for p in placements if p.index in kept], spares

    def check_new(self, holdings: Holdings, actors: Sequence[Worker], placements: Sequence[Placement], every: Sequence[Placement]) -> None:
        """The health check of workers that join a running group (``every``: all
        the world's placements, for the devices each node shows): UnhealthyWorkers,
        their nodes excluded, when one is below the run's first check's median."""
        envs = pinning_envs(placements, every, holdings.accelerator)
        self._check_new(holdings.accelerator, holdings.bundle, actors, placements, envs)

    def _check_new(
        self,
        accelerator: Accelerator,
        bundle: Mapping[str, float],
        actors: Sequence[Worker],
        placements: Sequence[Placement],
        envs: Sequence[Mapping[str, str]],
    ) -> None:
        mode = health_mode(self.config.health_check, accelerator)
        if mode is None or not actors:
            return
        checked = self._health.probe(accelerator, bundle, actors, placements, mode, envs)
        if checked is not None and checked[1].unhealthy:
            verdict = checked[1]
            for node in verdict.nodes:
                self.exclude(node)
            raise UnhealthyWorkers(f"health check: {verdict.text()}")

    def _spare_healthy(
        self, accelerator: Accelerator, bundle: Mapping[str, float], actor: Worker, placement: Placement, env: Mapping[str, str]
    ) -> bool:
        """A spare started in the background (stood by with ``env``) passes the health check (its node excluded if not)."""
        try:
            self._check_new(accelerator, bundle, [actor], [placement], [env])
        except UnhealthyWorkers:
            return False
        return True

    def abandon(self, holdings: Holdings) -> None:
        """Release a half-built group: actors, agents, placement group, the backend's driver side."""
        if self._cluster.session() is not None:
            holdings.release(graceful=False)
        self._hooks.stop()

    def reserve(self) -> Holdings:
        """The placement group for the group's workers and spares."""
        config, cluster = self.config, self._cluster
        alive = cluster.alive_nodes()
        excluded = sorted(self.excluded)  # an earlier attempt's unhealthy nodes, a replaced straggler's
        nodes = selection.matching(alive) if (selection := NodeSelection.of(config, excluded)).active else alive
        accelerator = resolve_accelerator(config.accelerator, config.resources_per_worker, nodes)
        bundle = worker_bundle(accelerator, config.resources_per_worker, config.accelerator_type)
        sizes = config.worker_range
        if sizes is None:
            count = default_num_workers(accelerator, bundle, nodes) - config.spare_workers  # spares take their share
            if count < 1:
                chosen = f" ({selection_text(selection, alive)})" if selection.active else ""
                raise InfeasibleResourcesError(
                    f"num_workers=None means one worker per {accelerator.ray_resource}, "
                    f"but the cluster has none ({accelerator.name} workers of {bundle}){chosen}"
                )
            sizes = (count, count)
        spares = config.spare_workers
        request = placement_request(config, bundle, sizes, spares, excluded)
        asked = cluster.time()
        grown, self._grow_to = self._grow_to, None
        growing = grown is not None and not request.node_layout and sizes[0] < grown <= sizes[1]
        pg, size = self._reserve_grown(request, grown) if growing and grown is not None else (None, 0)
        if pg is None:
            pg, size = cluster.reserve(request, config.startup_timeout, self._stopping)
        self.timeline.span("waiting for placement", "placement", asked, cluster.time(), workers=size * request.per_bundle)
        agents = NodeAgents(cluster, cluster.driver_node())
        checked = health_mode(config.health_check, accelerator) is not None
        pool = SparePool(
            cluster,
            spares,
            pg,
            bundle,
            accelerator,
            config.startup_timeout,
            placed=agents.note,
            healthy=partial(self._spare_healthy, accelerator, bundle) if checked else None,
        )
        return Holdings(cluster, accelerator, bundle, request, pg, pool, agents=agents, slots=size * request.per_bundle)

    def create(self, holdings: Holdings, slots: Sequence[int]) -> List[Worker]:
        """A new worker actor in each of ``slots`` (held in ``holdings`` from
        now on); slot i sits in bundle i // per_bundle (under the node layout,
        ``per_bundle`` workers share each node's bundle)."""
        per_bundle, resource = holdings.request.per_bundle, holdings.accelerator.ray_resource
        actors = [self._cluster.start_worker(holdings.pg, slot, holdings.bundle, resource, per_bundle) for slot in slots]
        holdings.actors.extend(actors)
        return actors

    def describe(self, holdings: Holdings, actors: Sequence[Worker], slots: Sequence[int]) -> List[Placement]:
        """Round trip 1: where each worker landed (node, devices, a free port); their files noted for removal."""
        used = frozenset(self._master_ports)
        calls = [self._cluster.call(actor, "describe", i, used) for actor, i in zip(actors, slots)]
        placements: List[Placement] = self._await((), calls, "started")
        holdings.agents.note(placements)
        return placements

    def attempt(
        self, holdings: Holdings, actors: Dict[int, Worker], placements: List[Placement], number: int, standby: Sequence[Placement] = ()
    ) -> Attempt:
        """Attempt ``number`` from where its workers landed (``actors`` by
        slot): ranks, output, round trip 2 (set up), then its watchers started."""
        workers = assign_ranks(placements, self._cluster.driver_node(), self._node_order, standby)
        if holdings.request.node_layout:
            broken = node_layout_broken(workers, holdings.request.per_bundle)
            if broken:  # Ray placed a bundle's workers apart: the promise of the layout would be a lie
                raise InfeasibleResourcesError(f"the placement broke the node layout: {broken}")
        routes = tuple(self._logs.attempt(number, workers))
        output, relay = GroupOutput(workers, routes, self._router), DebugRelay(self._cluster.driver_ip())
        ranked = tuple(actors[w.actor_index] for w in workers)
        try:
            master_port = next(p.free_port for p in placements if p.index == workers[0].actor_index)
            contexts = self._set_up(holdings, ranked, workers, routes, output, relay, number, master_port)
            mode = health_mode(self.config.health_check, holdings.accelerator)
            if mode is not None and all(context is not None for context in contexts):  # raydist's process group
                self._health.collective(ranked, workers, mode, partial(self._await, agents=holdings.agents))
        except BaseException:
            relay.stop()
            output.close()
            raise
        config = self.config
        attempt = Attempt(
            number, ranked, workers, contexts, routes, output, holdings.agents, relay, self.timeline, self.summary, config.flight_recorder
        )
        attempt.start(*watchers(config, holdings, attempt, self._stop_group, self._hang_seen, self._slow_seen, self.excluded))
        return attempt

    def _set_up(
        self,
        holdings: Holdings,
        actors: Sequence[Worker],
        workers: Sequence[WorkerInfo],
        routes: Sequence[RankRoute],
        output: GroupOutput,
        relay: DebugRelay,
        number: int,
        master_port: int,
    ) -> List[Any]:
        """Round trip 2: each rank's launcher environment, then initialization, on all ranks at once."""
        self._master_ports.add(master_port)
        shared = {**self._extra_env, **relay.env(), **output.worker_env()}
        specs = self._specs(holdings, workers, routes, shared, number, master_port)
        calls = [self._cluster.call(actor, "setup", spec) for actor, spec in zip(actors, specs)]
        return self._await(workers, calls, "initialised", holdings.agents)

    def restart(self, node_order: Sequence[str], grow_to: Optional[int] = None) -> None:
        """For the next attempt: the node order to keep, the backend's driver side
        anew, and for a growth the size the room was seen for (``grow_to``)."""
        self._node_order = tuple(node_order)
        self._grow_to = grow_to
        self._hooks.stop()

    def _reserve_grown(self, request: Request, size: int) -> Tuple[Any, int]:
        """A growth's placement at the size whose room was seen, for up to
        ``GROW_PLACE_S``: the old world's bundles just released may not show as
        free yet, and an elastic reservation would take what shows (a smaller
        world, grown again a moment later). (None, 0) where it does not come:
        the elastic range then takes what fits."""
        at_size = dataclasses.replace(request, sizes=(size + request.spares, request.sizes[1]))
        try:
            return self._cluster.reserve(at_size, GROW_PLACE_S, self._stopping)
        except InfeasibleResourcesError:
            return None, 0

    def _specs(
        self,
        holdings: Holdings,
        workers: Sequence[WorkerInfo],
        routes: Sequence[RankRoute],
        shared: Mapping[str, str],
        number: int,
        master_port: int,
    ) -> List[WorkerSpec]:
        """Each rank's spec: torchrun's variables, the node's visible devices
        and this worker's device index, the backend's variables (its driver
        side starts here), the output markers and the pdb relay (``shared``),
        then the user's ``env``."""
        config = self.config
        init_kwargs = _shared_device_backend(self._hooks, holdings, workers)  # before anything starts: it may refuse
        extra = self._hooks.start(workers)
        return [
            WorkerSpec(
                worker=worker,
                env=worker_env(
                    worker,
                    master_addr=workers[0].node_ip,
                    master_port=master_port,
                    run_id=self._logs.run_id,
                    restart_count=number,
                    config=config,
                    accelerator=holdings.accelerator,
                    cpus=holdings.bundle.get("CPU", 1),
                    extra={**shared, **backend_env, **_output_env(routes, worker)},
                    error_file=_error_file(holdings, routes, worker),
                ),
                config=config,
                device_type=holdings.accelerator.device_type,
                init_kwargs=init_kwargs,
                backend_entry=self._hooks.entry,
            )
            for worker, backend_env in zip(workers, extra)
        ]

    def _await(self, workers: Sequence[WorkerInfo], refs: List[Pending], stage: str, agents: Optional[NodeAgents] = None) -> List[Any]:
        """Wait for one start-up step on every worker, with progress if it is slow."""
        timeout = self.config.startup_timeout
        with progress(len(refs), f"raydist: workers {stage}") as bar:
            waited = wait_for_ranks(self._cluster, refs, timeout, workers, bar, grace=STARTUP_FAILURE_GRACE_S, stopping=self._stopping)
        if waited.failures:
            failures = explain_deaths(waited.failures, workers, agents) if agents is not None else waited.failures
            error = WorkerGroupError(failures)
            error.end = classify_end(failures, waited.pending)
            raise error
        if waited.pending:
            timed_out = WorkerStartupTimeout(timeout, stage, len(refs), _still_starting(workers, waited.pending, stage))
            timed_out.end = CallEnd.TIMED_OUT
            raise timed_out
        return waited.results


def _error_file(holdings: Holdings, routes: Sequence[RankRoute], worker: WorkerInfo) -> Optional[str]:
    """The rank's error.json in its attempt directory, as torchrun puts it,
    when that directory is on the rank's machine (the driver's node)."""
    route = routes[worker.rank] if worker.rank < len(routes) else None
    if route is None or route.directory is None or worker.node_id != holdings.agents.local_node:
        return None
    return os.path.join(route.directory, "error.json")


def _output_env(routes: Sequence[RankRoute], worker: WorkerInfo) -> Dict[str, str]:
    route = routes[worker.rank] if worker.rank < len(routes) else None
    return {TRACEBACK_TO_STDERR_VAR: "1"} if route is not None and route.stderr.file else {}


def watchers(
    config: RunConfig,
    holdings: Holdings,
    attempt: Attempt,
    stop_group: Callable[[], None],
    hang_seen: Optional[HangSeen] = None,
    slow_seen: Optional[SlowSeen] = None,
    excluded: FrozenSet[str] = frozenset(),
) -> Tuple[GroupWatcher, Optional[StragglerWatch]]:
    """``attempt``'s watchers, to start: drains (warn the ranks on a draining
    node; with restart_to_grow, stop the group to grow) and stragglers (with
    hang_timeout, hangs: ``hang_seen`` is told; with straggler_action="replace",
    lasting stragglers: ``slow_seen``); no growth onto an ``excluded`` node."""
    workers, request, sizes = attempt.workers, holdings.request, config.worker_range

    def warn(ranks: List[int], deadline: float) -> None:
        node = workers[ranks[0]].node_id if ranks else None
        attempt.timeline.instant(
            f"node {(node or '?')[:12]} draining", "node", attempt=attempt.number, node=node, deadline=deadline, ranks=ranks
        )
        attempt.agents.ask(workers, ranks, "preempt", deadline, config.preemption_signal, start_missing=False)

    def room() -> int:
        # Whole nodes under the node layout: never a second bundle on a node the group holds.
        taken = list(dict.fromkeys(w.node_id for w in workers)) if request.node_layout else []
        more = holdings.cluster.room_for(request, taken) * request.per_bundle
        if not request.node_layout:  # bundles of a lost node that Ray re-placed after a warm shrink: the group holds them
            seats = {w.actor_index for w in workers} | holdings.spares.bundles()
            more += len(free_seats(holdings.cluster, holdings.pg, seats, excluded))
        return min(sizes[1] - len(workers), more) if sizes else 0

    growable = config.restart_to_grow and sizes is not None and len(workers) < sizes[1]
    drains = GroupWatcher(workers, warn, stop_group, room if growable else None, config.monitor_interval, holdings.cluster)
    watch = (
        StragglerWatch(
            workers,
            attempt.agents,
            holdings.cluster,
            timeline=attempt.timeline,
            attempt=attempt.number,
            since=holdings.cluster.time(),
            hang_timeout=config.hang_timeout,
            on_hang=hang_seen if config.hang_timeout is not None else None,
            slow=(config.straggler_threshold, config.straggler_windows),
            on_slow=slow_seen if config.straggler_action == "replace" else None,
        )
        if config.flight_recorder
        else None
    )
    return drains, watch


def _still_starting(workers: Sequence[WorkerInfo], indices: List[int], stage: str) -> List[str]:
    """Who is still starting: ranks with their node once ranks are known."""
    if stage == "started" or not workers:
        return [f"worker {i} (not yet reported where it runs)" for i in indices]
    return [f"rank {i} (node {workers[i].node_id[:12]}, {workers[i].node_ip})" for i in indices]


def _split_spares(
    placements: List[Placement], spares: int, driver_node: Optional[str], node_order: Sequence[str]
) -> "tuple[List[Placement], List[Placement]]":
    """(ranked workers, spares): the spares are the workers rank order puts
    last, so they sit on the nodes after the driver's, on the highest device
    ids (LOCAL_RANK keeps matching the device where it did)."""
    if not spares:
        return placements, []
    order = assign_ranks(placements, driver_node, node_order)
    last = {w.actor_index for w in order[len(order) - spares :]}
    return [p for p in placements if p.index not in last], [p for p in placements if p.index in last]
