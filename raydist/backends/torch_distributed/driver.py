"""torch.distributed's driver side: nothing to start. torchrun's variables,
which every worker gets, are its rendezvous."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from raydist.config import RunConfig
from raydist.pool.records import WorkerInfo


class TorchDistributedHooks:
    """The worker group's hooks for torch.distributed (see raydist.pool.driver.hooks)."""

    entry: Any = None

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
