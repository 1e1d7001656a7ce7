"""``raydist.DistributedSampler``: torch's ``DistributedSampler`` whose place in
the epoch is training state.

Give it to ``save_state`` / ``load_state`` (as shared state: the position is
the same on every rank) and an epoch cut by a failure goes on where the last
committed step left it, in a world of the same size or another, each row read
by a committed step exactly once (``epoch_rows`` says how). A ``DataLoader``
draws indices ahead of the batches the loop takes (``num_workers *
prefetch_factor`` batches), so the sampler cannot count the rows consumed by
itself: the loop iterates the loader through ``sampler.track(loader)``, which
counts the batches it hands out.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import torch
import torch.utils.data

from raydist.core.epoch_rows import EpochPlan, epoch_order

__all__ = ["DistributedSampler"]

_END = object()


class DistributedSampler(torch.utils.data.DistributedSampler):
    """torch's ``DistributedSampler`` (same arguments, ``set_epoch``, the same
    rows in the same order for a world that does not change, where the rows
    divide by the world size), plus:

    - ``state_dict`` / ``load_state_dict``: the epoch and the rows of it
      consumed, for ``save_state(..., shared=["data"], data=sampler)``;
    - ``track(loader)``: iterate the loader through it, so the position counts
      the batches the loop took, not those the loader fetched ahead;
    - no row repeated to even out the ranks: where the rows left do not divide
      by the world size, a rank reads fewer rows, and ``track`` gives it an
      empty batch where it would otherwise take one batch fewer than the
      others. ``drop_last=True`` drops the ``< world_size`` rows left instead.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self._start = 0  # where the next iteration of this epoch starts (a loaded position)
        self._plan: Optional[EpochPlan] = None  # the iteration under way, once the loader drew from it
        self._consumed: Optional[int] = None  # the position after the batches track handed out
        self._tracking = False  # track is iterating the loader: the draws are counted as batches taken
        self._untracked = False  # iterated without track: the position cannot be known

    def __repr__(self) -> str:
        return (
            f"raydist.DistributedSampler(rank={self.rank}, num_replicas={self.num_replicas}, epoch={self.epoch}, position={self.position})"
        )

    @property
    def position(self) -> int:
        """Rows of this epoch's order consumed by the batches handed out so far."""
        return self._consumed if self._consumed is not None else self._start

    def _rows(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # a map-style dataset, as torch's sampler requires

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads; a new epoch starts at its first row,
        the epoch of a loaded position where that position left it."""
        if epoch != self.epoch:
            self._start = 0
            self._consumed = None
        self.epoch = epoch

    def _next_start(self) -> int:
        """Where the next iteration starts: the position, or the epoch's first row
        when this epoch was read to its end here (again, as torch's sampler does)."""
        start = self.position
        return 0 if start >= self._rows() and self._plan is not None else start

    def _begin(self) -> EpochPlan:
        start = self._next_start()
        self._start, self._consumed = start, None
        self._plan = EpochPlan(self._rows(), start, self.num_replicas, self.drop_last)
        self.num_samples = len(self._plan.positions(self.rank))
        return self._plan

    def __iter__(self) -> Iterator[int]:
        self._untracked = not self._tracking
        plan = self._begin()
        order = epoch_order(self._rows(), self.epoch, self.seed, self.shuffle)
        return iter([order[p] for p in plan.positions(self.rank)])

    def __len__(self) -> int:
        return len(EpochPlan(self._rows(), self._next_start(), self.num_replicas, self.drop_last).positions(self.rank))

    def track(self, loader: torch.utils.data.DataLoader) -> Iterator[Any]:
        """The loader's batches, counted as the loop takes them, plus an empty batch
        where this rank ran out before the others (every rank takes as many)."""
        batch_size = loader.batch_size
        if batch_size is None or getattr(loader, "sampler", None) is not self:
            raise ValueError("track: the loader must be DataLoader(dataset, batch_size=..., sampler=this sampler)")
        if loader.drop_last:
            raise ValueError(
                "track: DataLoader(drop_last=True) drops each rank's short last batch, whose rows would count as read; "
                "every rank takes as many batches without it (DistributedSampler(drop_last=True) drops the rows that do not divide by the world)"
            )
        if not getattr(loader, "in_order", True):
            raise ValueError(
                "track: DataLoader(in_order=False) hands out batches out of order: the batches taken would not name the rows read"
            )
        taken, last = 0, None
        self._tracking = True
        try:  # the loader draws from the sampler by its first batch (a worker pool at once)
            iterator = iter(loader)
            batch = next(iterator, _END)
        finally:
            self._tracking = False
        while batch is not _END:
            taken += 1
            self._consumed = self._taken_plan().after(taken, batch_size)
            last = batch
            yield batch
            batch = next(iterator, _END)
        plan = self._taken_plan()
        while taken < plan.batches(batch_size):
            taken += 1
            self._consumed = plan.after(taken, batch_size)
            yield _empty_like(last if last is not None else _one_batch(loader))

    def _taken_plan(self) -> EpochPlan:
        if self._plan is None:
            raise RuntimeError("track: the loader never drew from this sampler")
        return self._plan

    def state_dict(self) -> Dict[str, Any]:
        """The epoch and its rows consumed (plus what must match to load it)."""
        if self._untracked:
            raise RuntimeError(
                "raydist.DistributedSampler: iterate the loader through sampler.track(loader) to save the sampler: "
                "a DataLoader draws rows ahead of the batches the loop took, so its position is not the loop's"
            )
        return {"epoch": self.epoch, "position": self.position, "rows": self._rows(), "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Go on from a saved position (any world size); the dataset and its order must be the same."""
        saved = (state["rows"], state["seed"], state["shuffle"])
        if saved != (self._rows(), self.seed, self.shuffle):
            raise ValueError(
                f"raydist.DistributedSampler: the state was saved for {state['rows']} rows, seed {state['seed']}, "
                f"shuffle={state['shuffle']}; this sampler has {self._rows()} rows, seed {self.seed}, shuffle={self.shuffle}"
            )
        self.epoch, self._start, self._consumed, self._plan = int(state["epoch"]), int(state["position"]), None, None


def _one_batch(loader: torch.utils.data.DataLoader) -> Any:
    """A batch of one row, a template for an empty one (this rank read no row)."""
    return loader.collate_fn([loader.dataset[0]])


def _empty_like(batch: Any) -> Any:
    """``batch`` with no rows: tensors and arrays cut to length 0, containers of
    them rebuilt, a list of one value per row emptied; anything else refused
    (handing it out again would train its rows twice)."""
    if hasattr(batch, "shape") and hasattr(batch, "__getitem__"):
        return batch[:0]
    if isinstance(batch, dict):
        return type(batch)((key, _empty_like(value)) for key, value in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_empty_like(value) for value in batch))
    if isinstance(batch, (list, tuple)):
        if all(hasattr(v, "shape") or isinstance(v, (dict, list, tuple)) for v in batch):
            return type(batch)(_empty_like(value) for value in batch)
        return type(batch)()  # one value per row (a collated list of strings)
    raise TypeError(
        f"track: cannot make an empty batch like a {type(batch).__name__} for a rank with no rows left in the epoch's last step; "
        "collate to tensors, arrays, or dicts, lists and tuples of them"
    )
