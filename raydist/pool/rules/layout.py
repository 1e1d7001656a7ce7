"""Ranks that match the hardware, from where Ray actually placed each worker.

Pure functions (no Ray calls), so the rules are easy to read and test:

- nodes are told apart by node id (several raylets may share an IP), and the
  driver's node comes first;
- workers on a node are ordered by their lowest device id;
- every worker on a node sees the same visible-devices list: the union of
  the group's device ids on that node, each once, in id order;
- a worker's ``device_index`` is the position of its own first device in
  that list. When every worker holds exactly one whole device it equals the
  local rank (so torchrun scripts that use ``cuda:LOCAL_RANK`` keep
  working); with several devices per worker, or a device shared by several
  workers (fractional amounts), only ``device_index`` is right.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from raydist.config.process import torch_backend_parts
from raydist.core.accelerators import Accelerator
from raydist.core.environment import DEVICE_INDEX_VAR, USER_DEFAULT_VARS, torchrun_env
from raydist.core.preemption import PREEMPTION_FILE_VAR
from raydist.pool.records import Placement, WorkerInfo

# torch's flight recorder: this many entries per worker, unless the user set a size.
RECORDER_BUFFER_VAR = "TORCH_FR_BUFFER_SIZE"
RECORDER_ENTRIES = 64

if TYPE_CHECKING:
    from raydist.config import RunConfig


def _id_key(device_id: str) -> Tuple[int, object]:
    return (0, int(device_id)) if device_id.isdigit() else (1, device_id)


def _worker_key(placement: Placement) -> Tuple[object, ...]:
    ids = sorted(placement.accelerator_ids, key=_id_key)
    return (0, _id_key(ids[0]), placement.index) if ids else (1, (0, 0), placement.index)


def node_devices(placements: Sequence[Placement]) -> Dict[str, Tuple[str, ...]]:
    """Each node's visible devices: the union of its workers' ids, each once, in id order."""
    ids: Dict[str, set] = {}
    for placement in placements:
        ids.setdefault(placement.node_id, set()).update(placement.accelerator_ids)
    return {node: tuple(sorted(found, key=_id_key)) for node, found in ids.items()}


def assign_ranks(
    placements: Sequence[Placement],
    driver_node_id: Optional[str],
    node_order: Sequence[str] = (),
    standby: Sequence[Placement] = (),
) -> List[WorkerInfo]:
    """Give each placed worker its rank; the result is ordered by rank.

    ``node_order`` (a previous attempt's nodes, in order) keeps surviving
    nodes where they were: ranks move only when a node before them left.
    ``standby`` (spares) get no rank, but their devices count in their
    node's visible list, so that a spare can pin its device before it joins.
    """
    devices = node_devices([*placements, *standby])
    by_node: Dict[str, List[Placement]] = {}
    for placement in placements:
        by_node.setdefault(placement.node_id, []).append(placement)
    # Driver's node first; the rest in a stable order (first actor placed there).
    earlier = {node: position for position, node in enumerate(node_order)}
    ordered = sorted(
        by_node,
        key=lambda node: (earlier.get(node, len(earlier)), node != driver_node_id, min(p.index for p in by_node[node])),
    )
    workers: List[WorkerInfo] = []
    for node_rank, node_id in enumerate(ordered):
        members = sorted(by_node[node_id], key=_worker_key)
        visible = devices[node_id]
        for local_rank, member in enumerate(members):
            own = tuple(sorted(member.accelerator_ids, key=_id_key))
            workers.append(
                WorkerInfo(
                    rank=len(workers),
                    world_size=len(placements),
                    local_rank=local_rank,
                    local_world_size=len(members),
                    node_rank=node_rank,
                    num_nodes=len(ordered),
                    node_id=node_id,
                    node_ip=member.node_ip,
                    pid=member.pid,
                    device_ids=own,
                    visible_device_ids=visible,
                    device_index=visible.index(own[0]) if own else None,
                    actor_index=member.index,
                    evidence=member.evidence,
                    hostname=member.hostname,
                )
            )
    return workers


def node_layout_broken(workers: Sequence[WorkerInfo], per_node: int) -> Optional[str]:
    """What breaks torchrun's layout (exactly ``per_node`` ranks on each node,
    node g holding ranks g*P ... g*P+P-1), or None when it holds."""
    for worker in workers:
        expected = (worker.rank // per_node, worker.rank % per_node, per_node)
        if (worker.node_rank, worker.local_rank, worker.local_world_size) != expected:
            return (
                f"rank {worker.rank} is local rank {worker.local_rank} of {worker.local_world_size} on node "
                f"{worker.node_rank} ({worker.node_id[:12]}); expected local rank {expected[1]} of {per_node} on node {expected[0]}"
            )
    return None


# Backends whose communicator takes one rank per device: NCCL refuses a
# second rank of a group on a device another rank holds ("Duplicate GPU").
ONE_RANK_PER_DEVICE = frozenset({"nccl"})
SHARED_DEVICE_BACKEND = "gloo"  # shares a device: it moves tensors through the host


def shared_devices(workers: Sequence[WorkerInfo]) -> Dict[Tuple[str, str], List[int]]:
    """Each device (node id, device id) that two or more ranks hold (fractional
    amounts such as ``{"GPU": 0.5}``), with those ranks."""
    holders: Dict[Tuple[str, str], List[int]] = {}
    for worker in workers:
        for device in worker.device_ids:
            holders.setdefault((worker.node_id, device), []).append(worker.rank)
    return {device: ranks for device, ranks in holders.items() if len(ranks) > 1}


def backend_for_devices(asked: Optional[str], accelerator: Accelerator, workers: Sequence[WorkerInfo]) -> Optional[str]:
    """The torch.distributed backend the ranks initialise with: ``asked``
    (None: the device's default, chosen in each worker) unless ranks share a
    device and the backend takes one rank per device. Then the device's default
    becomes gloo, and a backend asked for by name is refused (ValueError)
    before any process group starts: NCCL would refuse it there."""
    shared = shared_devices(workers)
    if not shared:
        return asked
    if asked is None and accelerator.default_backend in ONE_RANK_PER_DEVICE:
        return SHARED_DEVICE_BACKEND
    if asked is None or not ONE_RANK_PER_DEVICE.intersection(torch_backend_parts(asked.lower())):
        return asked
    (node, device), ranks = next(iter(sorted(shared.items())))
    raise ValueError(
        f"backend {asked!r} takes one rank per device, but ranks {', '.join(map(str, ranks))} share "
        f"{accelerator.ray_resource or accelerator.name} {device} on node {node[:12]} ({len(shared)} shared device(s) in all): "
        f"use backend={SHARED_DEVICE_BACKEND!r} (or leave backend unset: it is chosen for shared devices), "
        "or give each worker a whole device"
    )


def standby_env(
    spare: Placement, standby: Sequence[Placement], placements: Sequence[Placement], accelerator: Accelerator
) -> Dict[str, str]:
    """A spare's device variables: its node's visible devices (workers and
    spares there) and its own device's position among them."""
    return _pinning_env(spare, node_devices([*placements, *standby]), accelerator)


def pinning_envs(chosen: Sequence[Placement], every: Sequence[Placement], accelerator: Accelerator) -> List[Dict[str, str]]:
    """``standby_env`` of each of ``chosen`` among ``every``, each node's devices read once."""
    devices = node_devices(every)
    return [_pinning_env(placement, devices, accelerator) for placement in chosen]


def _pinning_env(spare: Placement, devices: Mapping[str, Tuple[str, ...]], accelerator: Accelerator) -> Dict[str, str]:
    visible = devices.get(spare.node_id, ())
    env: Dict[str, str] = {}
    if accelerator.visible_devices_var is not None:
        env[accelerator.visible_devices_var] = ",".join(visible)
    own = sorted(spare.accelerator_ids, key=_id_key)
    if own:
        env[DEVICE_INDEX_VAR] = str(visible.index(own[0]))
    return env


def _user_defaults(config: "RunConfig") -> Dict[str, str]:
    """The values the user set for the variables torchrun gives defaults to
    (``env=``, else the driver's environment): those few names, looked up
    one by one; a rank's environment must not cost a copy of the driver's."""
    found = ((name, config.env.get(name, os.environ.get(name))) for name in USER_DEFAULT_VARS)
    return {name: value for name, value in found if value is not None}


def worker_env(
    worker: WorkerInfo,
    *,
    master_addr: str,
    master_port: int,
    run_id: str,
    restart_count: int,
    config: "RunConfig",
    accelerator: Accelerator,
    cpus: float,
    extra: Mapping[str, str],
    error_file: Optional[str] = None,
) -> Dict[str, str]:
    """One rank's launcher environment: torchrun's variables, the node's
    visible devices and this worker's device index, ``extra`` (horovod's),
    then the user's ``env`` (which may not name any of the launcher's own).

    ``error_file`` is where a script decorated with torch's ``@record``
    writes its error (TORCHELASTIC_ERROR_FILE): the rank's attempt directory
    when the run keeps logs on the rank's machine, else next to the
    worker's evidence (removed with it)."""
    env = torchrun_env(
        rank=worker.rank,
        local_rank=worker.local_rank,
        world_size=worker.world_size,
        local_world_size=worker.local_world_size,
        node_rank=worker.node_rank,
        num_nodes=worker.num_nodes,
        master_addr=master_addr,
        master_port=master_port,
        run_id=run_id,
        restart_count=restart_count,
        max_restarts=config.max_restarts,
        role_name=config.role,
        omp_num_threads=max(1, int(cpus)),
        base_env=_user_defaults(config),
    )
    visible, device_index = worker.visible_device_ids, worker.device_index
    if config.virtual_local_rank:
        # torchrun's --virtual-local-rank: the worker sees only its own device(s), as index 0, and LOCAL_RANK=0.
        env["LOCAL_RANK"] = "0"
        visible = tuple(worker.device_ids)
        device_index = 0 if worker.device_ids else None
    if accelerator.visible_devices_var is not None:
        env[accelerator.visible_devices_var] = ",".join(visible)
    if device_index is not None:
        env[DEVICE_INDEX_VAR] = str(device_index)
    if worker.evidence is not None:  # where raydist.preemption_requested() reads a drain deadline
        env[PREEMPTION_FILE_VAR] = worker.evidence.preemption_path
    if error_file is None and worker.evidence is not None:
        error_file = worker.evidence.error_path
    if error_file:
        env["TORCHELASTIC_ERROR_FILE"] = error_file
    # Read when the process group starts; a dump reads the whole buffer (~15 us an entry).
    own_size = os.environ.get(RECORDER_BUFFER_VAR) or str(RECORDER_ENTRIES)
    env[RECORDER_BUFFER_VAR] = own_size if config.flight_recorder else "0"
    env.update(extra)
    env.update(config.env)
    return env
