"""Start-up of a worker group, one step at a time.

reserve (a placement group) -> create (one actor per bundle) -> describe
(round trip 1: where did each land?) -> assign ranks (pure, from where they
landed) -> set up (round trip 2: launcher environment + initialization).
``GroupBuilder`` owns everything it made until the group is complete: a
failure or an interrupt at any step releases all of it before it propagates.
"""

from __future__ import annotations

import os

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from raydist.config import RunConfig
from raydist.core.accelerators import Accelerator
from raydist.errors import InfeasibleResourcesError, WorkerGroupError, WorkerStartupTimeout
from raydist.pool.cluster.placement import alive_nodes, reserve
from raydist.pool.driver.agents import NodeAgents, driver_node, explain_deaths
from raydist.pool.driver.hooks import GroupHooks
from raydist.pool.driver.log_files import RunLogs
from raydist.pool.driver.output import GroupOutput, OutputRouter
from raydist.pool.driver.seats import new_worker
from raydist.pool.driver.spares import Spare, SparePool
from raydist.pool.driver.waiting import wait_for_ranks
from raydist.pool.progress import progress
from raydist.pool.records import CallEnd, Placement, WorkerInfo, WorkerSpec
from raydist.pool.rules.layout import assign_ranks, node_layout_broken, worker_env
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
from raydist.pool.worker.script import TRACEBACK_TO_STDERR_VAR

if TYPE_CHECKING:
    from raydist.core.initialize import DistInfo

# How long a graceful shutdown waits for workers to leave the process group.
TEARDOWN_TIMEOUT_S = 5.0


@dataclass
class Members:
    """What a group holds on the cluster, from the first step on."""

    accelerator: Accelerator
    bundle: Dict[str, float]  # one worker's resources
    request: Request  # what the group asked of the cluster (bundles, nodes allowed)
    pg: Optional[PlacementGroup]  # None once released
    spares: SparePool  # empty unless spare_workers
    actors: List[Any] = field(default_factory=list)  # by rank once ranks are assigned
    workers: List[WorkerInfo] = field(default_factory=list)  # by rank
    contexts: List[Optional["DistInfo"]] = field(default_factory=list)
    agents: NodeAgents = field(default_factory=lambda: NodeAgents(None))
    output: Optional[GroupOutput] = None
    routes: List[RankRoute] = field(default_factory=list)  # by rank: where its output goes

    def held_resources(self) -> Dict[str, Dict[str, float]]:
        """What the workers and spares hold on each node (node id -> amounts)."""
        held: Dict[str, Dict[str, float]] = {}
        nodes = [w.node_id for w in self.workers] + [s.placement.node_id for s in self.spares.ready]
        for node_id in nodes:
            amounts = held.setdefault(node_id, {})
            for name, amount in self.bundle.items():
                amounts[name] = amounts.get(name, 0.0) + amount
        return held


