"""When a step of training state is committed (Ray-free bookkeeping of the keeper).

A rank acknowledges step S once its copies are held in their places; S is
committed when every rank of the world acknowledged it. Only the newest
world counts: the first word from a newer attempt (a save or a load) drops
what an older world left uncommitted, so a rank of a dead world can never
complete a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from raydist.core.state_files import SnapshotMeta

Locations = Dict[str, List[int]]  # part key -> the holders (by index) that keep it


@dataclass
class Committed:
    """The newest committed step: what it holds and where each part is."""

    meta: SnapshotMeta
    locations: Locations
    world: int


@dataclass
class _Pending:
    meta: SnapshotMeta
    ranks: Set[int] = field(default_factory=set)
    holders: Dict[str, Set[int]] = field(default_factory=dict)  # part key -> the holders that keep it so far


class CommitLog:
    """Acknowledgements per step of the current world, and the last commit."""

    def __init__(self) -> None:
        self.world = -1
        self.committed: Optional[Committed] = None
        self._pending: Dict[int, _Pending] = {}
        self._dropped: Set[int] = set()  # steps of this world a rank could not keep

    def enter(self, world: int) -> Tuple[bool, List[int]]:
        """A word from ``world``: (whether it is current, the steps it aborted)."""
        if world < self.world:
            return False, []
        aborted: List[int] = []
        if world > self.world:
            aborted, self._pending, self._dropped = list(self._pending), {}, set()
            self.world = world
        return True, aborted

    def ack(self, world: int, rank: int, meta: SnapshotMeta, locations: Locations) -> Tuple[bool, List[int]]:
        """Rank ``rank`` holds its copies of ``meta.step``: (committed now, steps aborted)."""
        current, aborted = self.enter(world)
        if not current:
            return False, aborted
        if meta.step in self._dropped:
            return False, [*aborted, meta.step]
        pending = self._pending.setdefault(meta.step, _Pending(meta))
        if pending.meta.world_size != meta.world_size or not 0 <= rank < meta.world_size:
            raise ValueError(f"step {meta.step}: rank {rank} of {meta.world_size} does not fit a world of {pending.meta.world_size}")
        pending.ranks.add(rank)
        for key, holders in locations.items():  # (a shared part is acknowledged by a rank on every node)
            pending.holders.setdefault(key, set()).update(holders)
        if len(pending.ranks) < meta.world_size or not self._complete(pending):
            return False, aborted
        self.committed = Committed(pending.meta, {key: sorted(holders) for key, holders in pending.holders.items()}, world)
        # Older uncommitted steps can never be needed now.
        for step in [s for s in self._pending if s <= meta.step]:
            del self._pending[step]
        return True, aborted

    def was_dropped(self, step: int) -> bool:
        """Whether a rank of the current world could not keep ``step``."""
        return step in self._dropped

    def drop(self, world: int, step: int) -> List[int]:
        """A rank of ``world`` cannot keep ``step``: it will never be committed. The steps aborted."""
        current, aborted = self.enter(world)
        if not current:
            return aborted
        self._pending.pop(step, None)
        self._dropped.add(step)
        return [*aborted, step]

    @staticmethod
    def _complete(pending: _Pending) -> bool:
        return all(key in pending.holders for key in pending.meta.parts())

    def needed(self) -> Set[int]:
        """The steps holders must keep: the committed one and those being written."""
        steps = set(self._pending)
        if self.committed is not None:
            steps.add(self.committed.meta.step)
        return steps


class SendPlan:
    """Which steps the ranks send: every rank the same ones, none waiting for another.

    A rank that saves a step while one of its own is still on its way out
    cannot send it at once. The first rank to ask about a step decides for
    all: it is sent when that rank had nothing on its way out. A newer step
    thus goes out as soon as the last one is committed or given up, and no
    rank sends a step another let go. A step not sent may be asked for again
    (``ask_again``: the newest step of a loop that stops saving, at a call's
    end): sent once every rank of the world has asked for it.
    """

    def __init__(self) -> None:
        self._sent: Dict[Tuple[int, int], bool] = {}  # (world, step) -> whether its ranks send it
        self._asking: Dict[Tuple[int, int], Set[int]] = {}  # (world, step) -> the ranks that asked again

    def want(self, world: int, step: int, free: bool) -> bool:
        return self._sent.setdefault((world, step), free)

    def ask_again(self, world: int, rank: int, step: int, world_size: int) -> Optional[bool]:
        """True: sent (every rank asked, or it was already); None: not yet."""
        if self._sent.get((world, step)):
            return True
        asking = self._asking.setdefault((world, step), set())
        asking.add(rank)
        if len(asking) < world_size:
            return None
        self._sent[(world, step)] = True
        del self._asking[(world, step)]
        return True

    def settled(self, world: int, step: int) -> None:
        """``step`` of ``world`` is committed: nothing older is sent, nor any earlier world's."""
        for key in [key for key in [*self._sent, *self._asking] if key[0] < world or key[1] <= step]:
            self._sent.pop(key, None)
            self._asking.pop(key, None)

    def ended(self, world: int) -> None:
        """Every world before ``world`` is over."""
        for key in [key for key in [*self._sent, *self._asking] if key[0] < world]:
            self._sent.pop(key, None)
            self._asking.pop(key, None)


def store_room_warning(own: int, shared: int, local_ranks: int, multi_node: bool, capacity: float) -> Optional[str]:
    """The line a node's first saving rank prints when two steps of the state do not
    fit the node's object store: Ray then spills them to disk, and each save
    is many times slower. ``own``: one rank's per-rank bytes (its node's ranks
    alike); on several nodes the node also keeps as many other ranks' second copies."""
    need = 2 * (shared + local_ranks * own * (2 if multi_node else 1))
    if capacity <= 0 or need <= capacity:
        return None
    return (
        f"raydist: save_state keeps about {need / 2**30:.2f} GiB in this node's object store (two steps), "
        f"which holds {capacity / 2**30:.2f} GiB: Ray spills the rest to disk, and every save_state is many "
        "times slower (the next one waits for it). Give the object store room: ray start --object-store-memory, "
        "or ray.init(object_store_memory=...)"
    )
