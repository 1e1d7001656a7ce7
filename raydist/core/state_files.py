"""Durable snapshots in a directory: one folder per step, committed by a marker.

``<dir>/step_<12 digits>/`` holds ``meta.json`` (world size, the names of
the shared and the per-rank objects), ``shared.pt`` (what every rank holds
the same) and ``rank_<5 digits>.pt`` per rank; each file is written under a
temporary name and renamed when complete. ``COMMITTED`` is written last,
once every part is there: a folder without it is a snapshot cut short, and
is never loaded. Ray-free: used by a plain torchrun/python script and by
the pool's keeper alike.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

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
    return os.path.join(root, f"step_{step:012d}")


def write_atomic(path: str, data: bytes) -> None:
    """``data`` at ``path``, never seen half-written: a temporary name, then a rename."""
    temporary = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def write_part(root: str, meta: SnapshotMeta, key: str, data: bytes) -> bool:
    """One part of ``meta.step``; commits the step when this made it complete
    (then keeps only the newest ``keep`` committed, see ``prune``). True: committed."""
    folder = step_dir(root, meta.step)
    os.makedirs(folder, exist_ok=True)
    write_atomic(os.path.join(folder, META), meta.to_json().encode())
    write_atomic(os.path.join(folder, f"{key}.pt"), data)
    return commit_if_complete(root, meta)


def commit_if_complete(root: str, meta: SnapshotMeta) -> bool:
    """Write the marker once every part is in place (any writer may see it complete first)."""
    folder = step_dir(root, meta.step)
    present = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    if not all(f"{key}.pt" in present for key in meta.parts()):
        return False
    write_atomic(os.path.join(folder, MARKER), b"")
    return True


def write_snapshot(root: str, meta: SnapshotMeta, parts: Dict[str, bytes], keep: int) -> None:
    """A whole step from one writer (the pool's keeper): a temporary folder
    renamed into place once complete (replacing a cut-short one), then the older ones pruned."""
    os.makedirs(root, exist_ok=True)
    temporary = os.path.join(root, f".step_{meta.step:012d}.tmp-{uuid.uuid4().hex[:8]}")
    os.makedirs(temporary)
    for key, data in parts.items():
        write_atomic(os.path.join(temporary, f"{key}.pt"), data)
    write_atomic(os.path.join(temporary, META), meta.to_json().encode())
    write_atomic(os.path.join(temporary, MARKER), b"")
    shutil.rmtree(step_dir(root, meta.step), ignore_errors=True)
    os.rename(temporary, step_dir(root, meta.step))
    prune(root, keep)


def committed_steps(root: str) -> List[int]:
    """The committed steps under ``root``, oldest first (a cut-short one is not listed)."""
    if not os.path.isdir(root):
        return []
    steps = []
    for name in os.listdir(root):
        match = _STEP_DIR.match(name)
        if match and not match.group(2) and os.path.exists(os.path.join(root, name, MARKER)):
            steps.append(int(match.group(1)))
    return sorted(steps)


def newest(root: str) -> Optional[SnapshotMeta]:
    """The newest committed step's description, or None."""
    steps = committed_steps(root)
    if not steps:
        return None
    with open(os.path.join(step_dir(root, steps[-1]), META)) as file:
        return SnapshotMeta.from_json(file.read())


def read_part(root: str, step: int, key: str) -> bytes:
    with open(os.path.join(step_dir(root, step), f"{key}.pt"), "rb") as file:
        return file.read()


def prune(root: str, keep: int) -> None:
    """Keep the newest ``keep`` committed steps, and anything newer (being written);
    remove older committed steps and cut-short ones older than the newest committed."""
    steps = committed_steps(root)
    if not steps:
        return
    kept = set(steps[-keep:])
    for name in os.listdir(root):
        match = _STEP_DIR.match(name)
        if match and int(match.group(1)) not in kept and int(match.group(1)) < steps[-1]:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
