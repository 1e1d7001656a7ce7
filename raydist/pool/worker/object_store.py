"""Large objects through Ray's object store instead of the process group.

Inside a raydist worker, ``broadcast_object`` and friends ``ray.put`` an
object above the threshold once and send only its reference, which every
rank reads from its node's shared memory: numpy arrays zero-copy (read-only,
as any zero-copy Ray read), CPU tensors with a single copy into fresh memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

import numpy as np
import ray
import ray.cloudpickle
import torch

from raydist.config import DEFAULT_OBJECT_STORE_THRESHOLD
from raydist.pool.ray_private import drop_pickled_reference

_MAX_ITEMS = 10_000  # do not walk huge containers just to size them


def estimated_nbytes(obj: Any, _budget: list | None = None) -> int:
    """Bytes of array/tensor/bytes payload in ``obj``, looking inside containers."""
    budget = _budget if _budget is not None else [_MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0:
        return 0
    nbytes = getattr(obj, "nbytes", None)  # numpy arrays, and torch tensors (torch>=2.1)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(obj, (bytes, bytearray, memoryview, str)):
        return len(obj)
    if isinstance(obj, dict):
        return sum(estimated_nbytes(v, budget) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return sum(estimated_nbytes(v, budget) for v in obj)
    return 0


@dataclass(frozen=True)
class _TensorAsArray:
    """A CPU tensor carried as a numpy array: Ray stores arrays with one copy
    and reads them zero-copy, while a pickled tensor is copied twice each way."""

    array: np.ndarray


def _numpy_compatible(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu" and not tensor.requires_grad and tensor.dtype not in (torch.bfloat16,) and not tensor.is_sparse


def _tensors_to_arrays(obj: Any) -> Any:
    """Swap plain CPU tensors (at top level or in dicts/lists/tuples) for arrays."""
    if type(obj) is torch.Tensor and _numpy_compatible(obj):
        return _TensorAsArray(obj.contiguous().numpy())
    if type(obj) is dict:
        return {k: _tensors_to_arrays(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_tensors_to_arrays(v) for v in obj)
    return obj


def _arrays_to_tensors(obj: Any) -> Any:
    """The inverse; each tensor gets its own writable memory (the shared
    buffer is read-only, and writing to it through torch would crash)."""
    if isinstance(obj, _TensorAsArray):
        return torch.from_numpy(obj.array.copy())
    if type(obj) is dict:
        return {k: _arrays_to_tensors(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_arrays_to_tensors(v) for v in obj)
    return obj


class RayObjectStoreTransport:
    """The large-object path of raydist's collectives (see raydist.core.collectives)."""

    def __init__(self, threshold_bytes: int = DEFAULT_OBJECT_STORE_THRESHOLD):
        self.threshold_bytes = threshold_bytes
        self._owned: Dict[bytes, ray.ObjectRef] = {}  # handle -> reference, until freed

    def wants(self, obj: Any) -> bool:
        return estimated_nbytes(obj) >= self.threshold_bytes

    def put(self, obj: Any) -> bytes:
        ref = ray.put(_tensors_to_arrays(obj))
        # Plain pickle (what torch's object collectives use) makes a reference
        # that never resolves in another process; Ray's cloudpickle works.
        handle = ray.cloudpickle.dumps(ref)
        self._owned[handle] = ref
        return handle

    def get(self, handle: bytes) -> Any:
        return _arrays_to_tensors(ray.get(ray.cloudpickle.loads(handle)))

    def free(self, handle: bytes) -> None:
        ref = self._owned.pop(handle, None)
        if ref is not None:
            # Once every rank has read the object, normal reference counting
            # may free it (readers mapping it zero-copy keep their buffer).
            drop_pickled_reference(ref)

    @property
    def owned_objects(self) -> int:
        return len(self._owned)
