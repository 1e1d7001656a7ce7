"""The driver's side of each backend, as hooks the worker group calls.

``WorkerGroup`` knows no backend: it asks the hooks which backend arguments
each worker passes to ``init_distributed``, calls ``start`` once ranks are
known (for the extra variables of each rank) and ``stop`` at teardown. A new backend is a new
hooks class chosen in ``group_hooks``, not a change to the group.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Sequence

from raydist.config import RunConfig
from raydist.pool.layout import WorkerInfo


class GroupHooks(Protocol):
    def init_kwargs(self) -> Optional[Dict[str, Any]]:
        """The backend's arguments of ``init_distributed`` (None: the code initialises itself)."""

    def start(self, workers: Sequence[WorkerInfo]) -> List[Dict[str, str]]:
        """Start what the workers need from the driver; each rank's extra variables."""

    def stop(self) -> None:
        """Stop what ``start`` started; safe before ``start`` and more than once."""


class TorchDistributedHooks:
    """torch.distributed needs nothing from the driver: torchrun's variables,
    which every worker gets, are its rendezvous."""

    def __init__(self, config: RunConfig) -> None:
        self._config = config

    def init_kwargs(self) -> Optional[Dict[str, Any]]:
        if not self._config.init_process_group:
            return None
        return {"backend": self._config.backend}

    def start(self, workers: Sequence[WorkerInfo]) -> List[Dict[str, str]]:
        return [{} for _ in workers]

    def stop(self) -> None:
        pass


def group_hooks(config: RunConfig) -> GroupHooks:
    """The hooks for ``config.backend``; importing horovod only for a horovod group."""
    if config.horovod:
        from raydist.pool.horovod import HorovodHooks

        return HorovodHooks()
    return TorchDistributedHooks(config)
