"""``raydist.DistributedSampler``: an epoch cut by failures and resizes is read
exactly once by the committed steps, every rank takes as many batches, and a
world that never changes reads what torch's sampler gives it.

The ranks of a world are samplers in this process, each with a real
``DataLoader``; a "commit" is one rank's ``state_dict`` (the same on all), and
a failure throws the world away and builds the next from the last commit.
"""

from __future__ import annotations

from collections import Counter
from itertools import zip_longest
from typing import Dict, List, Optional, Tuple

import pytest
import torch
import torch.utils.data as tud
from hypothesis import given, settings
from hypothesis import strategies as st

from raydist.core.sampler import DistributedSampler

Rows = List[int]


def dataset(rows: int) -> tud.TensorDataset:
    return tud.TensorDataset(torch.arange(rows))


def world(
    data: tud.Dataset, size: int, state: Optional[Dict[str, object]], batch_size: int, drop_last: bool = False, seed: int = 7
) -> Tuple[List[DistributedSampler], List[tud.DataLoader]]:
    samplers = [DistributedSampler(data, num_replicas=size, rank=rank, seed=seed, drop_last=drop_last) for rank in range(size)]
    for sampler in samplers:
        if state is not None:
            sampler.load_state_dict(state)
    return samplers, [tud.DataLoader(data, batch_size=batch_size, sampler=sampler) for sampler in samplers]


def rows_of(batch: List[torch.Tensor]) -> Rows:
    return batch[0].tolist()


def test_a_world_that_never_changes_reads_what_torchs_sampler_gives_it() -> None:
    data = dataset(48)
    for rank in range(4):
        ours = DistributedSampler(data, num_replicas=4, rank=rank, seed=3)
        theirs = tud.DistributedSampler(data, num_replicas=4, rank=rank, seed=3)
        for epoch in (0, 1):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)


def test_rows_that_do_not_divide_are_neither_repeated_nor_dropped_and_every_rank_takes_as_many_batches() -> None:
    data = dataset(10)  # 4 ranks, batches of 2: 8 rows, then 2 rows for 4 ranks
    samplers, loaders = world(data, 4, None, batch_size=2)
    taken = [[rows_of(batch) for batch in sampler.track(loader)] for sampler, loader in zip(samplers, loaders)]
    assert [len(batches) for batches in taken] == [2, 2, 2, 2]
    assert [len(batches[1]) for batches in taken] == [1, 1, 0, 0]  # the last step: 2 rows, 2 empty batches
    assert sorted(row for batches in taken for batch in batches for row in batch) == list(range(10))
    assert {sampler.position for sampler in samplers} == {10}


def test_an_empty_batch_keeps_the_loaders_shape_where_a_rank_read_no_row_at_all() -> None:
    data = tud.TensorDataset(torch.zeros(3, 5), torch.arange(3))
    samplers, loaders = world(data, 4, None, batch_size=8)
    last = list(samplers[3].track(loaders[3]))
    assert len(last) == 1 and [tuple(part.shape) for part in last[0]] == [(0, 5), (0,)]


def test_drop_last_drops_only_the_rows_that_do_not_divide_by_the_world() -> None:
    samplers, loaders = world(dataset(10), 4, None, batch_size=2, drop_last=True)
    taken = [row for sampler, loader in zip(samplers, loaders) for batch in sampler.track(loader) for row in rows_of(batch)]
    assert len(taken) == 8 and len(set(taken)) == 8
    assert {sampler.position for sampler in samplers} == {10}  # the epoch is over


def test_the_position_counts_the_batches_the_loop_took_not_those_a_worker_pool_fetched_ahead() -> None:
    sampler = DistributedSampler(dataset(64), num_replicas=2, rank=0, shuffle=False)
    loader = tud.DataLoader(dataset(64), batch_size=4, sampler=sampler, num_workers=2, prefetch_factor=2)
    batches = sampler.track(loader)
    first = next(batches)
    assert rows_of(first) == [0, 2, 4, 6]
    assert sampler.state_dict()["position"] == 8  # one batch on each of 2 ranks; the pool holds 4 more
    next(batches)
    assert sampler.state_dict()["position"] == 16
    batches.close()


def test_saving_a_sampler_iterated_without_track_is_refused_with_the_fix() -> None:
    sampler = DistributedSampler(dataset(8), num_replicas=2, rank=0)
    next(iter(tud.DataLoader(dataset(8), batch_size=2, sampler=sampler)))
    with pytest.raises(RuntimeError, match=r"sampler.track\(loader\)"):
        sampler.state_dict()


