"""Durable snapshots in a directory: one folder per step, committed by a marker.

``<dir>/step_<12 digits>/`` holds ``meta.json`` (world size, the names of
the shared and the per-rank objects), ``shared.pt`` (what every rank holds
the same) and ``rank_<5 digits>.pt`` per rank; each file is written under a
temporary name and renamed when complete. ``COMMITTED`` is written last,
once every part is there: a folder without it is a snapshot cut short, and
is never loaded. ``root`` is a local path or a URI (``state_fs``: on an
object store, with no rename, the marker alone commits). Ray-free: used by
a plain torchrun/python script and by the pool's keeper alike.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from raydist.core.state_fs import open_location

MARKER = "COMMITTED"
META = "meta.json"
SHARED = "shared"
_STEP_DIR = re.compile(r"^\.?step_(\d{12})(\.tmp-\w+)?$")  # a folder, or one being written


@dataclass(frozen=True)
class SnapshotMeta:
    """What a committed step holds: its world size and the objects' names."""

    step: int
    world_size: int
    shared: Tuple[str, ...]
    own: Tuple[str, ...]

    def parts(self) -> List[str]:
        """The part keys a complete snapshot has: ``shared`` and/or one per rank."""
        keys = [SHARED] if self.shared else []
        return keys + ([rank_key(r) for r in range(self.world_size)] if self.own else [])

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "world_size": self.world_size, "shared": list(self.shared), "own": list(self.own)})

    @classmethod
    def from_json(cls, text: str) -> "SnapshotMeta":
        data = json.loads(text)
        return cls(int(data["step"]), int(data["world_size"]), tuple(data["shared"]), tuple(data["own"]))


def rank_key(rank: int) -> str:
    return f"rank_{rank:05d}"


def step_dir(root: str, step: int) -> str:
    storage, base = open_location(root)
    return storage.join(base, _step_name(step))


def _step_name(step: int) -> str:
    return f"step_{step:012d}"


def write_part(root: str, meta: SnapshotMeta, key: str, data: bytes) -> bool:
    """One part of ``meta.step``; commits the step when this made it complete
    (then keeps only the newest ``keep`` committed, see ``prune``). True: committed."""
    storage, base = open_location(root)
    folder = storage.join(base, _step_name(meta.step))
    storage.makedirs(folder)
    storage.write(storage.join(folder, META), meta.to_json().encode())
    storage.write(storage.join(folder, f"{key}.pt"), data)
    return commit_if_complete(root, meta)


def commit_if_complete(root: str, meta: SnapshotMeta) -> bool:
    """Write the marker once every part is in place (any writer may see it complete first)."""
    storage, base = open_location(root)
    folder = storage.join(base, _step_name(meta.step))
    present = set(storage.listdir(folder))
    if not all(f"{key}.pt" in present for key in meta.parts()):
        return False
    storage.write(storage.join(folder, MARKER), b"")
    return True


def write_snapshot(root: str, meta: SnapshotMeta, parts: Dict[str, bytes], keep: int) -> None:
    """A whole step from one writer (the pool's keeper), then the older ones pruned.
    On a disk: a temporary folder renamed into place once complete (replacing a
    cut-short one). On an object store (no rename): the step's folder emptied,
    its marker first, then the parts and the marker written last."""
    storage, base = open_location(root)
    final = storage.join(base, _step_name(meta.step))
    storage.makedirs(base)
    folder = storage.join(base, f".{_step_name(meta.step)}.tmp-{uuid.uuid4().hex[:8]}") if storage.renames else final
    if not storage.renames:
        storage.remove(storage.join(final, MARKER))  # never a marker over a mix of two writes
        storage.remove(final)
    storage.makedirs(folder)
    for key, data in parts.items():
        storage.write(storage.join(folder, f"{key}.pt"), data)
    storage.write(storage.join(folder, META), meta.to_json().encode())
    storage.write(storage.join(folder, MARKER), b"")
    if storage.renames:
        storage.remove(final)
        storage.rename(folder, final)
    prune(root, keep)


def committed_steps(root: str) -> List[int]:
    """The committed steps under ``root``, oldest first (a cut-short one is not listed)."""
    storage, base = open_location(root)
    steps = []
    for name in storage.listdir(base):
        match = _STEP_DIR.match(name)
        if match and not match.group(2) and storage.exists(storage.join(base, name, MARKER)):
            steps.append(int(match.group(1)))
    return sorted(steps)


def newest(root: str) -> Optional[SnapshotMeta]:
    """The newest committed step's description, or None."""
    steps = committed_steps(root)
    if not steps:
        return None
    storage, base = open_location(root)
    return SnapshotMeta.from_json(storage.read(storage.join(base, _step_name(steps[-1]), META)).decode())


def read_part(root: str, step: int, key: str) -> bytes:
    storage, base = open_location(root)
    return storage.read(storage.join(base, _step_name(step), f"{key}.pt"))


def prune(root: str, keep: int) -> None:
    """Keep the newest ``keep`` committed steps, and anything newer (being written);
    remove older committed steps and cut-short ones older than the newest committed."""
    steps = committed_steps(root)
    if not steps:
        return
    storage, base = open_location(root)
    kept = set(steps[-keep:])
    for name in storage.listdir(base):
        match = _STEP_DIR.match(name)
        if match and int(match.group(1)) not in kept and int(match.group(1)) < steps[-1]:
            storage.remove(storage.join(base, name))
