"""The interface a communication backend implements for raydist's core.

``init_distributed()`` picks one implementation per process (torch.distributed
or horovod, in ``raydist.backends``) and the object collectives talk only to
it. A backend moves pickled payloads; deciding what travels by reference
through Ray's object store, and when it may be freed, stays in
``raydist.core.collectives`` so that every backend gets it the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, List, Optional, Sequence

from raydist.core.environment import WorldInfo


class Backend(ABC):
    """One way for the ranks of a job to find each other and exchange objects.

    Every method but ``init`` and ``shutdown`` is a collective: all ranks call
    it, in the same order.
    """

    # What DistInfo.backend reports ("gloo", "nccl", "horovod", ...); final once ``init`` returns.
    name: Optional[str]

    @abstractmethod
    def init(self, device_type: str) -> WorldInfo:
        """Join the job from the launcher's environment; this process's place in it.

        ``device_type`` ("cuda", "cpu", ...) is the kind of device this process
        uses; ``init_distributed`` pins the device itself afterwards.
        """

    @abstractmethod
    def broadcast(self, payload: Any, src: int) -> Any:
        """Rank ``src``'s payload, on every rank."""

    @abstractmethod
    def all_gather(self, payload: Any) -> List[Any]:
        """Every rank's payload, indexed by rank, on every rank."""

    @abstractmethod
    def gather(self, payload: Any, dst: int) -> Optional[List[Any]]:
        """Every rank's payload, indexed by rank, on rank ``dst`` only; None elsewhere."""

    @abstractmethod
    def scatter(self, payloads: Optional[Sequence[Any]], src: int) -> Any:
        """Rank ``src`` passes one payload per rank; each rank gets its own."""

    @abstractmethod
    def barrier(self) -> None:
        """Return once every rank has called it."""

    @abstractmethod
    def shutdown(self) -> None:
        """Leave the job; harmless when ``init`` never completed."""
