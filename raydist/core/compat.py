"""open_clip-compatible helpers: the same names and signatures over raydist's core.

A training script written against open_clip's ``distributed`` module switches
its import to ``from raydist.core import compat as distributed`` and runs unchanged,
under torchrun, SLURM, horovodrun or ``raydist run``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from raydist.core import collectives
from raydist.core.devices import is_device_available, set_device
from raydist.core.environment import is_using_distributed, is_using_horovod, world_info_from_env
from raydist.core.initialize import init_distributed

__all__ = [
    "all_gather_object",
    "broadcast_object",
    "init_distributed_device",
    "init_distributed_device_so",
    "is_device_available",
    "is_global_master",
    "is_local_master",
    "is_master",
    "is_using_distributed",
    "is_using_horovod",
    "set_device",
    "world_info_from_env",
]


def is_global_master(args: Any) -> bool:
    return args.rank == 0


def is_local_master(args: Any) -> bool:
    return args.local_rank == 0


def is_master(args: Any, local: bool = False) -> bool:
    return is_local_master(args) if local else is_global_master(args)


def init_distributed_device_so(
    device: str = "cuda",
    dist_backend: Optional[str] = None,
    dist_url: Optional[str] = None,
    horovod: bool = False,
    no_set_device_rank: bool = False,
) -> Dict[str, Any]:
    """open_clip's dict-returning initializer: device, global_rank, local_rank, world_size, distributed."""
    info = init_distributed(
        device=device,
        backend=dist_backend,
        dist_url=dist_url,
        horovod=horovod,
        no_set_device_rank=no_set_device_rank,
    )
    return dict(
        device=info.device,
        global_rank=info.rank,
        local_rank=info.local_rank,
        world_size=info.world_size,
        distributed=info.distributed,
    )


def init_distributed_device(args: Any) -> torch.device:
    """Initialise from ``args`` (device, dist_backend, dist_url, horovod, no_set_device_rank) and fill it in."""
    result = init_distributed_device_so(
        device=getattr(args, "device", "cuda"),
        dist_backend=getattr(args, "dist_backend", None),
        dist_url=getattr(args, "dist_url", None),
        horovod=getattr(args, "horovod", False),
        no_set_device_rank=getattr(args, "no_set_device_rank", False),
    )
    args.device = result["device"]
    args.world_size = result["world_size"]
    args.rank = result["global_rank"]
    args.local_rank = result["local_rank"]
    args.distributed = result["distributed"]
    return torch.device(args.device)


def broadcast_object(args: Any, obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s object on every rank (``args`` is kept for open_clip's signature)."""
    return collectives.broadcast_object(obj, src=src)


def all_gather_object(args: Any, obj: Any, dst: int = 0) -> List[Any]:
    """Every rank's object on every rank; ``dst`` is accepted and ignored, as in open_clip."""
    return collectives.all_gather_object(obj)
