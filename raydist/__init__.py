"""raydist: run distributed PyTorch on a Ray actor pool.

The core (devices, launcher environment, initialization, object collectives)
imports without Ray, so torchrun/SLURM/horovodrun users can use it alone; the
Ray parts (``run``, ``WorkerGroup``, errors) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raydist.core import compat
from raydist.core.collectives import (
    all_gather_object,
    barrier,
    broadcast_object,
    gather_object,
    scatter_object,
)
from raydist.core.environment import is_using_distributed, is_using_horovod, read_world_info, torchrun_env
from raydist.config import RunConfig
from raydist.core.initialize import DistInfo, get_context, init_distributed, shutdown

__version__ = "0.1.0"

# Public names that need Ray, resolved lazily by __getattr__.
_RAY_EXPORTS = {
    "run": "raydist.api",
    "WorkerGroup": "raydist.pool.group",
    "WorkerFuture": "raydist.pool.group",
    "WorkerInfo": "raydist.pool.group",
    "WorkerGroupError": "raydist.pool.errors",
    "WorkerFailure": "raydist.pool.errors",
    "WorkerGroupTimeout": "raydist.pool.errors",
    "InfeasibleResourcesError": "raydist.pool.errors",
    "WorkerStartupTimeout": "raydist.pool.errors",
}

if TYPE_CHECKING:
    from raydist.api import run
    from raydist.pool.errors import (
        InfeasibleResourcesError,
        WorkerFailure,
        WorkerGroupError,
        WorkerGroupTimeout,
        WorkerStartupTimeout,
    )
    from raydist.pool.group import WorkerFuture, WorkerGroup, WorkerInfo


def __getattr__(name: str) -> Any:
    module_name = _RAY_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'raydist' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)


__all__ = [
    "DistInfo",
    "RunConfig",
    "all_gather_object",
    "barrier",
    "compat",
    "broadcast_object",
    "gather_object",
    "get_context",
    "init_distributed",
    "is_using_distributed",
    "is_using_horovod",
    "read_world_info",
    "scatter_object",
    "shutdown",
    "torchrun_env",
    *_RAY_EXPORTS,
]
