"""The driver's side of a backend, as hooks the worker group calls.

``WorkerGroup`` knows no backend: the backend registry
(``raydist.core.backend``) names each backend's hooks class, which the group
builds with the run's config; the hooks say which arguments each worker
passes to ``init_distributed``, start what the workers need from the driver
once ranks are known (returning each rank's extra variables), and stop it at
teardown. Each backend's hooks live in its own package
(``raydist.backends.<name>.driver``), next to its worker half and entry.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Sequence

from raydist.config import RunConfig
from raydist.pool.records import WorkerInfo


class GroupHooks(Protocol):
    entry: Any  # the backend's registry entry; the worker registers it before init

    def init_kwargs(self) -> Optional[Dict[str, Any]]:
        """The backend's arguments of ``init_distributed`` (None: the code initialises itself)."""

    def start(self, workers: Sequence[WorkerInfo]) -> List[Dict[str, str]]:
        """Start what the workers need from the driver; each rank's extra variables."""

    def stop(self) -> None:
        """Stop what ``start`` started; safe before ``start`` and more than once."""


def group_hooks(config: RunConfig) -> GroupHooks:
    """The hooks of ``config.backend``'s registry entry, built with ``config``
    (whose check already refused a backend whose library is missing)."""
    from raydist.core.backend import backend_entry, load

    entry = backend_entry(config.backend)
    hooks: GroupHooks = load(entry.driver_hooks)(config)
    hooks.entry = entry
    return hooks
