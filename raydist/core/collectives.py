"""Object collectives over the backend ``init_distributed()`` chose.

With world size 1 they need no backend. Inside a raydist Ray worker a large
object does not travel through the backend: it is put once in Ray's object
store and only a small reference is sent (the worker pool installs that path);
its owner frees it once every rank that reads it has done so. Every other
case pickles through the backend. A rank never sends its own object to
itself (the source of a broadcast or scatter, the destination of a gather):
it keeps the object it passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Protocol, Sequence, Tuple

from raydist.core.backend import Backend
from raydist.core.initialize import DistInfo, active_backend, get_context


class LargeObjectTransport(Protocol):
    """Moves big objects out of band; installed by the raydist worker."""

    def wants(self, obj: Any) -> bool: ...
    def put(self, obj: Any) -> bytes: ...
    def get(self, handle: bytes) -> Any: ...
    def free(self, handle: bytes) -> None: ...


_transport: Optional[LargeObjectTransport] = None


def set_large_object_transport(transport: Optional[LargeObjectTransport]) -> None:
    """Install (or remove, with None) the out-of-band path for large objects.

    Every rank of a job must make the same choice: whether a gather ends with
    a barrier depends on it (see ``gather_object``).
    """
    global _transport
    _transport = transport


@dataclass(frozen=True)
class _ByReference:
    """Stands in for an object that was put in the object store by ``owner``."""

    handle: bytes
    owner: int


def _pack(obj: Any, rank: int) -> Any:
    if _transport is not None and _transport.wants(obj):
        return _ByReference(_transport.put(obj), rank)
    return obj


def _unpack(payload: Any) -> Any:
    if isinstance(payload, _ByReference):
        assert _transport is not None, "a by-reference object arrived without a transport"
        return _transport.get(payload.handle)
    return payload


def _free_own(payloads: Iterable[Any], rank: int) -> None:
    """Free the stored objects among ``payloads`` that this rank put."""
    for payload in payloads:
        if isinstance(payload, _ByReference) and payload.owner == rank:
            assert _transport is not None
            _transport.free(payload.handle)


def _release(payloads: Sequence[Any], rank: int, backend: Backend) -> None:
    """After a collective in which every rank saw every payload and read the
    stored ones: one barrier (all ranks know whether one is needed), then
    each owner frees its objects."""
    if any(isinstance(p, _ByReference) for p in payloads):
        backend.barrier()
        _free_own(payloads, rank)


def _context_for_collective() -> Tuple[DistInfo, Optional[Backend]]:
    info = get_context()  # raises when a multi-process job was never initialised
    backend = active_backend()
    if info.world_size > 1 and backend is None:
        raise RuntimeError("the process group is not initialised: call raydist.init_distributed() first")
    return info, backend


def _check_rank(name: str, rank: int, info: DistInfo) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < info.world_size:
        raise ValueError(f"{name}={rank!r} is outside the world of size {info.world_size}")


def barrier() -> None:
    """Wait for every rank."""
    info, backend = _context_for_collective()
    if backend is not None and info.world_size > 1:
        backend.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Return rank ``src``'s ``obj`` on every rank."""
    info, backend = _context_for_collective()
    _check_rank("src", src, info)
    if backend is None or info.world_size == 1:
        return obj
    payload = backend.broadcast(_pack(obj, info.rank) if info.rank == src else None, src)
    result = obj if info.rank == src else _unpack(payload)
    _release([payload], info.rank, backend)
    return result


def all_gather_object(obj: Any) -> List[Any]:
    """Every rank's ``obj``, as a list indexed by rank, on every rank."""
    info, backend = _context_for_collective()
    if backend is None or info.world_size == 1:
        return [obj]
    payloads = backend.all_gather(_pack(obj, info.rank))
    result = [obj if r == info.rank else _unpack(p) for r, p in enumerate(payloads)]
    _release(payloads, info.rank, backend)
    return result


def gather_object(obj: Any, dst: int = 0) -> Optional[List[Any]]:
    """Every rank's ``obj`` as a list on rank ``dst``; None on the other ranks.

    The objects reach ``dst`` only. With a large-object transport installed
    every gather ends with one barrier: only ``dst`` sees which ranks stored
    their object, the owners may free theirs only once ``dst`` has read them,
    and a barrier is the one wait all ranks can agree on without first telling
    each other what was stored (which would itself cost a collective).
    """
    info, backend = _context_for_collective()
    _check_rank("dst", dst, info)
    if backend is None or info.world_size == 1:
        return [obj]
    mine = None if info.rank == dst else _pack(obj, info.rank)
    payloads = backend.gather(mine, dst)
    result = None
    if info.rank == dst:
        assert payloads is not None
        result = [obj if r == dst else _unpack(p) for r, p in enumerate(payloads)]
    if _transport is not None:
        backend.barrier()  # dst has read every stored object
        _free_own([mine], info.rank)
    return result


def scatter_object(objs: Optional[Sequence[Any]], src: int = 0) -> Any:
    """Rank ``src`` passes one object per rank; each rank gets its own.

    Each rank receives only its own object. Rank ``src``, which alone stores
    objects, tells every rank alongside its object whether any was stored, so
    a release barrier happens only when one is needed.
    """
    info, backend = _context_for_collective()
    _check_rank("src", src, info)
    is_src = info.rank == src
    if is_src and (objs is None or len(objs) != info.world_size):
        raise ValueError(f"scatter_object needs a sequence of {info.world_size} objects on rank {src}")
    if backend is None or info.world_size == 1:
        return objs[0]  # type: ignore[index]
    packed: List[Any] = []
    outgoing: Optional[List[Tuple[Any, bool]]] = None
    if is_src:
        packed = [None if r == src else _pack(o, info.rank) for r, o in enumerate(objs)]  # type: ignore[arg-type]
        any_stored = any(isinstance(p, _ByReference) for p in packed)
        outgoing = [(p, any_stored) for p in packed]
    payload, stored = backend.scatter(outgoing, src)
    result = objs[src] if is_src else _unpack(payload)  # type: ignore[index]
    if stored:
        backend.barrier()  # every rank has read its own object
        _free_own(packed, info.rank)
    return result