def test_a_state_saved_for_another_dataset_or_order_is_refused() -> None:
    state = DistributedSampler(dataset(8), num_replicas=2, rank=0, seed=1).state_dict()
    with pytest.raises(ValueError, match="saved for 8 rows, seed 1"):
        DistributedSampler(dataset(9), num_replicas=2, rank=0, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed 2"):
        DistributedSampler(dataset(8), num_replicas=2, rank=0, seed=2).load_state_dict(state)


def test_a_loaded_position_at_an_epochs_end_reads_nothing_more_of_it_and_the_next_epoch_whole() -> None:
    data = dataset(12)
    samplers, loaders = world(data, 3, {"epoch": 0, "position": 12, "rows": 12, "seed": 7, "shuffle": True}, batch_size=2)
    samplers[0].set_epoch(0)
    assert list(samplers[0].track(loaders[0])) == []
    samplers[0].set_epoch(1)
    assert sum(len(rows_of(batch)) for batch in samplers[0].track(loaders[0])) == 4


# A run: per epoch, a list of worlds; each (size, steps taken, of which committed).
Segment = Tuple[int, int, int]


@st.composite
def runs(draw: st.DrawFn) -> Tuple[int, int, List[Segment]]:
    rows = draw(st.integers(1, 90))
    batch_size = draw(st.integers(1, 5))
    segments = draw(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 12), st.integers(0, 12)), max_size=6))
    return rows, batch_size, [(size, taken, min(kept, taken)) for size, taken, kept in segments]


@given(runs())
@settings(max_examples=150, deadline=None)
def test_failures_and_resizes_at_any_step_leave_each_row_read_exactly_once_by_the_committed_steps(
    run: Tuple[int, int, List[Segment]],
) -> None:
    """Each world takes some steps, commits after some of them and fails; the
    next world, of any size, loads the commit. A last world of 3 ranks ends
    the epochs. Every row of every epoch: in exactly one committed step."""
    rows, batch_size, segments = run
    data = dataset(rows)
    state: Optional[Dict[str, object]] = None
    committed: Dict[int, Counter] = {0: Counter(), 1: Counter()}
    for size, taken, kept in [*segments, (3, 10**6, 10**6)]:
        samplers, loaders = world(data, size, state, batch_size)
        epoch = samplers[0].epoch
        steps = 0
        while epoch < 2 and steps < taken:
            for sampler in samplers:
                sampler.set_epoch(epoch)
            iterators = [sampler.track(loader) for sampler, loader in zip(samplers, loaders)]
            for batches in zip_longest(*iterators):
                assert None not in batches  # every rank takes as many batches
                steps += 1
                if steps <= kept:
                    committed[epoch].update(row for batch in batches for row in rows_of(batch))
                    states = [sampler.state_dict() for sampler in samplers]
                    assert all(s == states[0] for s in states)  # shared state: the same on every rank
                    state = states[0]
                if steps == taken:
                    break
            else:
                epoch += 1
                if steps <= kept:
                    state = samplers[0].state_dict()
    for epoch in (0, 1):
        assert committed[epoch] == Counter(range(rows)), f"epoch {epoch}"


def test_an_epoch_iterated_again_without_set_epoch_is_read_again_as_with_torchs_sampler() -> None:
    samplers, loaders = world(dataset(12), 2, None, batch_size=3)
    first = [rows_of(batch) for batch in samplers[0].track(loaders[0])]
    again = [rows_of(batch) for batch in samplers[0].track(loaders[0])]
    assert first == again and sum(map(len, first)) == 6


def test_track_refuses_a_loader_that_drops_or_reorders_batches() -> None:
    sampler = DistributedSampler(dataset(8), num_replicas=2, rank=0)
    with pytest.raises(ValueError, match=r"drop_last=True\) drops each rank's short last batch"):
        next(sampler.track(tud.DataLoader(dataset(8), batch_size=3, sampler=sampler, drop_last=True)))
    with pytest.raises(ValueError, match="sampler=this sampler"):
        next(sampler.track(tud.DataLoader(dataset(8), batch_size=3)))


def test_an_empty_batch_is_refused_for_a_batch_it_cannot_empty() -> None:
    data = [object() for _ in range(3)]
    samplers = [DistributedSampler(data, num_replicas=4, rank=rank) for rank in range(4)]
    loader = tud.DataLoader(data, batch_size=8, sampler=samplers[3], collate_fn=lambda rows: rows[0] if rows else object())
    with pytest.raises(TypeError, match="cannot make an empty batch like a object"):
        list(samplers[3].track(loader))


def test_the_length_after_an_epoch_read_to_its_end_is_the_next_reading_of_it() -> None:
    samplers, loaders = world(dataset(12), 2, None, batch_size=3)
    assert len(samplers[0]) == 6
    list(samplers[0].track(loaders[0]))
    assert len(samplers[0]) == 6 == sum(len(rows_of(batch)) for batch in samplers[0].track(loaders[0]))
