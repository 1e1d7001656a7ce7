"""Which rows of an epoch each rank reads, from a position that survives a
change of world size.

An epoch's order is a function of the number of rows, the epoch and the
seed only (the same permutation as torch's ``DistributedSampler``:
``torch.randperm(rows)`` seeded with ``seed + epoch``). A position is an
offset into that order: every row before it was consumed by a committed
step, none after it. A world of ``W`` ranks reads from the offset
interleaved, as torch's sampler does: rank ``r`` takes positions
``offset + r``, ``offset + r + W``, ... So ``k`` batches of ``B`` rows on
every rank consume exactly the positions ``[offset, offset + k*W*B)``: the
position after ``k`` batches is the same number on every rank (it is saved
once, as shared state) and means the same to a world of another size, which
goes on reading from it.

The rows left at an epoch's end may not divide by the world size. None is
dropped or repeated to even them out: a rank may get fewer rows, and where it
would get one batch fewer than the others (or none at all, when fewer rows
than ranks remain) it is given an empty batch, so that every rank takes the
same number of batches and no collective waits forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

__all__ = ["EpochPlan", "Position", "epoch_order"]


@dataclass(frozen=True)
class Position:
    """Where an epoch stands: ``offset`` rows of epoch ``epoch``'s order consumed."""

    epoch: int
    offset: int


def epoch_order(rows: int, epoch: int, seed: int, shuffle: bool) -> List[int]:
    """The row indices of ``epoch`` in the order they are read (torch's
    ``DistributedSampler`` permutation, so the same seed gives the same rows)."""
    if not shuffle:
        return list(range(rows))
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(rows, generator=generator).tolist()


@dataclass(frozen=True)
class EpochPlan:
    """One world's reading of one epoch from ``offset``: ``rows`` in the epoch,
    ``world_size`` ranks; ``drop_last`` leaves out the last ``< world_size``
    rows so that every rank gets the same number (torch's meaning)."""

    rows: int
    offset: int
    world_size: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.offset <= self.rows:
            raise ValueError(f"the position {self.offset} is outside an epoch of {self.rows} rows")

    @property
    def remaining(self) -> int:
        """The rows this world reads: those after the offset, less the dropped tail."""
        left = self.rows - self.offset
        return left - left % self.world_size if self.drop_last else left

    def positions(self, rank: int) -> range:
        """Positions in the epoch's order that ``rank`` reads, in order."""
        return range(self.offset + rank, self.offset + self.remaining, self.world_size)

    def batches(self, batch_size: int) -> int:
        """Batches every rank takes: rank 0 has the most rows; the others match it (an empty batch where short)."""
        return -(-len(self.positions(0)) // batch_size)

    def after(self, batches: int, batch_size: int) -> int:
        """The position once every rank took ``batches`` batches of ``batch_size``:
        the epoch's end (dropped rows included) once all are taken."""
        if batches >= self.batches(batch_size):
            return self.rows
        return self.offset + batches * self.world_size * batch_size
