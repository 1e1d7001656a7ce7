"""A Ray Data shard read exactly once (``PositionalShard``), on Arrow tables in
this process standing for the blocks: the committed steps of worlds that fail
and change size at any step read every row of every epoch exactly once,
whatever the blocks' sizes and slices; every rank takes as many batches.
Reading real blocks from Ray's object store is the live tier's
(``tests/live/test_exactly_once.py``)."""

from __future__ import annotations

from collections import Counter
from itertools import zip_longest
from typing import Any, Dict, List, Optional, Tuple

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raydist.core.epoch_rows import ChunkedOrder
from raydist.pool.worker.positional import PositionalShard

Block = Tuple[Any, int, int]


def blocks_of(rows: int, sizes: List[int]) -> List[Block]:
    """``rows`` ids cut into blocks of ``sizes`` (cycled); each block carries one
    row before and after its slice, as Ray Data's sliced bundles do."""
    blocks: List[Block] = []
    start = 0
    index = 0
    while start < rows:
        size = min(sizes[index % len(sizes)], rows - start)
        table = pa.table({"id": [-1] + list(range(start, start + size)) + [-1]})
        blocks.append((table, 1, size))
        start += size
        index += 1
    return blocks


def shards(blocks: List[Block], size: int, state: Optional[Dict[str, Any]], shuffle: bool = True) -> List[PositionalShard]:
    made = [PositionalShard(blocks, "train", rank, size, shuffle=shuffle, seed=5, fetch=lambda table: table) for rank in range(size)]
    for shard in made:
        if state is not None:
            shard.load_state_dict(state)
    return made


def ids(batch: pa.Table) -> List[int]:
    return batch.column("id").to_pylist()


def test_an_epochs_order_is_every_row_once_and_depends_on_the_seed_and_epoch_not_the_blocks() -> None:
    order = ChunkedOrder(5000, epoch=1, seed=3, shuffle=True, chunk=64)
    rows = order.rows_at(0, 5000).tolist()
    assert sorted(rows) == list(range(5000)) and rows != list(range(5000))
    assert order.rows_at(100, 900).tolist() == rows[100:900]
    assert ChunkedOrder(5000, epoch=2, seed=3, shuffle=True, chunk=64).rows_at(0, 5000).tolist() != rows
    assert ChunkedOrder(5000, epoch=1, seed=3, shuffle=False, chunk=64).rows_at(0, 5000).tolist() == list(range(5000))


def test_every_rank_takes_as_many_batches_the_last_step_split_evenly_none_dropped() -> None:
    made = shards(blocks_of(10, [3]), 4, None, shuffle=False)
    taken = [[ids(batch) for batch in shard.iter_batches(batch_size=2, batch_format="pyarrow")] for shard in made]
    assert taken == [[[0, 1], [8]], [[2, 3], [9]], [[4, 5], []], [[6, 7], []]]
    assert {(shard.epoch, shard.position) for shard in made} == {(1, 10)}


def test_drop_last_ends_the_epoch_before_a_step_that_cannot_fill_every_batch() -> None:
    made = shards(blocks_of(10, [4]), 4, None, shuffle=False)
    taken = [[ids(batch) for batch in shard.iter_batches(batch_size=2, drop_last=True, batch_format="pyarrow")] for shard in made]
    assert [len(batches) for batches in taken] == [1, 1, 1, 1]
    assert made[0].epoch == 1  # the epoch is over: its last 2 rows wait for no later step


def test_shuffle_options_of_ray_are_refused_naming_the_shards_own() -> None:
    shard = shards(blocks_of(4, [4]), 1, None)[0]
    with pytest.raises(ValueError, match=r"DataConfig\(shuffle=True"):
        shard.iter_batches(batch_size=2, local_shuffle_buffer_size=100)
    with pytest.raises(ValueError, match="batch_size >= 1"):
        shard.iter_batches(batch_size=None)


def test_a_state_saved_for_other_rows_or_order_is_refused() -> None:
    state = shards(blocks_of(8, [4]), 2, None)[0].state_dict()
    with pytest.raises(ValueError, match="saved for 8 rows, seed 5"):
        shards(blocks_of(9, [4]), 2, state)


Segment = Tuple[int, int, int]


@st.composite
def runs(draw: st.DrawFn) -> Tuple[int, List[int], int, List[Segment]]:
    rows = draw(st.integers(1, 200))
    sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=4))
    batch_size = draw(st.integers(1, 9))
    segments = draw(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 15), st.integers(0, 15)), max_size=6))
    return rows, sizes, batch_size, [(size, taken, min(kept, taken)) for size, taken, kept in segments]


@given(runs())
@settings(max_examples=150, deadline=None)
def test_failures_and_resizes_at_any_step_leave_each_row_read_exactly_once_by_the_committed_steps(
    run: Tuple[int, List[int], int, List[Segment]],
) -> None:
    rows, sizes, batch_size, segments = run
    blocks = blocks_of(rows, sizes)
    state: Optional[Dict[str, Any]] = None
    committed: Dict[int, Counter] = {0: Counter(), 1: Counter()}
    for size, taken, kept in [*segments, (3, 10**6, 10**6)]:
        made = shards(blocks, size, state)
        steps = 0
        while made[0].epoch < 2 and steps < taken:
            epoch = made[0].epoch
            for batches in zip_longest(*(shard.iter_batches(batch_size=batch_size, batch_format="pyarrow") for shard in made)):
                assert None not in batches  # every rank takes as many batches
                steps += 1
                if steps <= kept:
                    committed[epoch].update(row for batch in batches for row in ids(batch))
                    states = [shard.state_dict() for shard in made]
                    assert all(s == states[0] for s in states)
                    state = states[0]
                if steps == taken:
                    break
    for epoch in (0, 1):
        assert committed[epoch] == Counter(range(rows)), f"epoch {epoch}"
