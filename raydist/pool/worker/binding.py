"""torchrun's ``--numa-binding`` inside a raydist worker.

torchrun binds each worker process to the CPUs near the GPU it will use
(``torch.numa.binding``): for a script it wraps the command in ``numactl
--physcpubind``, for a function it sets the affinity of every thread of the
new process before the function runs. A raydist worker is already a running
process, so it takes the second way, with torch's own CPU choice per mode
(node, socket, exclusive, core-complex) for the worker's device (its
``device_index`` under the visible-devices list raydist set).

Where a node gives nothing to bind by (no CUDA device for this worker, no
NUMA information in sysfs, a torch without ``torch.numa``), nothing is
bound and the reason comes back as one line; a failure once the topology is
there raises, as under torchrun.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Optional, Set

if TYPE_CHECKING:
    from raydist.pool.records import WorkerSpec

NUMA_SYSFS = "/sys/devices/system/node"


class BindingSkipped(Exception):
    """There is no topology to bind by on this node; the message says why."""


def _cpus_for(mode: str, device_index: int) -> Set[int]:
    """torch's CPU choice for ``mode`` and the GPU at ``device_index``."""
    try:
        from torch.numa import binding
    except ImportError:
        import torch

        raise BindingSkipped(f"torch {torch.__version__} has no torch.numa.binding (torch 2.9 or newer has)") from None
    import torch

    if not torch.cuda.is_available() or device_index >= torch.cuda.device_count():
        raise BindingSkipped(f"CUDA sees no GPU {device_index} here (torch.cuda.device_count() is {torch.cuda.device_count()})")
    options = binding.NumaOptions(affinity_mode=binding.AffinityMode(mode))
    return set(binding._get_logical_cpus_to_bind_to(gpu_index=device_index, numa_options=options))


def bind_threads(cpus: Set[int]) -> None:
    """Bind every thread of this process that still has the main thread's
    affinity to ``cpus`` (torch's rule: threads bound elsewhere stay)."""
    if not cpus:
        raise RuntimeError("NUMA binding chose no CPU")
    from torch.numa import binding

    binding._bind_all_threads_in_current_process_to_logical_cpus(logical_cpu_indices=cpus)


def apply_numa_binding(mode: str, device_type: str, device_index: Optional[int]) -> Optional[str]:
    """Bind this worker as torchrun's ``--numa-binding mode`` would; None when
    bound, else the one line saying why nothing was bound."""
    try:
        if device_type != "cuda" or device_index is None:
            raise BindingSkipped(f"this worker has no CUDA GPU ({device_type} workers): binding follows a GPU")
        if not hasattr(os, "sched_setaffinity") or not os.path.isdir(NUMA_SYSFS):
            raise BindingSkipped(f"no NUMA topology on this machine ({NUMA_SYSFS} is missing)")
        bind_threads(_cpus_for(mode, device_index))
    except BindingSkipped as skipped:
        return f"raydist: --numa-binding {mode} not applied on this node: {skipped}"
    return None


def bind_rank(spec: "WorkerSpec") -> None:
    """torchrun's --numa-binding for the rank ``spec`` sets up, before any user
    code runs; where it cannot apply, local rank 0 of the node says why in one line."""
    from raydist.core.environment import DEVICE_INDEX_VAR

    index = os.environ.get(DEVICE_INDEX_VAR)
    why = apply_numa_binding(spec.config.numa_binding or "", spec.device_type, int(index) if index else None)
    if why and spec.worker.local_rank == 0:
        print(why, file=sys.stderr, flush=True)
