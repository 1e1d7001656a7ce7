"""A part of a snapshot as Ray's object store keeps it: the state with every
tensor replaced by a slot, and the tensors' bytes as flat numpy arrays.

Ray writes numpy arrays into its shared memory out of band (one copy, no
pickling of the data) and reads them back without a copy; a tensor pickled
the ordinary way goes through ``torch.save`` into a byte string first. So a
rank ``ray.put``s a packed part straight from its live tensors (the only copy
its loop waits for), and a holder keeps the read-only arrays it got back:
on the same node that is the very same memory.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, AbstractSet, Any, List, Optional, Tuple

from raydist.core.state import host_copy, storage_pointer, to_bytes

if TYPE_CHECKING:  # imported where used: the driver imports this module without torch
    import numpy as np
    import torch

Packed = Tuple[Any, List["np.ndarray"]]  # (the state with slots, the tensors' bytes)


@dataclass(frozen=True)
class _Slot:
    """Where a tensor was: its index among the arrays, its dtype's name and
    its shape. The name, not the ``torch.dtype``: the keeper and the holders
    unpickle parts without importing torch (seconds of CPU and ~300 MB each)."""

    index: int
    dtype: str  # "float32": torch.float32's name in the torch module
    shape: Tuple[int, ...]


def pack(states: Any) -> Packed:
    """Views of the live tensors' bytes (no copy of a contiguous CPU tensor; a
    device tensor is copied to host memory first, pinned where it comes from
    CUDA): ``ray.put`` of it is the one copy."""
    arrays: List[np.ndarray] = []
    return _pack(states, arrays), arrays


@dataclass
class Deferred:
    """A part to ``ray.put`` later: views of the guarded tensors (their storage
    in ``guarded``), whose versions must not move before the put has read
    them, and copies of everything else, made when it was packed."""

    packed: Packed
    watched: List[Tuple["torch.Tensor", int]]  # (tensor, its version when packed)

    def changed(self) -> int:
        """How many watched tensors were changed in place since they were packed."""
        return sum(tensor._version != version for tensor, version in self.watched)


def pack_later(states: Any, guarded: AbstractSet[int]) -> Optional[Deferred]:
    """``states`` packed for a put in the background, or None where nothing in it is guarded."""
    if not any(storage_pointer(tensor) in guarded for tensor in tensors_of(states)):
        return None
    arrays: List[np.ndarray] = []
    watched: List[Tuple[torch.Tensor, int]] = []
    try:
        skeleton = _pack(states, arrays, guarded, watched)
    except Exception:  # noqa: BLE001 - a value deepcopy cannot take, a tensor subclass: put it now
        return None
    return Deferred((skeleton, arrays), watched)


def unpack(packed: Packed) -> Any:
    """The state with its tensors rebuilt in memory of their own (the arrays
    may be read-only shared memory, which training must never write)."""
    skeleton, arrays = packed
    return _unpack(skeleton, arrays)


def on_device(value: Any) -> bool:
    """Whether a state holds a tensor off the host (a CUDA one: copied through pinned memory)."""
    return any(tensor.device.type != "cpu" for tensor in tensors_of(value))


def tensor_bytes(value: Any) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors_of(value))


def tensors_of(value: Any) -> List["torch.Tensor"]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def nbytes(packed: Packed) -> int:
    return sum(int(array.nbytes) for array in packed[1])


def packed_to_bytes(packed: Packed) -> bytes:
    """The part in ``state_dir``'s format (``torch.save`` of the state)."""
    return to_bytes(unpack(packed))


Watched = Optional[List[Tuple["torch.Tensor", int]]]


def _pack(value: Any, arrays: List["np.ndarray"], guarded: AbstractSet[int] = frozenset(), watched: Watched = None) -> Any:
    """``guarded``/``watched``: a guarded tensor's bytes are a view, read later; any other
    is copied now, and so is every plain value (training may change those too; the
    containers and slots are new already)."""
    import torch

    if isinstance(value, torch.Tensor):
        if watched is None:
            return _pack_tensor(value, arrays)
        pointer = storage_pointer(value)
        if pointer is None:  # a subclass (DTensor, ...) or on a device: not read later
            raise TypeError(f"not deferred: a {type(value).__name__} on {value.device}")
        if pointer in guarded and value.is_contiguous():
            watched.append((value, value._version))
            return _pack_tensor(value, arrays)
        return _pack_tensor(host_copy(value), arrays)
    if isinstance(value, dict):
        packed = {k: _pack(v, arrays, guarded, watched) for k, v in value.items()}
        if type(value) is dict:
            return packed
        rebuilt = type(value)(packed)
        if hasattr(value, "_metadata"):  # a module's OrderedDict: versions read by load_state_dict
            metadata = value._metadata
            rebuilt._metadata = metadata if watched is None else copy.deepcopy(metadata)  # type: ignore[attr-defined]
        return rebuilt
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_pack(v, arrays, guarded, watched) for v in value)
    return value if watched is None else copy.deepcopy(value)  # pickled as it is when the part is put: now, or later


def _pack_tensor(value: "torch.Tensor", arrays: List["np.ndarray"]) -> Any:
    import numpy as np
    import torch

    tensor = value.detach()
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested:
        return host_copy(tensor)  # rare kinds: pickled whole
    if tensor.device.type != "cpu":
        tensor = host_copy(tensor)
    tensor = tensor.resolve_conj().resolve_neg()  # lazy bits: the bytes as the values read (no copy without them)
    flat = tensor.contiguous().reshape(-1)
    arrays.append(flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, dtype=np.uint8))
    return _Slot(len(arrays) - 1, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))


def _unpack(value: Any, arrays: List["np.ndarray"]) -> Any:
    import numpy as np
    import torch

    if isinstance(value, _Slot):
        dtype = getattr(torch, value.dtype)
        data = torch.from_numpy(np.array(arrays[value.index], copy=True))
        return data.view(dtype).reshape(value.shape) if data.numel() else torch.empty(value.shape, dtype=dtype)
    if isinstance(value, dict):
        unpacked = {k: _unpack(v, arrays) for k, v in value.items()}
        if type(value) is dict:
            return unpacked
        rebuilt = type(value)(unpacked)
        if hasattr(value, "_metadata"):
            rebuilt._metadata = value._metadata  # type: ignore[attr-defined]
        return rebuilt
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_unpack(v, arrays) for v in value)
    return value
