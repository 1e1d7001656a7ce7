"""torch.distributed as a raydist backend: gloo, nccl, hccl, xccl, ...

The process group is initialised from the launcher's variables (torchrun's,
raydist's, or SLURM's) unless the code already made one itself; objects move
through torch's own object collectives.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from raydist.core.backend import Backend
from raydist.core.devices import default_backend
from raydist.core.environment import WorldInfo, read_world_info


def _init_process_group(
    backend: str, dist_url: Optional[str], timeout: Optional[datetime.timedelta], device_id: Optional[torch.device]
) -> None:
    kwargs: Dict[str, Any] = {"backend": backend}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if device_id is not None and backend != "gloo":
        # Binds the accelerator backend's communicator to this process's
        # device: torch's NCCL backend starts it eagerly then, and from
        # torch 2.15 on requires it. (gloo keeps its CPU default.)
        kwargs["device_id"] = device_id
    if dist_url is None and os.environ.get("WORLD_SIZE") == "1" and "SLURM_PROCID" not in os.environ:
        # A world of one needs no rendezvous: an in-process store leaves no
        # port to lose to another run on the node between choosing and binding it.
        kwargs.update(store=dist.HashStore(), rank=0, world_size=1)
    else:
        kwargs["init_method"] = dist_url or "env://"
    if "SLURM_PROCID" in os.environ:
        # SLURM sets no torch variables: pass rank/size explicitly, and export
        # them so later code (and torch helpers) see the torchrun names.
        world = read_world_info()
        os.environ.setdefault("LOCAL_RANK", str(world.local_rank))
        os.environ.setdefault("RANK", str(world.rank))
        os.environ.setdefault("WORLD_SIZE", str(world.world_size))
        kwargs.update(rank=world.rank, world_size=world.world_size)
    dist.init_process_group(**kwargs)


class TorchDistributedBackend(Backend):
    """The default process group; ``name`` is the backend asked for (None: the
    device's), then the one the group really runs."""

    def __init__(
        self,
        backend: Optional[str] = None,
        dist_url: Optional[str] = None,
        timeout: Optional[datetime.timedelta] = None,
    ) -> None:
        self.name = backend
        self._dist_url = dist_url
        self._timeout = timeout
        self._object_device: Optional[torch.device] = None

    def init(self, device_type: str) -> WorldInfo:
        launcher = read_world_info()
        if not dist.is_initialized():  # a script may have initialised it itself
            _init_process_group(self.name or default_backend(device_type), self._dist_url, self._timeout, self.device_id)
        self.name = str(dist.get_backend())
        # gloo moves objects on the CPU; nccl/hccl/xccl need them on the
        # current device of the kind, which init_distributed pins next.
        # (torch's own default would pick the CPU while a lazily started
        # nccl group has not run any collective yet.)
        self._object_device = None if self.name == "gloo" else torch.device(device_type)
        # The process group is the truth for rank and size; the environment may be stale.
        return WorldInfo(
            rank=dist.get_rank(),
            local_rank=launcher.local_rank,
            world_size=dist.get_world_size(),
            local_world_size=launcher.local_world_size,
            node_rank=launcher.node_rank,
        )

    def broadcast(self, payload: Any, src: int) -> Any:
        box = [payload]
        dist.broadcast_object_list(box, src=src, device=self._object_device)
        return box[0]

    def all_gather(self, payload: Any) -> List[Any]:
        payloads: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(payloads, payload)
        return payloads

    def gather(self, payload: Any, dst: int) -> Optional[List[Any]]:
        payloads: Optional[List[Any]] = [None] * dist.get_world_size() if dist.get_rank() == dst else None
        dist.gather_object(payload, payloads, dst=dst)
        return payloads

    def scatter(self, payloads: Optional[Sequence[Any]], src: int) -> Any:
        box: List[Any] = [None]
        dist.scatter_object_list(box, list(payloads) if payloads is not None else None, src=src)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()

    def shutdown(self) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
