"""``save_state`` / ``load_state``: training state that survives a failure.

``save_state`` copies the objects' state to host memory (the only part the
training loop waits for) and hands the copy to the active store, which
keeps it in the background. Tensors that only an optimizer given to the same
call changes (its parameters and its own state) may be copied in the
background too: the optimizer's next ``step()`` waits until they are
(``Snapshot.guarded``; a store that copies at once ignores it). Under
raydist the pool registers its store (copies held by actors that outlive
the ranks); elsewhere (plain torchrun or
python) the store is a directory, ``RAYDIST_STATE_DIR``; with neither, both
calls do nothing and ``load_state`` returns None, so a script stays portable.
"""

from __future__ import annotations

import copy
import io
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterable, Optional, Set, Tuple

from raydist.core import state_files
from raydist.core.state_files import SnapshotMeta

STATE_DIR_VAR = "RAYDIST_STATE_DIR"
STATE_KEEP_VAR = "RAYDIST_STATE_KEEP"
DEFAULT_KEEP = 2

__all__ = ["Snapshot", "StateSizeError", "StateStore", "load_state", "save_state", "set_load_gate", "set_store", "wait_committed"]


class StateSizeError(ValueError):
    """Per-rank state saved by one world size, loaded into another."""


@dataclass
class Snapshot:
    """One rank's host copy of one step: shared state and its own."""

    step: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    shared: Dict[str, Any] = field(default_factory=dict)
    own: Dict[str, Any] = field(default_factory=dict)
    # Storages (data pointers) that only the step of an optimizer given to save_state
    # changes, and that step waits for the store's copy (``StateStore.wait_copied``).
    guarded: FrozenSet[int] = frozenset()

    @property
    def meta(self) -> SnapshotMeta:
        return SnapshotMeta(self.step, self.world_size, tuple(sorted(self.shared)), tuple(sorted(self.own)))


