"""A Ray Data shard whose place in the epoch is training state
(``DataConfig(exactly_once=True)``).

The dataset is read once into blocks the driver holds (Arrow tables in Ray's
object store) for the whole call, its attempts included. An epoch's order
is ``epoch_rows.ChunkedOrder`` of the rows (never of the blocks), so a
position is an offset that means the same to every world. Each step takes
the next ``world_size * batch_size`` positions, ``batch_size`` of them per
rank (within one or two runs of 1,024 consecutive rows of the dataset, so
in the blocks that hold those); the last step of an epoch splits
what is left evenly, an empty batch where a rank gets no row. Given to
``save_state`` (shared) and ``load_state``, a shard resumes the epoch where
the last committed step left it, in a world of any size.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from itertools import accumulate
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from raydist.core.epoch_rows import ChunkedOrder, EpochPlan, Position, locate
from raydist.pool.worker.datasets import DatasetShard, timed

__all__ = ["PositionalShard"]

RUN = 1024  # rows in one run of the epoch's order (epoch_rows.ChunkedOrder's chunk)
UNSUPPORTED = ("local_shuffle_buffer_size", "local_shuffle_seed")


Block = Tuple[Any, int, int]  # a block's ref, its first row read, the rows read


def read_blocks(dataset: Any) -> List[Block]:
    """The dataset's blocks in order, each as (ref, first row, rows): Ray Data's
    bundles may hold a slice of a block. Read with Ray Data's ``preserve_order``
    (on a copy: the user's dataset is left as it is), so the rows come in the
    same order each time it is read (another call, another run resuming from
    a ``state_dir``): a position then means the same rows. The caller owns the
    blocks."""
    with warnings.catch_warnings():  # copying a context reads its deprecated fields
        warnings.simplefilter("ignore", DeprecationWarning)
        ordered = type(dataset).copy(dataset, _deep_copy=True)
    ordered.context.execution_options.preserve_order = True
    blocks: List[Block] = []
    for bundle in ordered.materialize().iter_internal_ref_bundles():
        cuts = getattr(bundle, "slices", None) or [None] * len(bundle.blocks)
        for entry, cut in zip(bundle.blocks, cuts):
            ref, meta = (entry.ref, entry.metadata) if hasattr(entry, "ref") else entry  # a pair before Ray 2.5x
            first, stop = (cut.start_offset, cut.end_offset) if cut is not None else (0, meta.num_rows)
            blocks.append((ref, first, stop - first))
    return blocks


class BlockHolder:
    """A Ray actor that reads a dataset and owns its blocks, for ``split_dataset``:
    the ranks borrow them through its answer (tracked by Ray, none pinned). It
    ends itself, its blocks with it, once each of the ``ranks`` said its call
    is done with them (``done``); ``HeldBlocks`` ends it where one never can."""

    def __init__(self, dataset: Any, ranks: int) -> None:
        self.blocks = read_blocks(dataset)
        self.ranks = ranks
        self.finished: Set[int] = set()

    def read(self) -> List[Block]:
        return self.blocks

    def done(self, rank: int) -> None:
        self.finished.add(rank)
        if len(self.finished) >= self.ranks:
            import ray

            ray.actor.exit_actor()


class HeldBlocks:
    """This process's side of the ``BlockHolder`` actors: the ones it reads from
    (each told when this rank's call is done) and, on rank 0, the ones it started.
    One of those is killed at once when rank 0's call failed (the others' reads
    fail with it), else at rank 0's next call's end, should a rank of its call
    have died before saying it was done."""

    def __init__(self) -> None:
        self._reading: List[Tuple[Any, int]] = []  # (holder, this rank) of the call under way
        self._started: List[Any] = []  # started by this process in the call under way
        self._earlier: List[Any] = []  # started in an earlier call: ended by now, or never will be

    def started(self, holder: Any) -> None:
        self._started.append(holder)

    def reading(self, holder: Any, rank: int) -> None:
        self._reading.append((holder, rank))

    def end_call(self, failed: bool) -> None:
        import ray

        for holder, rank in self._reading:
            try:
                holder.done.remote(rank)
            except Exception:  # noqa: BLE001 - already gone
                pass
        stale, self._earlier = self._earlier, [] if failed else self._started
        for holder in stale + (self._started if failed else []):
            try:
                ray.kill(holder)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._reading, self._started = [], []


def _arrow_block(ref: Any) -> Any:
    """A block as an Arrow table (Ray Data may hold pandas blocks too)."""
    import ray
    from ray.data.block import BlockAccessor

    return BlockAccessor.for_block(ray.get(ref)).to_arrow()


class PositionalShard(DatasetShard):
    """This rank's reading of a dataset in its epochs' order, from a position
    that ``state_dict`` / ``load_state_dict`` carry across failures and world
    sizes. ``epoch``: the epoch the next ``iter_batches`` reads."""

    def __init__(
        self,
        blocks: Sequence[Block],
        name: str,
        rank: int,
        world_size: int,
        shuffle: bool = False,
        seed: int = 0,
        fetch: Callable[[Any], Any] = _arrow_block,
    ) -> None:
        super().__init__(None, name, checked=True)
        self.refs = [ref for ref, _, _ in blocks]
        self.firsts = [first for _, first, _ in blocks]  # a block may be read from a row on (a slice)
        counts = [count for _, _, count in blocks]
        self.block_starts: List[int] = list(accumulate(counts, initial=0))[:-1]  # where each block's rows begin
        self.rows = sum(counts)
        self.rank, self.world_size, self.shuffle, self.seed = rank, world_size, shuffle, seed
        self.fetch = fetch
        # The blocks kept: two runs' worth (a batch spans one or two runs of consecutive rows), at least 4.
        self.cached = max(4, 2 * -(-RUN // max(1, min(counts, default=1))) + 2)
        self._at = Position(0, 0)
        self._tables: "OrderedDict[int, Any]" = OrderedDict()

    def __getattr__(self, attribute: str) -> Any:
        raise AttributeError(
            f"a shard read exactly once (DataConfig(exactly_once=True)) has no {attribute!r}: it reads with iter_batches / iter_torch_batches"
        )

    def __getstate__(self) -> Dict[str, Any]:
        return {**self.__dict__, "_tables": OrderedDict()}  # blocks are fetched again where it is read

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def position(self) -> int:
        """Rows of the current epoch's order consumed by the batches handed out."""
        return self._at.offset

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads: the current one, or the next once it is read to its end."""
        return self._at.epoch + 1 if self._at.offset >= self.rows else self._at.epoch

    def iter_batches(self, *, batch_size: Optional[int] = 256, drop_last: bool = False, **options: Any) -> Iterator[Any]:
        """One epoch's batches from the position (``batch_format`` as Ray's:
        "numpy", "pandas" or "pyarrow"). ``drop_last``: stop before a last step
        that cannot give every rank ``batch_size`` rows (its rows wait for no
        later step: the epoch ends)."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"a shard read exactly once needs batch_size >= 1 (the position counts rows), got {batch_size!r}")
        batch_format = options.pop("batch_format", "numpy")
        options.pop("prefetch_batches", None)  # reads are local zero-copy gets: nothing to prefetch
        refused = sorted(set(options) & set(UNSUPPORTED))
        if refused:
            raise ValueError(
                f"{', '.join(refused)}: a shard read exactly once keeps its own order; shuffle it with DataConfig(shuffle=True, seed=...)"
            )
        if options:
            raise TypeError(f"iter_batches got options a shard read exactly once does not take: {', '.join(sorted(options))}")
        return timed(self._batches(batch_size, drop_last, batch_format), self.name)

    def _batches(self, batch_size: int, drop_last: bool, batch_format: str) -> Iterator[Any]:
        epoch = self.epoch
        offset = 0 if epoch != self._at.epoch else self._at.offset
        plan = EpochPlan(self.rows, offset, self.world_size)
        order = ChunkedOrder(self.rows, epoch, self.seed, self.shuffle, RUN)
        steps = plan.remaining // (self.world_size * batch_size) if drop_last else plan.batches(batch_size)
        self._at = Position(epoch, offset)
        for step in range(steps):
            span = plan.step_positions(self.rank, step, batch_size)
            batch = self._read(order.rows_at(span.start, span.stop), batch_format)
            self._at = Position(epoch, self.rows if step + 1 >= steps else plan.after(step + 1, batch_size))
            yield batch  # the position already counts it: the loop holds it from here
        self._at = Position(epoch, self.rows)

    def _read(self, rows: Any, batch_format: str) -> Any:
        """The rows (global indices, in order) as one batch."""
        import numpy as np
        import pyarrow as pa

        blocks, local = locate(rows, self.block_starts)
        parts = [self._table(int(block)).take(pa.array(local[blocks == block] + self.firsts[block])) for block in np.unique(blocks)]
        table = (
            pa.concat_tables(parts).take(pa.array(np.argsort(np.argsort(blocks, kind="stable")))) if parts else self._table(0).slice(0, 0)
        )
        if batch_format == "pyarrow":
            return table
        from ray.data.block import BlockAccessor

        return BlockAccessor.for_block(table).to_batch_format(batch_format)

    def _table(self, block: int) -> Any:
        if block in self._tables:
            self._tables.move_to_end(block)
        else:
            self._tables[block] = self.fetch(self.refs[block])
            while len(self._tables) > self.cached:
                self._tables.popitem(last=False)
        return self._tables[block]

    def state_dict(self) -> Dict[str, Any]:
        """The epoch and its rows consumed (the same on every rank: save it as shared state)."""
        return {"epoch": self._at.epoch, "position": self._at.offset, "rows": self.rows, "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Go on from a saved position, in a world of any size; the dataset and its order must be the same."""
        saved = (state["rows"], state["seed"], state["shuffle"])
        if saved != (self.rows, self.seed, self.shuffle):
            raise ValueError(
                f"dataset {self.name!r}: the state was saved for {state['rows']} rows, seed {state['seed']}, shuffle={state['shuffle']}; "
                f"this call's dataset has {self.rows} rows, seed {self.seed}, shuffle={self.shuffle}"
            )
        self._at = Position(int(state["epoch"]), int(state["position"]))
