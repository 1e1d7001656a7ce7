"""The rank that drags every step, from made-up flight-recorder timestamps."""

from __future__ import annotations

import random
from typing import Any, Callable, Dict, List

from raydist.pool.records import CollectiveEntry
from raydist.pool.rules.stragglers import WINDOW, Straggler, Streak, find_stragglers, lateness, lengthen_streaks

STEP_NS = 60_000_000


def record(ranks: int, steps: int, late_ns: Dict[int, int], jitter_ns: int = 0, seed: int = 0) -> Dict[int, List[CollectiveEntry]]:
    """Each rank's entry time of ``steps`` all_reduces: the step start, plus its own delay and noise."""
    rng = random.Random(seed)
    return {
        rank: [
            CollectiveEntry(
                "0", seq, "all_reduce", ((1,),), ("float32",), seq * STEP_NS + late_ns.get(rank, 0) + rng.randint(0, jitter_ns), True
            )
            for seq in range(1, steps + 1)
        ]
        for rank in range(ranks)
    }


def test_a_rank_50_ms_late_every_step_is_named() -> None:
    found = find_stragglers(record(2, 20, {1: 50_000_000}, jitter_ns=2_000_000))
    assert [s.rank for s in found] == [1]
    assert 0.045 < found[0].late_s < 0.055
    assert found[0].collectives == 20 and found[0].last_seq == 20
    assert (
        found[0].line("node ab12 (10.0.0.2)")
        == "rank 1 on node ab12 (10.0.0.2) reaches collectives 50 ms after the others, over the last 20 collectives"
    )


def test_named_from_a_few_steps_but_not_from_fewer() -> None:
    assert find_stragglers(record(4, 8, {2: 50_000_000}))[0].rank == 2
    assert find_stragglers(record(4, 7, {2: 50_000_000})) == []


def test_an_even_run_names_no_one() -> None:
    for seed in range(20):
        assert find_stragglers(record(2, 200, {}, jitter_ns=8_000_000, seed=seed)) == []
        assert find_stragglers(record(8, 200, {}, jitter_ns=8_000_000, seed=seed)) == []


def test_one_slow_step_names_no_one() -> None:
    recorders = record(2, 20, {})
    recorders[1][10] = CollectiveEntry("0", 11, "all_reduce", ((1,),), ("float32",), 11 * STEP_NS + 900_000_000, True)
    assert find_stragglers(recorders) == []


def test_clock_offsets_are_taken_out() -> None:
    # Rank 1's clock runs 200 ms ahead: not a straggler once the offset is known.
    skewed = record(2, 20, {1: 200_000_000})
    assert [s.rank for s in find_stragglers(skewed)] == [1]
    assert find_stragglers(skewed, {1: 200_000_000}) == []


def test_only_collectives_every_rank_recorded_count() -> None:
    recorders = record(3, 20, {})
    recorders[2] = recorders[2][:5]  # its buffer was read earlier
    assert len(lateness(recorders)) == 5
    assert find_stragglers(recorders) == []
    assert isinstance(find_stragglers(record(2, 10, {0: 30_000_000}))[0], Straggler)


def test_finding_stragglers_takes_work_linear_in_the_ranks(count_calls: Callable[[Callable[[], Any]], int]) -> None:
    # The median of the other ranks, taken afresh for each rank, made a poll quadratic: minutes at 4,096 ranks.
    small, large = record(40, 60, {3: 50_000_000}), record(160, 60, {3: 50_000_000})
    work = []
    for recorders in (small, large):
        work.append(count_calls(lambda recorders=recorders: find_stragglers(recorders)))
        assert [s.rank for s in find_stragglers(recorders)] == [3]
    assert work[1] <= 4.5 * work[0]


def late(rank: int, late_s: float, collectives: int = WINDOW) -> Straggler:
    return Straggler(rank, late_s, collectives, last_seq=0)


def test_a_streak_adds_a_window_per_window_of_new_collectives() -> None:
    streaks = lengthen_streaks({}, [late(1, 0.2)], seen=20, threshold_s=0.05)
    assert streaks == {1: Streak(1, 20)}
    assert lengthen_streaks(streaks, [late(1, 0.2)], seen=39, threshold_s=0.05) == {1: Streak(1, 20)}  # the same window still
    streaks = lengthen_streaks(streaks, [late(1, 0.2)], seen=40, threshold_s=0.05)
    assert lengthen_streaks(streaks, [late(1, 0.2)], seen=60, threshold_s=0.05) == {1: Streak(3, 60)}


def test_a_streak_ends_when_the_rank_is_no_longer_named_or_below_the_threshold() -> None:
    streaks = {1: Streak(2, 40), 2: Streak(2, 40)}
    assert lengthen_streaks(streaks, [late(1, 0.2)], seen=60, threshold_s=0.05) == {1: Streak(3, 60)}
    assert lengthen_streaks(streaks, [late(1, 0.02), late(2, 0.2)], seen=60, threshold_s=0.05) == {2: Streak(3, 60)}


def test_a_verdict_over_less_than_a_window_starts_no_streak() -> None:
    # Named from 8 collectives on (a report), but a replacement rests on full windows only.
    assert lengthen_streaks({}, [late(1, 0.2, collectives=8)], seen=8, threshold_s=0.05) == {}
