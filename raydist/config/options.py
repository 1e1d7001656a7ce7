"""``RunConfig``: the options of one run, one field per option.

Each field is declared from its ``Option`` record (default, check, flag with
its help, meaning), kept in the module of its family: ``placement``,
``process``, ``lifecycle``, ``logs``. Here: the field list, the checks that
read several options together, and what is derived from the fields.
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple, Union

from raydist.config import lifecycle as life
from raydist.config import logs, placement, process
from raydist.config.flags import CliFlag
from raydist.config.logs import StdSpec
from raydist.config.option import option_of
from raydist.config.values import type_name
from raydist.core.accelerators import BY_NAME, DEVICE_RESOURCES
from raydist.core.backend import TORCH_BACKEND, backend_entry


@dataclass(frozen=True)
class RunConfig:
    """The options of one run. Built once (every option checked in
    ``__post_init__``), never changed; ``replace`` makes a checked copy."""

    num_workers: Union[int, Tuple[int, int], None] = placement.NUM_WORKERS.field()
    num_nodes: Union[int, Tuple[int, int], None] = placement.NUM_NODES.field()
    workers_per_node: Optional[int] = placement.WORKERS_PER_NODE.field()
    accelerator: str = placement.ACCELERATOR.field()
    resources_per_worker: Mapping[str, float] = placement.RESOURCES_PER_WORKER.field()
    backend: Optional[str] = process.BACKEND.field()
    env: Mapping[str, str] = process.ENV.field()
    placement_strategy: Optional[str] = placement.PLACEMENT_STRATEGY.field()
    timeout: Optional[float] = life.TIMEOUT.field()
    hang_timeout: Optional[float] = life.HANG_TIMEOUT.field()
    straggler_action: str = life.STRAGGLER_ACTION.field()
    straggler_threshold: float = life.STRAGGLER_THRESHOLD.field()
    straggler_windows: int = life.STRAGGLER_WINDOWS.field()
    health_check: str = life.HEALTH_CHECK.field()
    health_threshold: float = life.HEALTH_THRESHOLD.field()
    startup_timeout: float = life.STARTUP_TIMEOUT.field()
    max_restarts: int = life.MAX_RESTARTS.field()
    retry_on_exception: bool = life.RETRY_ON_EXCEPTION.field()
    address: Optional[str] = placement.ADDRESS.field()
    init_process_group: bool = process.INIT_PROCESS_GROUP.field()
    object_store_threshold: Optional[int] = process.OBJECT_STORE_THRESHOLD.field()
    pg_timeout: Optional[float] = process.PG_TIMEOUT.field()
    log_dir: Optional[str] = logs.LOG_DIR.field()
    redirects: StdSpec = logs.REDIRECTS.field()
    tee: StdSpec = logs.TEE.field()
    local_ranks_filter: Optional[Tuple[int, ...]] = logs.LOCAL_RANKS_FILTER.field()
    log_line_prefix_template: Optional[str] = logs.LOG_LINE_PREFIX_TEMPLATE.field()
    restart_to_grow: bool = life.RESTART_TO_GROW.field()
    preemption_signal: Optional[str] = life.PREEMPTION_SIGNAL.field()
    label_selector: Mapping[str, str] = placement.LABEL_SELECTOR.field()
    accelerator_type: Optional[str] = placement.ACCELERATOR_TYPE.field()
    exclude_nodes: Tuple[str, ...] = placement.EXCLUDE_NODES.field()
    numa_binding: Optional[str] = process.NUMA_BINDING.field()
    virtual_local_rank: bool = process.VIRTUAL_LOCAL_RANK.field()
    role: str = process.ROLE.field()
    monitor_interval: float = life.MONITOR_INTERVAL.field()
    flight_recorder: bool = process.FLIGHT_RECORDER.field()
    post_mortem: bool = process.POST_MORTEM.field()
    signals_to_handle: Tuple[str, ...] = life.SIGNALS_TO_HANDLE.field()
    shutdown_timeout: float = life.SHUTDOWN_TIMEOUT.field()
    restart_mode: str = life.RESTART_MODE.field()
    spare_workers: int = life.SPARE_WORKERS.field()
    run_ahead: bool = life.RUN_AHEAD.field()
    survivor_timeout: float = life.SURVIVOR_TIMEOUT.field()
    state_dir: Optional[str] = life.STATE_DIR.field()
    state_keep: int = life.STATE_KEEP.field()
    state_overhead: Optional[float] = life.STATE_OVERHEAD.field()
    timeline: Optional[str] = logs.TIMELINE.field()

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # each option alone, normalised in place (frozen)
            object.__setattr__(self, field.name, option_of(field).check(field.name, getattr(self, field.name)))
        _check_combinations(self)

    @property
    def warm_restarts(self) -> bool:
        return self.restart_mode == "warm"

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, tuple) or isinstance(self.num_nodes, tuple)

    @property
    def strategy(self) -> str:
        """The placement strategy the run uses: the node layout's under ``num_nodes``."""
        if self.num_nodes is not None:
            return "STRICT_SPREAD"
        return self.placement_strategy or placement.DEFAULT_PLACEMENT_STRATEGY

    @property
    def node_range(self) -> Optional[Tuple[int, int]]:
        """(min, max) nodes of ``workers_per_node`` each; None without ``num_nodes``."""
        if self.num_nodes is None:
            return None
        return self.num_nodes if isinstance(self.num_nodes, tuple) else (self.num_nodes, self.num_nodes)

    @property
    def worker_range(self) -> Optional[Tuple[int, int]]:
        """(min, max) workers; None when the size comes from the cluster."""
        nodes = self.node_range
        if nodes is not None:
            per_node = self.workers_per_node or 1
            return nodes[0] * per_node, nodes[1] * per_node
        if self.num_workers is None:
            return None
        return self.num_workers if isinstance(self.num_workers, tuple) else (self.num_workers, self.num_workers)

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with ``changes`` applied (and checked)."""
        return dataclasses.replace(self, **changes)


def _options_doc() -> str:
    """The class docstring's option list, read off the records."""
    lines = [f"{RunConfig.__doc__}\n"]
    for field in dataclasses.fields(RunConfig):
        lines.append(textwrap.fill(f"{field.name}: {option_of(field).doc}", 76, initial_indent="    ", subsequent_indent="        "))
    return "\n".join(lines)


