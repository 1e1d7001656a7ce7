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
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raydist.config import RunConfig
from raydist.core.accelerators import Accelerator
from raydist.errors import InfeasibleResourcesError, WorkerGroupError, WorkerStartupTimeout
from raydist.pool.cluster.placement import alive_nodes, reserve
from raydist.pool.driver.agents import NodeAgents, driver_node, explain_deaths
from raydist.pool.driver.hooks import GroupHooks
from raydist.pool.driver.log_files import RunLogs
from raydist.pool.driver.output import GroupOutput, OutputRouter
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
from raydist.pool.worker.actor import RayWorker
from raydist.pool.worker.script import TRACEBACK_TO_STDERR_VAR

if TYPE_CHECKING:
    from raydist.core.initialize import DistInfo

# How long a graceful shutdown waits for workers to leave the process group.
TEARDOWN_TIMEOUT_S = 5.0
_RemoteWorker = ray.remote(RayWorker)


@dataclass
class Members:
    """What a group holds on the cluster, from the first step on."""

    accelerator: Accelerator
    bundle: Dict[str, float]  # one worker's resources
    request: Request  # what the group asked of the cluster (bundles, nodes allowed)
    pg: Optional[PlacementGroup] = None
    actors: List[Any] = field(default_factory=list)  # by rank once ranks are assigned
    workers: List[WorkerInfo] = field(default_factory=list)  # by rank
    contexts: List[Optional["DistInfo"]] = field(default_factory=list)
    agents: NodeAgents = field(default_factory=lambda: NodeAgents(None))
    output: Optional[GroupOutput] = None
    routes: List[RankRoute] = field(default_factory=list)  # by rank: where its output goes

    def held_resources(self) -> Dict[str, Dict[str, float]]:
        """What the workers hold on each node (node id -> amounts)."""
        held: Dict[str, Dict[str, float]] = {}
        for worker in self.workers:
            amounts = held.setdefault(worker.node_id, {})
            for name, amount in self.bundle.items():
                amounts[name] = amounts.get(name, 0.0) + amount
        return held


def release(members: Members, graceful: bool) -> None:
    """Leave the process group (if ``graceful``), kill the actors, free the
    placement group, remove the workers' evidence files, kill the node
    agents; returns once Ray reports them dead."""
    actors = [actor for actor in members.actors if actor is not None]
    try:
        if graceful and actors:
            try:
                ray.get([actor.teardown.remote() for actor in actors], timeout=TEARDOWN_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the actors are killed below regardless
                pass
    finally:  # an interrupt during the graceful part must not leave the actors alive
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if members.pg is not None:
            remove_placement_group(members.pg)
        members.actors, members.pg = [], None
        _wait_dead(actors)
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
        self._restart_count = restart_count
        self._node_order = tuple(node_order)

    def build(self) -> Members:
        """The started group's members; on any failure everything made so far is released."""
        members = self._reserve()
        try:
            self._create(members)
            placements = self._describe(members)
            self._assign(members, placements)
            self._set_up(members, placements[members.workers[0].actor_index].free_port)
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
            count = default_num_workers(accelerator, bundle, nodes)
            if count < 1:
                chosen = f" ({selection_text(selection, alive_nodes())})" if selection.active else ""
                raise InfeasibleResourcesError(
                    f"num_workers=None means one worker per {accelerator.ray_resource}, "
                    f"but the cluster has none ({accelerator.name} workers of {bundle}){chosen}"
                )
            sizes = (count, count)
        request = placement_request(config, bundle, sizes)
        members = Members(accelerator, bundle, request, agents=NodeAgents(driver_node()))
        members.pg, size = reserve(request, config.startup_timeout)
        members.actors = [None] * (size * request.per_bundle)
        return members

    def _create(self, members: Members) -> None:
        """One actor per worker; under the node layout, ``per_bundle`` actors share each node's bundle."""
        bundle, pg, per_bundle = members.bundle, members.pg, members.request.per_bundle
        assert pg is not None, "reserved in the step before"
        # Ray takes its own resources as actor options; a bundle takes them all as amounts.
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
        memory = {"memory": bundle["memory"]} if bundle.get("memory") else {}
        for index in range(len(members.actors)):
            members.actors[index] = _RemoteWorker.options(
                num_cpus=bundle.get("CPU", 0),
                num_gpus=bundle.get("GPU", 0),
                resources=custom,
                **memory,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index // per_bundle),
            ).remote(members.accelerator.ray_resource)

    def _describe(self, members: Members) -> List[Placement]:
        """Round trip 1: where each worker landed (node, devices, a free port)."""
        return self._await(members, [actor.describe.remote(i) for i, actor in enumerate(members.actors)], "started")

    def _assign(self, members: Members, placements: List[Placement]) -> None:
        members.workers = assign_ranks(placements, ray.get_runtime_context().get_node_id(), self._node_order)
        if members.request.node_layout:
            broken = node_layout_broken(members.workers, members.request.per_bundle)
            if broken:  # Ray placed a bundle's workers apart: the promise of the layout would be a lie
                raise RuntimeError(f"the placement broke the node layout: {broken}")
        members.actors = [members.actors[w.actor_index] for w in members.workers]  # now indexed by rank
        members.routes = self._logs.attempt(self._restart_count, members.workers)
        members.output = GroupOutput(members.workers, members.routes, self._router)

    def _set_up(self, members: Members, master_port: int) -> None:
        """Round trip 2: each rank's launcher environment, then initialization, on all ranks at once."""
        specs = self._specs(members, master_port)
        members.contexts = self._await(members, [a.setup.remote(s) for a, s in zip(members.actors, specs)], "initialised")

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
                    restart_count=self._restart_count,
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
