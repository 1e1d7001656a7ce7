"""horovod as a raydist backend (horovod.torch, gloo or MPI controller).

horovod has object broadcast and all-gather but no object gather or scatter;
both are built here on horovod's ``alltoall`` of pickled bytes, so each
payload goes only to the rank that keeps it, as with torch.distributed.
"""

from __future__ import annotations

import datetime
import os
from types import ModuleType
from typing import Any, List, Optional, Sequence

import torch

from raydist.backends.horovod import INSTALL_HINT
from raydist.core.backend import Backend
from raydist.core.environment import WorldInfo

# raydist's driver gives each horovod worker its node's IP here; horovod's
# gloo binds to a network interface, so the worker looks up the one holding it.
NODE_IP_VAR = "RAYDIST_HOROVOD_NODE_IP"

# horovod matches collectives by name, and names them after the object's type
# unless told otherwise: ranks passing different types (an object vs None) would
# never match, so every collective gets a rank-independent name.
_BROADCAST = "raydist.broadcast_object"
_ALL_GATHER = "raydist.all_gather_object"
_GATHER = "raydist.gather_object"
_SCATTER = "raydist.scatter_object"


def import_horovod() -> ModuleType:
    """``horovod.torch``, or an ImportError that says how to install it."""
    try:
        import horovod.torch as hvd
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    return hvd


def interface_for_ip(ip: str) -> Optional[str]:
    """The network interface that holds ``ip``."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(address.address == ip for address in addresses):
            return name
    return None


def _as_bytes_tensor(data: bytes) -> torch.Tensor:
    # frombuffer refuses an empty buffer; horovod needs a tensor either way.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


class HorovodBackend(Backend):
    """``hvd.init()`` and horovod's collectives; objects pickled with
    cloudpickle, as horovod's own object collectives do."""

    name = "horovod"

    def __init__(
        self,
        backend: Optional[str] = None,
        dist_url: Optional[str] = None,
        timeout: Optional[datetime.timedelta] = None,
    ) -> None:
        # horovod finds its peers through its own variables: no URL, no timeout.
        self._hvd = import_horovod()
        import cloudpickle  # a dependency of horovod

        self._pickle = cloudpickle

    def init(self, device_type: str) -> WorldInfo:
        ip = os.environ.get(NODE_IP_VAR)
        if ip and "HOROVOD_GLOO_IFACE" not in os.environ:
            interface = interface_for_ip(ip)
            if interface:
                os.environ["HOROVOD_GLOO_IFACE"] = interface
        hvd = self._hvd
        hvd.init()
        return WorldInfo(
            rank=hvd.rank(),
            local_rank=hvd.local_rank(),
            world_size=hvd.size(),
            local_world_size=hvd.local_size(),
            node_rank=hvd.cross_rank(),
        )

    def broadcast(self, payload: Any, src: int) -> Any:
        return self._hvd.broadcast_object(payload, root_rank=src, name=_BROADCAST)

    def all_gather(self, payload: Any) -> List[Any]:
        return list(self._hvd.allgather_object(payload, name=_ALL_GATHER))

    def _alltoall(self, parts: Sequence[bytes], name: str) -> List[memoryview]:
        """Send ``parts[r]`` to rank r; the bytes each rank sent here, by rank."""
        splits = torch.tensor([len(part) for part in parts], dtype=torch.int32)
        received, counts = self._hvd.alltoall(_as_bytes_tensor(b"".join(parts)), splits=splits, name=name)
        data = memoryview(received.numpy())
        pieces, start = [], 0
        for count in counts.tolist():
            pieces.append(data[start : start + count])
            start += count
        return pieces

    def gather(self, payload: Any, dst: int) -> Optional[List[Any]]:
        # Each rank sends its bytes to dst and nothing to the others.
        parts = [b""] * self._hvd.size()
        parts[dst] = self._pickle.dumps(payload)
        pieces = self._alltoall(parts, _GATHER)
        if self._hvd.rank() != dst:
            return None
        return [self._pickle.loads(piece) for piece in pieces]

    def scatter(self, payloads: Optional[Sequence[Any]], src: int) -> Any:
        # Only src sends: to each rank its own payload.
        size = self._hvd.size()
        if self._hvd.rank() == src:
            assert payloads is not None and len(payloads) == size
            parts = [self._pickle.dumps(payload) for payload in payloads]
        else:
            parts = [b""] * size
        return self._pickle.loads(self._alltoall(parts, _SCATTER)[src])

    def barrier(self) -> None:
        self._hvd.barrier()

    def shutdown(self) -> None:
        self._hvd.shutdown()