RunConfig.__doc__ = _options_doc()


def _check_combinations(config: RunConfig) -> None:
    """The checks that read several options, once each has passed its own."""
    _check_devices(config)
    _check_backend(config)
    if config.restart_to_grow and not config.elastic:
        raise ValueError(f"restart_to_grow needs an elastic size: {placement.ELASTIC_SIZE}")
    _check_layout(config)
    _check_node_selection(config)
    _check_spares(config)
    if config.hang_timeout is not None and not config.flight_recorder:
        raise ValueError("hang_timeout needs torch's flight recorder, which is switched off: it is what says which ranks did not arrive")
    if config.straggler_action == "replace":
        if not config.flight_recorder:
            raise ValueError(
                "straggler_action='replace' needs torch's flight recorder, which is switched off: it is what names a straggler"
            )
        if not config.spare_workers:
            raise ValueError("straggler_action='replace' puts a spare in a straggler's place: it needs spare_workers >= 1")


def _check_devices(config: RunConfig) -> None:
    resources = config.resources_per_worker
    if config.accelerator == "cpu":
        asked = [name for name in DEVICE_RESOURCES if resources.get(name, 0) > 0]
        if asked:
            raise ValueError(f"resources_per_worker asks for {asked[0]} but accelerator='cpu'")
        if resources and not any(resources.values()) and resources.get("CPU", 1) == 0:
            raise ValueError("resources_per_worker leaves a CPU worker with no resources at all")
    elif config.accelerator != "auto":
        resource = BY_NAME[config.accelerator].ray_resource or "CPU"
        if resources.get(resource, 1) == 0:
            raise ValueError(f"resources_per_worker sets {resource} to 0 but accelerator={config.accelerator!r} needs it")


def _check_backend(config: RunConfig) -> None:
    if config.backend is None or backend_entry(config.backend).name != TORCH_BACKEND:
        return  # another backend (horovod, a plugin) is always initialised, on any device
    if "nccl" in process.torch_backend_parts(config.backend) and config.accelerator == "cpu":
        raise ValueError(f"backend {config.backend!r} needs CUDA devices but accelerator='cpu'; use backend='gloo'")
    if not config.init_process_group:  # the name says what init_process_group would use
        raise ValueError(f"backend={config.backend!r} has no effect with init_process_group=False")


def _check_layout(config: RunConfig) -> None:
    """num_nodes x workers_per_node: torchrun's layout, which excludes num_workers."""
    if config.num_nodes is not None:
        if config.num_workers is not None:
            raise ValueError("num_workers and num_nodes exclude each other: with num_nodes the world is num_nodes x workers_per_node")
        if config.workers_per_node is None:
            raise ValueError("num_nodes needs workers_per_node (the workers on each node)")
        if config.placement_strategy is not None:
            raise ValueError(
                f"placement_strategy={config.placement_strategy!r} does not apply with num_nodes, which places "
                "one bundle per node on distinct nodes (STRICT_SPREAD)"
            )
    elif config.workers_per_node is not None:
        raise ValueError("workers_per_node needs num_nodes (how many nodes get that many workers)")


def _check_node_selection(config: RunConfig) -> None:
    if config.accelerator_type is not None and config.accelerator == "cpu":
        raise ValueError("accelerator_type names a device type but accelerator='cpu'")
    if config.exclude_nodes and placement.NODE_ID_LABEL in config.label_selector:
        raise ValueError(f"label_selector names {placement.NODE_ID_LABEL!r} and exclude_nodes is set: use one of them")


def _check_spares(config: RunConfig) -> None:
    if config.spare_workers and not config.warm_restarts:
        raise ValueError("spare_workers take dead ranks' places in warm restarts: they need restart_mode='warm'")
    if config.run_ahead and not config.warm_restarts:
        raise ValueError("run_ahead readies the processes of a warm restart: it needs restart_mode='warm'")
    if config.spare_workers and config.num_nodes is not None:
        raise ValueError(
            "spare_workers with num_nodes: a spare would have to be a whole node of workers_per_node "
            "workers to keep torchrun's layout; use num_workers with spares, or num_nodes without"
        )


OPTION_NAMES: Tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunConfig))


def cli_options() -> Tuple[Tuple["dataclasses.Field[Any]", CliFlag], ...]:
    """The flags table: every RunConfig field ``raydist run`` sets, with its flag, in field order."""
    flagged = ((field, option_of(field).flag) for field in dataclasses.fields(RunConfig))
    return tuple((field, cli_flag) for field, cli_flag in flagged if cli_flag is not None)


def make_config(config: Optional[RunConfig], options: Mapping[str, Any]) -> RunConfig:
    """``config`` (or the defaults) with keyword ``options`` applied; TypeError for unknown names."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"unexpected option(s) {', '.join(map(repr, unknown))}; valid: {', '.join(OPTION_NAMES)}")
    if config is not None and not isinstance(config, RunConfig):
        raise TypeError(f"config must be a raydist.RunConfig, not {type_name(config)}")
    return (config or RunConfig()).replace(**options) if options or config is None else config
