"""The functions the GPU tier runs on raydist's workers (imported by name in
the workers: this folder is on their PYTHONPATH)."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

import raydist

WIDTH = 64


def where_am_i() -> Dict[str, Any]:
    """One worker's device, backend, visible devices and a collective on the GPU."""
    import ray

    info = raydist.get_context()
    group = dist.distributed_c10d._get_default_group()
    tensor = torch.full((4,), float(info.rank + 1), device=info.device)
    dist.all_reduce(tensor)
    return {
        "rank": info.rank,
        "backend": dist.get_backend(),
        "device": info.device,
        "current_device": torch.cuda.current_device(),
        "bound_device_id": str(getattr(group, "bound_device_id", None)),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "ray_gpu_ids": [str(i) for i in ray.get_gpu_ids()],
        "sum": tensor.tolist(),
        "tensor_device": str(tensor.device),
    }


def _batch(step: int, rank: int, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, WIDTH, generator=generator).to(device)


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)  # the same on every rank, as DDP keeps it
    # One parameter: one DDP bucket, laid out alike in every step (and after a resume).
    return torch.nn.Linear(WIDTH, WIDTH, bias=False).to(device)


def ddp_step() -> Dict[str, Any]:
    """One DDP step on CUDA tensors; the weights after it, and those one process
    computes from every rank's batch (DDP averages the gradients)."""
    info = raydist.get_context()
    model = _model(info.device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[info.device_index])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp(_batch(0, info.rank, info.device)).square().mean().backward()
    optimizer.step()
    alone = _model(info.device)
    for rank in range(info.world_size):
        (alone(_batch(0, rank, info.device)).square().mean() / info.world_size).backward()
    with torch.no_grad():
        expected = alone.weight - 0.1 * alone.weight.grad
    return {
        "rank": info.rank,
        "backend": dist.get_backend(),
        "device": info.device,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "param_device": str(model.weight.device),
        "weights": model.weight.detach().cpu(),
        "expected": expected.detach().cpu(),
    }


def train(steps: int, crash_at: Optional[int] = None, crash_rank: int = 1) -> Dict[str, Any]:
    """``steps`` deterministic DDP steps of a CUDA model and Adam, saving every
    step; on attempt 0, once step ``crash_at - 1`` is committed, rank ``crash_rank`` dies at the start of step ``crash_at``."""
    torch.use_deterministic_algorithms(True)
    info = raydist.get_context()
    rank = dist.get_rank()  # the process group's: a kept process may hold another rank after a restart
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = _model(info.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    resumed = raydist.load_state(model=model, optimizer=optimizer)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[info.device_index])
    for step in range(0 if resumed is None else resumed + 1, steps):
        if attempt == 0 and step == crash_at:
            raydist.wait_committed()  # a save never waits for a commit: the resumed step is then known
            if rank == crash_rank:
                os._exit(3)
        optimizer.zero_grad()
        ddp(_batch(step, info.rank, info.device)).square().mean().backward()
        optimizer.step()
        raydist.save_state(step, model=model, optimizer=optimizer)
    moments: List[torch.Tensor] = [optimizer.state[model.weight][key] for key in ("exp_avg", "exp_avg_sq")]
    return {
        "rank": rank,
        "attempt": attempt,
        "resumed": resumed,
        "backend": dist.get_backend(),
        "pid": os.getpid(),
        "device": str(model.weight.device),
        "state_devices": sorted({str(t.device) for t in moments}),
        "weights": model.weight.detach().cpu(),
        "moments": [t.detach().cpu() for t in moments],
    }


def affinity() -> Dict[str, Any]:
    """The CPUs this worker's threads may run on, once raydist bound it."""
    return {"cpus": sorted(os.sched_getaffinity(0)), "device": raydist.get_context().device}
