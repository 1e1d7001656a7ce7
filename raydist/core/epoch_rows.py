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
from typing import Any, List, Tuple

__all__ = ["ChunkedOrder", "EpochPlan", "Position", "epoch_order", "locate"]


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

    def step_positions(self, rank: int, step: int, batch_size: int) -> range:
        """Positions ``rank`` reads in ``step`` (from 0) when each rank's batch is one
        run of the order (Ray Data shards: a run of rows touches few blocks). A step
        takes the next ``world_size * batch_size`` positions, rank 0 first; the last
        step splits what is left as evenly as it goes (a rank may get none)."""
        start = self.offset + step * self.world_size * batch_size
        left = self.offset + self.remaining - start
        if left >= self.world_size * batch_size:
            return range(start + rank * batch_size, start + (rank + 1) * batch_size)
        share, extra = divmod(max(left, 0), self.world_size)
        first = start + rank * share + min(rank, extra)
        return range(first, first + share + (rank < extra))

    def after(self, batches: int, batch_size: int) -> int:
        """The position once every rank took ``batches`` batches of ``batch_size``:
        the epoch's end (dropped rows included) once all are taken."""
        if batches >= self.batches(batch_size):
            return self.rows
        return self.offset + batches * self.world_size * batch_size


class ChunkedOrder:
    """An epoch's order for data too large for one permutation of its rows
    (Ray Data datasets): the rows cut into runs of ``chunk`` consecutive rows,
    the runs shuffled, and the rows within each run (``shuffle``); memory is
    per run, not per row. A function of the number of rows, the epoch and the
    seed only, never of how the data is blocked."""

    def __init__(self, rows: int, epoch: int, seed: int, shuffle: bool, chunk: int = 1024):
        import numpy as np

        self.rows, self.epoch, self.seed, self.shuffle, self.chunk = rows, epoch, seed, shuffle, chunk
        count = -(-rows // chunk)
        self._runs = np.random.default_rng([seed, epoch]).permutation(count) if shuffle else np.arange(count)
        sizes = np.minimum(chunk, rows - self._runs * chunk)
        self._starts = np.concatenate([[0], np.cumsum(sizes)])  # position where each run in order begins

    def rows_at(self, start: int, stop: int) -> Any:
        """The row indices at positions ``[start, stop)`` (a numpy array)."""
        import numpy as np

        parts: List[Any] = []
        index = int(np.searchsorted(self._starts, start, side="right")) - 1
        while start < stop:
            run = int(self._runs[index])
            size = int(self._starts[index + 1] - self._starts[index])
            inner = np.random.default_rng([self.seed, self.epoch, run]).permutation(size) if self.shuffle else np.arange(size)
            begin = start - int(self._starts[index])
            end = min(size, begin + stop - start)
            parts.append(run * self.chunk + inner[begin:end])
            start += end - begin
            index += 1
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def locate(rows: Any, block_starts: Any) -> Tuple[Any, Any]:
    """For global row indices ``rows``: each one's block and its row in that
    block, given where each block begins (``block_starts``, ascending, from 0)."""
    import numpy as np

    blocks = np.searchsorted(block_starts, rows, side="right") - 1
    return blocks, rows - np.asarray(block_starts)[blocks]
