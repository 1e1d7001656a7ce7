"""The pre-flight probes a worker runs before it hosts a rank (``health_check``).

- compute: a square matrix multiply on the worker's device, sized for it
  (a CPU core does a 512 x 512 float32 product in about 10 ms: longer than
  a scheduler's time slice, so a core shared with other work shows as
  slower; an H100 does a 4096 x 4096 one in well under a millisecond),
  timed ``reps`` times after one warm-up; the figure is GFLOP/s at the
  median time, so one descheduled repetition does not make a healthy worker
  look slow;
- memory (accelerators): a block of device memory filled and summed back,
  a part of what is free (a device whose memory is held by a stray process
  or broken fails here, before the user's model does);
- collective (once the world's process group exists): a timed all_reduce
  whose result is checked, the group's bus bandwidth figure.

Each returns what it measured or raises; the caller reports the failure.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Tuple

import torch

from raydist.core.devices import device_module

MiB = 2**20


@dataclass(frozen=True)
class Sizes:
    """One mode's probe sizes: the matrix side on a CPU and on an accelerator, the
    repetitions, the memory block (accelerators) and the all_reduce's bytes."""

    cpu_side: int
    device_side: int
    reps: int
    memory_bytes: int
    memory_share: float  # at most this share of the device's free memory
    allreduce_bytes: int


SIZES = {
    "quick": Sizes(cpu_side=512, device_side=4096, reps=5, memory_bytes=256 * MiB, memory_share=0.25, allreduce_bytes=4 * MiB),
    "thorough": Sizes(cpu_side=1536, device_side=8192, reps=20, memory_bytes=16 * 1024 * MiB, memory_share=0.8, allreduce_bytes=64 * MiB),
}


def _synchronize(device: torch.device) -> None:
    module = device_module(device.type) if device.type != "cpu" else None
    if module is not None and hasattr(module, "synchronize"):
        module.synchronize(device)


@contextmanager
def _threads(count: int) -> Iterator[None]:
    """torch's CPU threads set to ``count`` for the probe (the worker's CPU share), then put back."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, count))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def compute_gflops(device: torch.device, mode: str, threads: int = 1) -> float:
    """GFLOP/s of a square float32 matrix multiply on ``device`` at the median of the repetitions."""
    sizes = SIZES[mode]
    side = sizes.cpu_side if device.type == "cpu" else sizes.device_side
    with _threads(threads), torch.no_grad():
        a = torch.randn(side, side, device=device)
        b = torch.randn(side, side, device=device)
        torch.matmul(a, b)  # warm-up: kernels chosen, memory touched
        _synchronize(device)
        times = []
        for _ in range(sizes.reps):
            start = time.perf_counter()
            torch.matmul(a, b)
            _synchronize(device)
            times.append(time.perf_counter() - start)
    return 2 * side**3 / statistics.median(times) / 1e9


def check_memory(device: torch.device, mode: str) -> int:
    """Fill a block of ``device``'s free memory and sum it back; the bytes checked (0 on a CPU)."""
    if device.type == "cpu":
        return 0
    sizes = SIZES[mode]
    module = device_module(device.type)
    free = module.mem_get_info(device)[0] if module is not None and hasattr(module, "mem_get_info") else sizes.memory_bytes
    count = int(min(sizes.memory_bytes, free * sizes.memory_share)) // 4
    block = torch.full((count,), 1.0, device=device)
    total = float(block.sum(dtype=torch.float64).item())
    del block
    if total != count:
        raise RuntimeError(f"device memory check: {count} ones summed to {total:.0f}")
    return count * 4


def collective_gbps(mode: str, device: Any) -> Tuple[float, float]:
    """(the all_reduce's bus bandwidth in GB/s at the median time, seconds it took),
    on the default process group; raises when its sum is wrong on this rank."""
    import torch.distributed as dist

    sizes = SIZES[mode]
    world = dist.get_world_size()
    count = sizes.allreduce_bytes // 4
    block = torch.ones(count, device=device)
    dist.all_reduce(block)  # warm-up: connections made
    times = []
    for _ in range(min(sizes.reps, 5)):
        block.fill_(1.0)
        _synchronize(block.device)
        start = time.perf_counter()
        dist.all_reduce(block)
        _synchronize(block.device)
        times.append(time.perf_counter() - start)
    if float(block[0].item()) != world or float(block[-1].item()) != world:
        raise RuntimeError(f"all_reduce check: ones summed over {world} ranks gave {block[0].item():g} and {block[-1].item():g}")
    seconds = statistics.median(times)
    # Bus bandwidth: the bytes each rank moves in a ring all_reduce, as nccl-tests report it.
    return 2 * (world - 1) / world * sizes.allreduce_bytes / seconds / 1e9 if world > 1 else 0.0, seconds
