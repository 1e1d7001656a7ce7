"""Process-group initialization shared by every launcher.

``init_distributed()`` is what each worker runs before the user's code, whether
it was started by torchrun, SLURM, horovodrun or raydist's Ray actor pool.
It chooses the process's backend once by name from the registry
(``raydist.core.backend``: horovod, a plugin, or torch.distributed under a
launcher, or none for a single process) and returns an immutable ``DistInfo``
record that the object collectives and ``get_context()`` read.
"""

from __future__ import annotations

import datetime
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.distributed as dist

from raydist.core.backend import TORCH_BACKEND, Backend, BackendEntry, backend_entry, load
from raydist.core.devices import accelerator_type, device_type_of, is_device_available, is_indexed, set_device
from raydist.core.environment import DEVICE_INDEX_VAR, WorldInfo, check_rank_known, has_rendezvous, is_using_distributed, read_world_info


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the job, after initialization."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    device: str = "cpu"
    backend: Optional[str] = None
    distributed: bool = False
    horovod: bool = False
    # Index of this process's device among the visible ones (None on CPU).
    # Under raydist it follows the worker's own devices, not LOCAL_RANK.
    device_index: Optional[int] = None

    def is_master(self, local: bool = False) -> bool:
        """True on global rank 0 (or local rank 0 with ``local=True``)."""
        return (self.local_rank if local else self.rank) == 0

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)


_lock = threading.Lock()
_context: Optional[DistInfo] = None
_backend: Optional[Backend] = None  # set together with _context; None for a single process


def _resolve_device(device: Optional[str]) -> str:
    device = device or accelerator_type()
    available, known = is_device_available(device)
    if not known:
        warnings.warn(f"Device {device} was not known and checked for availability, trying anyway.")
    elif not available:
        warnings.warn(f"Device {device} was not available, falling back to CPU.")
        device = "cpu"
    return device


def _choose_backend(
    entry: BackendEntry,
    backend: Optional[str],
    dist_url: Optional[str],
    timeout: Optional[datetime.timedelta],
    world_of_one: bool = False,
) -> Optional[Backend]:
    """The backend this process joins its job through, built from ``entry``;
    None outside any job (torch.distributed without launcher variables, or
    with a world of one unless ``world_of_one`` and the launcher's rendezvous
    variables are set). Any other backend is used as asked, in one process
    too, as horovod is."""
    if entry.name == TORCH_BACKEND and not is_using_distributed() and not (world_of_one and has_rendezvous()):
        return None
    # The name goes along when it is not the entry's own: torch.distributed's "gloo", "nccl", ...
    own_name = backend is None or backend.strip().lower() == entry.name
    return load(entry.worker)(None if own_name else backend, dist_url, timeout)


def _device_index(device: str, local_rank: int, distributed: bool) -> Optional[int]:
    """Which device of ``device``'s kind this process uses: raydist's
    assignment, else the local rank (torchrun's rule), else the index in
    ``device``; None for cpu/mps."""
    if not is_indexed(device_type_of(device)):
        return None
    if DEVICE_INDEX_VAR in os.environ:
        value = os.environ[DEVICE_INDEX_VAR]
        if not value.isdigit():
            raise ValueError(f"environment variable {DEVICE_INDEX_VAR}={value!r} is not a device index")
        return int(value)
    if distributed:
        return local_rank
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else 0


def init_distributed(
    device: Optional[str] = None,
    backend: Optional[str] = None,
    dist_url: Optional[str] = None,
    horovod: bool = False,
    no_set_device_rank: bool = False,
    timeout: Union[float, datetime.timedelta, None] = None,
    world_of_one: bool = False,
) -> DistInfo:
    """Initialise torch.distributed (or horovod) from the launcher environment.

    ``device`` is ``"cuda"``, ``"npu:1"``, ... or None for the best available
    kind; an unavailable device falls back to CPU with a warning. ``backend``
    is a name from the backend registry ("horovod", a plugin's) or, for
    torch.distributed, its backend (default: the device's: nccl, hccl, xccl,
    gloo); ``horovod=True`` is ``backend="horovod"``. Without launcher
    variables (world size 1) nothing is initialised. In distributed mode the
    device is pinned to this process's own (``DistInfo.device_index``: under
    raydist the worker's first device, else the local rank as under torchrun)
    unless ``no_set_device_rank``. ``world_of_one``: a launcher that set
    MASTER_ADDR/MASTER_PORT for one process gets a process group of one too
    (raydist's workers, which were asked for a process group, pass it), so
    code that calls collectives runs the same on one rank as on many.
    Calling it again returns the existing record.
    """
    global _context, _backend
    if isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=timeout)
    with _lock:
        if _context is not None:
            return _context
        requested = device or accelerator_type()
        device = _resolve_device(device)
        device_type = device_type_of(device)
        entry = backend_entry("horovod" if horovod else backend)
        chosen = _choose_backend(entry, backend, dist_url, timeout, world_of_one)
        if chosen is not None and not no_set_device_rank:
            chosen.device_id = _device_to_bind(requested, device_type)
        world = chosen.init(device_type) if chosen is not None else WorldInfo()
        distributed = chosen is not None

        # From the kind asked for: right even where torch fell back to CPU (fake devices in tests).
        device_index = _device_index(requested, world.local_rank, distributed)
        if distributed and not no_set_device_rank:
            device = _pin_device(device, device_type, device_index)

        _context = DistInfo(
            rank=world.rank,
            local_rank=world.local_rank,
            world_size=world.world_size,
            local_world_size=world.local_world_size,
            node_rank=world.node_rank,
            device=device,
            backend=chosen.name if chosen is not None else None,
            distributed=distributed,
            horovod=entry.name == "horovod",
            device_index=device_index,
        )
        _backend = chosen
        return _context


def _device_to_bind(requested: str, device_type: str) -> Optional[torch.device]:
    """The accelerator device this process will be pinned to, known before
    the backend joins (from the launcher's local rank); None on CPU, mps, or
    where the kind asked for fell back to CPU."""
    index = _device_index(requested, read_world_info().local_rank, True)
    if index is None or device_type == "cpu" or not is_indexed(device_type):
        return None
    try:
        return torch.device(device_type, index)
    except RuntimeError:  # a kind torch cannot name yet (its extension renames privateuse1): pinning still holds
        return None


def _pin_device(device: str, device_type: str, device_index: Optional[int]) -> str:
    """This process's own device of an indexed kind, made current (others are left as named)."""
    if device_index is None or not is_indexed(device_type):
        return device
    if ":" in device and device != f"{device_type}:{device_index}":
        warnings.warn(f"device index removed from {device}: using this process's device {device_index}")
    device = f"{device_type}:{device_index}"
    set_device(device)
    return device


def get_context() -> DistInfo:
    """The record of this process, once ``init_distributed()`` has run.

    Outside any launcher (world size 1) it is the single-process record.
    """
    check_rank_known("raydist.get_context()")
    if _context is not None:
        return _context
    if is_using_distributed():
        raise RuntimeError("raydist is not initialised in this process: call raydist.init_distributed() first")
    return DistInfo()


def active_backend() -> Optional[Backend]:
    """The backend ``init_distributed()`` chose; None before it, after
    ``shutdown()``, and for a single process."""
    return _backend


def shutdown() -> None:
    """Tear down what ``init_distributed()`` set up; harmless when nothing was."""
    global _context, _backend
    with _lock:
        backend, _context, _backend = _backend, None, None
        if backend is not None:
            backend.shutdown()
        elif dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()  # one the code made itself, never registered here