class StateStore:
    """Where snapshots go; ``load`` gives the newest committed one as (meta, shared, own)."""

    def save(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot``, whose states are the objects' live ones: copy what is
        kept before returning (training changes them next), send it on later;
        the tensors in ``snapshot.guarded`` may be copied later, before
        ``wait_copied`` returns."""
        raise NotImplementedError

    def load(self, rank: int, world_size: int) -> Optional[Tuple[SnapshotMeta, Dict[str, Any], Dict[str, Any]]]:
        raise NotImplementedError

    def wait_copied(self) -> None:
        """Return once the last snapshot's guarded tensors are copied (an optimizer step may change them then)."""

    def wait_committed(self, timeout: Optional[float]) -> Optional[int]:
        """The newest committed step, once the newest step this rank saved is committed
        (at most ``timeout`` seconds; None: no limit; 0: at once)."""
        return None


_store: Optional[StateStore] = None
_dir_stores: Dict[str, "DirStore"] = {}
Observer = Callable[[str, Optional[int], float, float], None]  # ("save_state" or "load_state", step, started, ended)
_observe: Optional[Observer] = None
_load_gate: Optional[Callable[[], None]] = None


def set_load_gate(gate: Optional[Callable[[], None]]) -> None:
    """Called first in every ``load_state`` (raydist's workers park a function
    run ahead of its rank there, ``run_ahead``); None: no gate."""
    global _load_gate
    _load_gate = gate


def set_store(store: Optional[StateStore], observe: Optional[Observer] = None) -> None:
    """The store of this process (the pool sets its own in each worker), and
    who is told how long each ``save_state`` blocked and each ``load_state`` took."""
    global _store, _observe
    _store, _observe = store, observe


def _active() -> Optional[StateStore]:
    if _store is not None:
        return _store
    root = os.environ.get(STATE_DIR_VAR)
    if not root:
        return None
    if root not in _dir_stores:
        _dir_stores[root] = DirStore(root, int(os.environ.get(STATE_KEEP_VAR, DEFAULT_KEEP)))
    return _dir_stores[root]


def save_state(step: int, *, shared: Iterable[str] = (), **objects: Any) -> None:
    """Keep the state of ``objects`` as of ``step``; returns once it is copied to host
    memory, except the tensors of an optimizer among ``objects``, which may be
    copied after it returns: that optimizer's next ``step()`` (or ``load_state``)
    waits for the copy. Change them only through that step until then.

    ``objects``: things with ``state_dict()`` (modules, optimizers, schedulers,
    GradScaler, torch DCP's ``Stateful``) or plain picklable values. ``shared``
    names those whose state is the same on every rank (DDP's model and
    optimizer): kept once per node, and loadable into a world of any size.
    Every rank must call it with the same ``step``; the step is committed once
    every rank's copy is kept in two places. Without a store (no raydist, no
    ``RAYDIST_STATE_DIR``) it does nothing.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"save_state: step must be an int >= 0, got {step!r}")
    names = _check_shared(shared, objects)
    store = _active()
    if store is None:
        return
    rank, world_size, local_rank, local_world_size = _whoami()
    snapshot = Snapshot(step, rank, world_size, local_rank, local_world_size, guarded=_guard(objects.values()))
    for name, obj in objects.items():
        state = obj.state_dict() if hasattr(obj, "state_dict") else obj
        (snapshot.shared if name in names else snapshot.own)[name] = state
    started = time.time()
    store.save(snapshot)  # copies what it keeps: the store knows where the copy is best made
    if _observe is not None:
        _observe("save_state", step, started, time.time())


def wait_committed(timeout: Optional[float] = None) -> Optional[int]:
    """The newest committed step, once the newest step this rank saved is
    committed; None when none is, or without a store.

    ``save_state`` never waits for a commit: call this where the committed step
    matters (before a planned exit). A step saved while another was on its way
    out is not sent unless every rank asks for it again here, so call it on every
    rank at the same point of the loop, as a collective. ``timeout`` (seconds)
    bounds the wait; 0 does not wait: the step committed as of now.
    """
    if timeout is not None and timeout < 0:
        raise ValueError(f"wait_committed: timeout must be >= 0 or None, got {timeout!r}")
    store = _active()
    return None if store is None else store.wait_committed(timeout)


def load_state(**objects: Any) -> Optional[int]:
    """Load the newest committed step into ``objects`` and return the step, or None.

    None when nothing was committed (a first attempt), or without a store.
    Objects with ``load_state_dict`` get it called; a dict or list saved as a
    plain value is updated in place. Raises ``StateSizeError`` when per-rank
    state saved by a world of one size would be loaded into another.
    """
    if _load_gate is not None:  # before the store: a function run ahead has none yet
        _load_gate()
    store = _active()
    if store is None:
        return None
    started = time.time()
    step = _load_into(store, objects)
    if _observe is not None:
        _observe("load_state", step, started, time.time())
    return step


def _load_into(store: StateStore, objects: Dict[str, Any]) -> Optional[int]:
    rank, world_size, _, _ = _whoami()
    store.wait_copied()  # the objects are written below: a copy of them still being made reads them first
    found = store.load(rank, world_size)
    if found is None:
        return None
    meta, shared, own = found
    states = {**shared, **own}
    missing = sorted(set(objects) - set(states))
    if missing:
        raise KeyError(f"load_state: step {meta.step} holds no state named {', '.join(missing)} (it holds {', '.join(sorted(states))})")
    for name, obj in objects.items():
        _apply(name, obj, states[name])
    return meta.step


def check_world(meta: SnapshotMeta, world_size: int) -> None:
    """Per-rank state cannot be split or merged: refuse a world of another size."""
    if meta.own and meta.world_size != world_size:
        raise StateSizeError(
            f"load_state: step {meta.step} was saved by {meta.world_size} ranks with per-rank state "
            f"({', '.join(meta.own)}); this world has {world_size} ranks. Per-rank state loads only into a "
            f"world of {meta.world_size}: save what every rank holds the same with save_state(..., shared=[...]) "
            "(it loads into any size), and rebuild the rest (a data position: from the step)"
        )


def host_copy(value: Any, reuse: Any = None) -> Any:
    """A copy on the host that later training cannot change: tensors copied to
    CPU (into pinned memory when they come from CUDA), containers rebuilt.
    ``reuse``: an earlier copy no one reads any more, whose tensors take the
    new values where shape and dtype fit (memory already touched: no page
    faults, which cost more than the copy itself)."""
    import torch

    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        pin = tensor.device.type == "cuda"
        if (
            isinstance(reuse, torch.Tensor)
            and reuse.shape == tensor.shape
            and reuse.dtype == tensor.dtype
            and reuse.is_contiguous()
            and (not pin or reuse.is_pinned())  # asked only for CUDA: it may start CUDA
        ):
            return reuse.copy_(tensor)
        if tensor.device.type == "cpu" and tensor.layout != torch.strided:
            return tensor.clone()  # sparse and other layouts: copied as they are
        return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin).copy_(tensor)
    if isinstance(value, dict):
        old = reuse if isinstance(reuse, dict) else {}
        copied = {k: host_copy(v, old.get(k)) for k, v in value.items()}
        if type(value) is not dict:  # a module's OrderedDict keeps its _metadata (versions read by load)
            rebuilt = type(value)(copied)
            if hasattr(value, "_metadata"):
                rebuilt._metadata = copy.deepcopy(value._metadata)  # type: ignore[attr-defined]
            return rebuilt
        return copied
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        old_items = list(reuse) if isinstance(reuse, (list, tuple)) and len(reuse) == len(value) else [None] * len(value)
        return type(value)(host_copy(v, r) for v, r in zip(value, old_items))
    return copy.deepcopy(value)


def to_bytes(states: Dict[str, Any]) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(states, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> Dict[str, Any]:
    import torch

    # Our own snapshot (any picklable value), not an untrusted file.
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def _apply(name: str, obj: Any, state: Any) -> None:
    if hasattr(obj, "load_state_dict"):
        obj.load_state_dict(state)
    elif isinstance(obj, dict):
        obj.clear()
        obj.update(state)
    elif isinstance(obj, list):
        obj[:] = state
    else:
        raise TypeError(f"load_state: {name} is a {type(obj).__name__}: pass an object with load_state_dict(), or a dict or list")


def _check_shared(shared: Iterable[str], objects: Dict[str, Any]) -> frozenset:
    names = frozenset([shared] if isinstance(shared, str) else shared)
    unknown = sorted(names - set(objects))
    if unknown:
        raise ValueError(f"save_state: shared names {', '.join(unknown)}, which are not among the objects given")
    if not objects:
        raise ValueError("save_state: give the objects to keep as keywords (model=model, optimizer=optimizer)")
    return names


_guarded_optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _guard(objects: Iterable[Any]) -> FrozenSet[int]:
    """The storages of the optimizers among ``objects`` (their parameters and
    state), each optimizer's ``step()`` made to wait for the store's copy first."""
    torch = sys.modules.get("torch")
    if torch is None:
        return frozenset()
    pointers: Set[int] = set()
    for optimizer in objects:
        if not isinstance(optimizer, torch.optim.Optimizer):
            continue
        try:
            if optimizer not in _guarded_optimizers:
                optimizer.register_step_pre_hook(_wait_copied)
                _guarded_optimizers.add(optimizer)
            tensors = [p for group in optimizer.param_groups for p in group["params"]]
            tensors += [t for kept in optimizer.state.values() if isinstance(kept, dict) for t in kept.values()]
        except Exception:  # noqa: BLE001 - a wrapper without torch's hooks (never initialised as one): copied at once
            continue
        pointers.update(p for p in map(storage_pointer, tensors) if p is not None)
    return frozenset(pointers)


def storage_pointer(tensor: Any) -> Optional[int]:
    """Where a plain, strided CPU tensor's memory starts (None for any other: on a
    device, sparse, a subclass such as DTensor, or not a tensor)."""
    torch = sys.modules["torch"]
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.device.type != "cpu" or tensor.layout != torch.strided:
        return None
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # (mkldnn and other opaque memory)
        return None


def _wait_copied(*_: Any) -> None:
    store = _active()
    if store is not None:
        store.wait_copied()


def _whoami() -> Tuple[int, int, int, int]:
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    return int(env.get("RANK", "0")), world, int(env.get("LOCAL_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", str(world)))


class DirStore(StateStore):
    """Snapshots in a directory, written by each rank in the background (outside raydist)."""

    def __init__(self, root: str, keep: int):
        self.root, self.keep = root, max(1, keep)
        self._writing: Optional[threading.Thread] = None
        self._last: Optional[Snapshot] = None

    def save(self, snapshot: Snapshot) -> None:
        if self._writing is not None:
            self._writing.join()  # one step in flight at a time: memory stays bounded
        last = self._last  # written: its buffers take this step
        snapshot.shared = host_copy(snapshot.shared, last.shared if last else None)
        snapshot.own = host_copy(snapshot.own, last.own if last else None)
        self._last = snapshot
        # Not a daemon: the interpreter waits for the last write at exit.
        self._writing = threading.Thread(target=self._write, args=(snapshot,), name="raydist-state-write")
        self._writing.start()

    def _write(self, snapshot: Snapshot) -> None:
        meta = snapshot.meta
        parts = {state_files.rank_key(snapshot.rank): snapshot.own} if snapshot.own else {}
        if snapshot.shared and snapshot.rank == 0:
            parts[state_files.SHARED] = snapshot.shared
        committed = False
        for key, states in parts.items():
            committed = state_files.write_part(self.root, meta, key, to_bytes(states)) or committed
        if not parts:
            committed = state_files.commit_if_complete(self.root, meta)
        if committed:
            state_files.prune(self.root, self.keep)

    def wait_committed(self, timeout: Optional[float]) -> Optional[int]:
        if self._writing is not None:
            self._writing.join(timeout)
        meta = state_files.newest(self.root)
        return None if meta is None else meta.step

    def load(self, rank: int, world_size: int) -> Optional[Tuple[SnapshotMeta, Dict[str, Any], Dict[str, Any]]]:
        if self._writing is not None:
            self._writing.join()
        meta = state_files.newest(self.root)
        if meta is None:
            return None
        check_world(meta, world_size)
        shared = from_bytes(state_files.read_part(self.root, meta.step, state_files.SHARED)) if meta.shared else {}
        own = from_bytes(state_files.read_part(self.root, meta.step, state_files.rank_key(rank))) if meta.own else {}
        return meta, shared, own
