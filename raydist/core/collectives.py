"""Object collectives over torch.distributed or horovod, whichever is initialised.

With world size 1 they need no process group. Inside a raydist Ray worker a
large object does not travel through the communication backend: it is put once
in Ray's object store and only a small reference is sent (see
``raydist.pool.object_store``); every other case pickles through the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Protocol, Sequence

import torch
import torch.distributed as dist

from raydist.core.initialize import DistInfo, get_context, import_horovod


class LargeObjectTransport(Protocol):
    """Moves big objects out of band; installed by the raydist worker."""

    def wants(self, obj: Any) -> bool: ...
    def put(self, obj: Any) -> bytes: ...
    def get(self, handle: bytes) -> Any: ...
    def free(self, handle: bytes) -> None: ...


_transport: Optional[LargeObjectTransport] = None

# horovod names a collective after the object's type unless told otherwise;
# ranks passing different types (an object vs None) would never match.
_HVD_BROADCAST = "raydist.broadcast_object"
_HVD_ALLGATHER = "raydist.all_gather_object"


def set_large_object_transport(transport: Optional[LargeObjectTransport]) -> None:
    """Install (or remove, with None) the out-of-band path for large objects."""
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


def _release(payloads: Sequence[Any], info: DistInfo) -> None:
    """Free out-of-band objects once every rank has read them."""
    stored = [p for p in payloads if isinstance(p, _ByReference)]
    if not stored:
        return
    barrier()
    assert _transport is not None
    for payload in stored:
        if payload.owner == info.rank:
            _transport.free(payload.handle)


def _context_for_collective() -> DistInfo:
    info = get_context()  # raises when a multi-process job was never initialised
    if info.world_size > 1 and not info.horovod and not dist.is_initialized():
        raise RuntimeError("the process group is not initialised: call raydist.init_distributed() first")
    return info


def _check_rank(name: str, rank: int, info: DistInfo) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < info.world_size:
        raise ValueError(f"{name}={rank!r} is outside the world of size {info.world_size}")


def _object_device(info: DistInfo) -> Optional[torch.device]:
    # gloo moves objects on the CPU; nccl/hccl/xccl need them on the current device.
    return None if info.backend in (None, "gloo") else info.torch_device


def barrier() -> None:
    """Wait for every rank."""
    info = _context_for_collective()
    if info.world_size == 1:
        return
    if info.horovod:
        import_horovod().barrier()
    else:
        dist.barrier()


def _broadcast_raw(payload: Any, src: int, info: DistInfo) -> Any:
    if info.horovod:
        return import_horovod().broadcast_object(payload, root_rank=src, name=_HVD_BROADCAST)
    box = [payload]
    dist.broadcast_object_list(box, src=src, device=_object_device(info))
    return box[0]


def _all_gather_raw(payload: Any, info: DistInfo) -> List[Any]:
    if info.horovod:
        return list(import_horovod().allgather_object(payload, name=_HVD_ALLGATHER))
    payloads: List[Any] = [None] * info.world_size
    dist.all_gather_object(payloads, payload)
    return payloads


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Return rank ``src``'s ``obj`` on every rank."""
    info = _context_for_collective()
    _check_rank("src", src, info)
    if info.world_size == 1:
        return obj
    payload = _broadcast_raw(_pack(obj, info.rank) if info.rank == src else None, src, info)
    result = obj if info.rank == src else _unpack(payload)
    _release([payload], info)
    return result


def all_gather_object(obj: Any) -> List[Any]:
    """Every rank's ``obj``, as a list indexed by rank, on every rank."""
    info = _context_for_collective()
    if info.world_size == 1:
        return [obj]
    payloads = _all_gather_raw(_pack(obj, info.rank), info)
    result = [obj if r == info.rank else _unpack(p) for r, p in enumerate(payloads)]
    _release(payloads, info)
    return result


def gather_object(obj: Any, dst: int = 0) -> Optional[List[Any]]:
    """Every rank's ``obj`` as a list on rank ``dst``; None on the other ranks."""
    info = _context_for_collective()
    _check_rank("dst", dst, info)
    if info.world_size == 1:
        return [obj]
    if info.horovod or _transport is not None:
        # Every rank must see every payload to agree on the release barrier;
        # payloads are small here (large ones travel by reference).
        payloads: Optional[List[Any]] = _all_gather_raw(_pack(obj, info.rank), info)
    else:
        payloads = [None] * info.world_size if info.rank == dst else None
        dist.gather_object(obj, payloads, dst=dst)
    result = None
    if info.rank == dst:
        assert payloads is not None
        result = [obj if r == info.rank else _unpack(p) for r, p in enumerate(payloads)]
    _release(payloads or [], info)
    return result


def scatter_object(objs: Optional[Sequence[Any]], src: int = 0) -> Any:
    """Rank ``src`` passes one object per rank; each rank gets its own."""
    info = _context_for_collective()
    _check_rank("src", src, info)
    is_src = info.rank == src
    if is_src and (objs is None or len(objs) != info.world_size):
        raise ValueError(f"scatter_object needs a sequence of {info.world_size} objects on rank {src}")
    if info.world_size == 1:
        return objs[0]  # type: ignore[index]
    if info.horovod or _transport is not None:
        packed = [_pack(o, info.rank) for o in objs] if is_src else None  # type: ignore[union-attr]
        payloads = _broadcast_raw(packed, src, info)
        result = objs[info.rank] if is_src else _unpack(payloads[info.rank])  # type: ignore[index]
        _release(payloads, info)
        return result
    box: List[Any] = [None]
    dist.scatter_object_list(box, list(objs) if is_src else None, src=src)  # type: ignore[arg-type]
    return box[0]
