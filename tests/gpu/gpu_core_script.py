"""Run by ``torchrun --nproc-per-node 1`` (test_gpu_core.py): the core on a GPU
without Ray. ``seed``: open_clip's ``init_distributed_device(args)`` as the
seed's scripts call it; ``core``: ``init_distributed`` with a process group of
one (nccl bound to the device), then the object collectives. Writes what it
saw as JSON to the path given."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict

import torch
import torch.distributed as dist

import raydist
from raydist.core import compat


def seed() -> Dict[str, Any]:
    args = argparse.Namespace(device="cuda", dist_backend=None, dist_url=None, horovod=False, no_set_device_rank=False)
    device = compat.init_distributed_device(args)
    ones = torch.ones(4, device=device)
    return {
        "device": str(device),
        "args": {k: getattr(args, k) for k in ("device", "world_size", "rank", "local_rank", "distributed")},
        "sum": float(ones.sum().item()),
        "initialized": dist.is_initialized(),
    }


def core() -> Dict[str, Any]:
    info = raydist.init_distributed(device="cuda", world_of_one=True)
    group = dist.distributed_c10d._get_default_group()
    tensor = torch.arange(4.0, device=info.device)
    dist.all_reduce(tensor)
    big = torch.arange(1 << 20, device=info.device)
    objects = {
        "broadcast": raydist.broadcast_object({"rank": info.rank, "t": tensor}),
        "all_gather": raydist.all_gather_object(info.rank),
        "gather": raydist.gather_object(info.rank),
        "scatter": raydist.scatter_object(["only"]),
        "large": raydist.broadcast_object(big),
    }
    raydist.barrier()
    args = argparse.Namespace(device="cuda")  # the seed's call after the core's: the same record
    compat.init_distributed_device(args)
    result = {
        "backend": info.backend,
        "device": info.device,
        "device_index": info.device_index,
        "current_device": torch.cuda.current_device(),
        "bound_device_id": str(getattr(group, "bound_device_id", None)),
        "all_reduce": tensor.tolist(),
        "broadcast_device": str(objects["broadcast"]["t"].device),
        "broadcast_equal": bool(torch.equal(objects["broadcast"]["t"].to(tensor.device), tensor)),
        "all_gather": objects["all_gather"],
        "gather": objects["gather"],
        "scatter": objects["scatter"],
        "large_equal": bool(torch.equal(objects["large"].to(big.device), big)),
        "seed_args": {k: str(getattr(args, k)) for k in ("device", "world_size", "rank", "distributed")},
    }
    raydist.shutdown()
    return result


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    with open(out, "w") as file:
        json.dump(seed() if mode == "seed" else core(), file)
