"""raydist: run distributed PyTorch on a Ray actor pool.

The core (devices, launcher environment, initialization, object collectives)
imports without Ray, so torchrun/SLURM/horovodrun users can use it alone.
Every public name loads on first use: ``import raydist`` imports neither
torch nor Ray (a worker reading crash evidence, or ``raydist run --help``,
needs neither), and Ray's absence shows only when a Ray name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    # The core: torch only.
    "all_gather_object": "raydist.core.collectives",
    "barrier": "raydist.core.collectives",
    "broadcast_object": "raydist.core.collectives",
    "gather_object": "raydist.core.collectives",
    "scatter_object": "raydist.core.collectives",
    "is_using_distributed": "raydist.core.environment",
    "is_using_horovod": "raydist.core.environment",
    "read_world_info": "raydist.core.environment",
    "torchrun_env": "raydist.core.environment",
    "DistInfo": "raydist.core.initialize",
    "get_context": "raydist.core.initialize",
    "init_distributed": "raydist.core.initialize",
    "shutdown": "raydist.core.initialize",
    "RunConfig": "raydist.config",
    "preemption_requested": "raydist.core.preemption",
    "save_state": "raydist.core.state",
    "load_state": "raydist.core.state",
    "wait_committed": "raydist.core.state",
    "StateSizeError": "raydist.core.state",
    "DistributedSampler": "raydist.core.sampler",
    # The pool: Ray.
    "run": "raydist.api",
    "WorkerGroup": "raydist.pool.driver.group",
    "WorkerFuture": "raydist.pool.driver.group",
    "WorkerInfo": "raydist.pool.driver.group",
    "RunSummary": "raydist.pool.driver.summary",
    "DataConfig": "raydist.pool.rules.datasets",
    "get_dataset_shard": "raydist.pool.worker.datasets",
    "split_dataset": "raydist.pool.worker.datasets",
    "RaydistError": "raydist.errors",
    "WorkerGroupError": "raydist.errors",
    "WorkerGroupStopped": "raydist.errors",
    "WorkerGroupClosed": "raydist.errors",
    "WorkerFailure": "raydist.errors",
    "WorkerGroupTimeout": "raydist.errors",
    "InfeasibleResourcesError": "raydist.errors",
    "WorkerStartupTimeout": "raydist.errors",
    "WorkerCallCancelled": "raydist.errors",
}
_SUBMODULES = {"compat": "raydist.core.compat"}  # `from raydist import compat`, open_clip's helpers

if TYPE_CHECKING:
    from raydist.api import run
    from raydist.config import RunConfig
    from raydist.core import compat
    from raydist.core.collectives import all_gather_object, barrier, broadcast_object, gather_object, scatter_object
    from raydist.core.environment import is_using_distributed, is_using_horovod, read_world_info, torchrun_env
    from raydist.core.initialize import DistInfo, get_context, init_distributed, shutdown
    from raydist.core.preemption import preemption_requested
    from raydist.core.sampler import DistributedSampler
    from raydist.core.state import StateSizeError, load_state, save_state, wait_committed
    from raydist.errors import (
        InfeasibleResourcesError,
        RaydistError,
        WorkerCallCancelled,
        WorkerFailure,
        WorkerGroupClosed,
        WorkerGroupError,
        WorkerGroupStopped,
        WorkerGroupTimeout,
        WorkerStartupTimeout,
    )
    from raydist.pool.driver.group import WorkerFuture, WorkerGroup, WorkerInfo
    from raydist.pool.driver.summary import RunSummary
    from raydist.pool.rules.datasets import DataConfig
    from raydist.pool.worker.datasets import get_dataset_shard, split_dataset


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'raydist' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list:
    return sorted([*globals(), *_EXPORTS, *_SUBMODULES])


__all__ = [*_EXPORTS, *_SUBMODULES]