def release(members: Members, graceful: bool) -> None:
    """Leave the process group (if ``graceful``), kill the actors and spares,
    free the placement group, remove the workers' evidence files, kill the
    node agents; returns once Ray reports them dead."""
    spares = members.spares.close()
    actors = [actor for actor in members.actors if actor is not None]
    try:
        if graceful and actors:
            try:
                ray.get([actor.teardown.remote() for actor in actors], timeout=TEARDOWN_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the actors are killed below regardless
                pass
    finally:  # an interrupt during the graceful part must not leave the actors alive
        for actor in [*actors, *spares]:
            ray.kill(actor, no_restart=True)
        if members.pg is not None:
            remove_placement_group(members.pg)
        members.actors, members.pg = [], None
        _wait_dead([*actors, *spares])
        try:  # the processes are gone: what they left on their nodes goes too
            members.agents.ask(members.workers, range(len(members.workers)), "remove", timeout=TEARDOWN_TIMEOUT_S, start_missing=False)
        finally:
            agents = members.agents.forget()
            for agent in agents:
                ray.kill(agent, no_restart=True)
            _wait_dead(agents)


def _wait_dead(actors: List[Any]) -> None:
    """Until Ray reports ``actors`` dead (a call on a killed actor fails once it knows)."""
    if actors:
        pings = [actor.ping.remote() for actor in actors]
        ray.wait(pings, num_returns=len(pings), timeout=TEARDOWN_TIMEOUT_S)


class GroupBuilder:
    """Builds one group's members step by step; see the module docstring."""

    def __init__(
        self,
        config: RunConfig,
        hooks: GroupHooks,
        logs: RunLogs,
        router: Optional[OutputRouter],
        restart_count: int = 0,
        node_order: Sequence[str] = (),
        extra_env: Optional[Dict[str, str]] = None,
    ):
        self.config = config
        self._extra_env = dict(extra_env or {})  # for every rank (the debug relay's address)
        self._hooks = hooks
        self._logs = logs
        self._router = router
        self.restart_count = restart_count  # the attempt being built (a warm restart raises it)
        self._node_order = tuple(node_order)
        self._master_ports: Set[int] = set()  # every attempt's MASTER_PORT: a warm restart takes a new one

    def build(self) -> Members:
        """The started group's members; on any failure everything made so far is released."""
        members = self._reserve()
        try:
            actors = self.create(members, range(len(members.actors)))
            placements = self.describe(members, actors, range(len(actors)))
            ranked, standby = _split_spares(placements, self.config.spare_workers, self._node_order)
            self.assign(members, {p.index: a for p, a in zip(placements, actors)}, ranked, standby)
            members.spares.adopt([Spare(actors[p.index], p) for p in standby], ranked)
            self.set_up(members, placements[members.workers[0].actor_index].free_port)
            # Off the start path: the other nodes' agents start while the first call runs.
            members.agents.start([worker.node_id for worker in members.workers])
            return members
        except BaseException:  # KeyboardInterrupt included: leave nothing running
            self.abandon(members)
            raise

    def abandon(self, members: Members) -> None:
        """Release a half-built group: actors, agents, placement group, the backend's driver side, output."""
        if ray.is_initialized():
            release(members, graceful=False)
        self._hooks.stop()
        if members.output is not None:
            members.output.close()
            members.output = None

    def _reserve(self) -> Members:
        config = self.config
        selection = NodeSelection.of(config)
        nodes = selection.matching(alive_nodes()) if selection.active else alive_nodes()
        accelerator = resolve_accelerator(config.accelerator, config.resources_per_worker, nodes)
        bundle = worker_bundle(accelerator, config.resources_per_worker, config.accelerator_type)
        sizes = config.worker_range
        if sizes is None:
            count = default_num_workers(accelerator, bundle, nodes) - config.spare_workers  # spares take their share
            if count < 1:
                chosen = f" ({selection_text(selection, alive_nodes())})" if selection.active else ""
                raise InfeasibleResourcesError(
                    f"num_workers=None means one worker per {accelerator.ray_resource}, "
                    f"but the cluster has none ({accelerator.name} workers of {bundle}){chosen}"
                )
            sizes = (count, count)
        spares = config.spare_workers
        request = placement_request(config, bundle, sizes, spares)
        pg, size = reserve(request, config.startup_timeout)
        pool = SparePool(spares, pg, bundle, accelerator, config.startup_timeout)
        members = Members(accelerator, bundle, request, pg, pool, agents=NodeAgents(driver_node()))
        members.actors = [None] * (size * request.per_bundle)
        return members

    def create(self, members: Members, slots: Sequence[int]) -> List[Any]:
        """A new worker actor in each of ``slots`` (held in ``members.actors``
        until ranks are known); slot i sits in bundle i // per_bundle (under
        the node layout, ``per_bundle`` workers share each node's bundle)."""
        per_bundle, resource = members.request.per_bundle, members.accelerator.ray_resource
        actors = [new_worker(members.pg, slot, members.bundle, resource, per_bundle) for slot in slots]
        members.actors = [*[a for a in members.actors if a is not None], *actors]
        return actors

    def describe(self, members: Members, actors: Sequence[Any], slots: Sequence[int]) -> List[Placement]:
        """Round trip 1: where each worker landed (node, devices, a free port)."""
        used = frozenset(self._master_ports)
        return self._await(members, [actor.describe.remote(i, used) for actor, i in zip(actors, slots)], "started")

    def assign(self, members: Members, actors: Dict[int, Any], placements: List[Placement], standby: Sequence[Placement] = ()) -> None:
        """Ranks from where the workers landed (``actors`` by slot); this attempt's output."""
        members.workers = assign_ranks(placements, ray.get_runtime_context().get_node_id(), self._node_order, standby)
        if members.request.node_layout:
            broken = node_layout_broken(members.workers, members.request.per_bundle)
            if broken:  # Ray placed a bundle's workers apart: the promise of the layout would be a lie
                raise RuntimeError(f"the placement broke the node layout: {broken}")
        members.actors = [actors[w.actor_index] for w in members.workers]  # now indexed by rank
        members.routes = self._logs.attempt(self.restart_count, members.workers)
        members.output = GroupOutput(members.workers, members.routes, self._router)

    def set_up(self, members: Members, master_port: int) -> None:
        """Round trip 2: each rank's launcher environment, then initialization, on all ranks at once."""
        self._master_ports.add(master_port)
        specs = self._specs(members, master_port)
        members.contexts = self._await(members, [a.setup.remote(s) for a, s in zip(members.actors, specs)], "initialised")

    def restart(self, node_order: Sequence[str]) -> None:
        """The next attempt: its number, the node order to keep, and the backend's driver side anew."""
        self.restart_count += 1
        self._node_order = tuple(node_order)
        self._hooks.stop()

    def _specs(self, members: Members, master_port: int) -> List[WorkerSpec]:
        """Each rank's spec: torchrun's variables, the node's visible devices
        and this worker's device index, the backend's variables (its driver
        side starts here), the output markers, then the user's ``env``."""
        workers, config = members.workers, self.config
        extra = self._hooks.start(workers)
        output_env = members.output.worker_env() if members.output is not None else {}
        init_kwargs = self._hooks.init_kwargs()
        return [
            WorkerSpec(
                worker=worker,
                env=worker_env(
                    worker,
                    master_addr=workers[0].node_ip,
                    master_port=master_port,
                    run_id=self._logs.run_id,
                    restart_count=self.restart_count,
                    config=config,
                    accelerator=members.accelerator,
                    cpus=members.bundle.get("CPU", 1),
                    extra={**self._extra_env, **backend_env, **output_env, **self._output_env(members, worker)},
                    error_file=self._error_file(members, worker),
                ),
                config=config,
                device_type=members.accelerator.device_type,
                init_kwargs=init_kwargs,
                backend_entry=self._hooks.entry,
            )
            for worker, backend_env in zip(workers, extra)
        ]

    @staticmethod
    def _error_file(members: Members, worker: WorkerInfo) -> Optional[str]:
        """The rank's error.json in its attempt directory, as torchrun puts it,
        when that directory is on the rank's machine (the driver's node)."""
        route = members.routes[worker.rank] if worker.rank < len(members.routes) else None
        if route is None or route.directory is None or worker.node_id != members.agents.local_node:
            return None
        return os.path.join(route.directory, "error.json")

    @staticmethod
    def _output_env(members: Members, worker: WorkerInfo) -> Dict[str, str]:
        route = members.routes[worker.rank] if worker.rank < len(members.routes) else None
        return {TRACEBACK_TO_STDERR_VAR: "1"} if route is not None and route.stderr.file else {}

    def _await(self, members: Members, refs: List[ray.ObjectRef], stage: str) -> List[Any]:
        """Wait for one start-up step on every worker, with progress if it is slow."""
        timeout = self.config.startup_timeout
        with progress(len(refs), f"raydist: workers {stage}") as bar:
            waited = wait_for_ranks(refs, timeout, members.workers, bar)
        if waited.failures:
            failures = explain_deaths(waited.failures, members.workers, members.agents)
            error = WorkerGroupError(failures)
            error.end = classify_end(failures, waited.pending)
            raise error
        if waited.pending:
            timed_out = WorkerStartupTimeout(timeout, stage, len(refs), _still_starting(members.workers, waited.pending, stage))
            timed_out.end = CallEnd.TIMED_OUT
            raise timed_out
        return waited.results


def _still_starting(workers: Sequence[WorkerInfo], indices: List[int], stage: str) -> List[str]:
    """Who is still starting: ranks with their node once ranks are known."""
    if stage == "started" or not workers:
        return [f"worker {i} (not yet reported where it runs)" for i in indices]
    return [f"rank {i} (node {workers[i].node_id[:12]}, {workers[i].node_ip})" for i in indices]


def _split_spares(placements: List[Placement], spares: int, node_order: Sequence[str]) -> "tuple[List[Placement], List[Placement]]":
    """(ranked workers, spares): the spares are the workers rank order puts
    last, so they sit on the nodes after the driver's, on the highest device
    ids (LOCAL_RANK keeps matching the device where it did)."""
    if not spares:
        return placements, []
    order = assign_ranks(placements, ray.get_runtime_context().get_node_id(), node_order)
    last = {w.actor_index for w in order[len(order) - spares:]}
    return [p for p in placements if p.index not in last], [p for p in placements if p.index in last]
