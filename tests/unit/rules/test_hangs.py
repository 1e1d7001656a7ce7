"""Where ranks diverged, from made-up flight-recorder entries."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from raydist.pool.records import CollectiveEntry
from raydist.pool.rules.hangs import first_mismatch, needs_attribution, not_arrived, rank_state, where_collectives_are


def entry(
    seq: int, op: str = "all_reduce", done: bool = True, shape: Sequence[int] = (1,), dtype: str = "float32", group: str = "0"
) -> CollectiveEntry:
    return CollectiveEntry(group, seq, op, (tuple(shape),), (dtype,), seq * 1_000_000, done)


def steps(count: int, waiting: bool = False, **kwargs: object) -> List[CollectiveEntry]:
    """``count`` completed all_reduces, the last one still in flight if ``waiting``."""
    return [entry(seq, done=not (waiting and seq == count), **kwargs) for seq in range(1, count + 1)]  # type: ignore[arg-type]


def test_a_rank_that_skipped_a_collective_is_named_with_both_sequence_numbers() -> None:
    recorders: Dict[int, Optional[List[CollectiveEntry]]] = {r: steps(6, waiting=True) for r in (0, 1, 3)}
    recorders[2] = steps(5)
    text = where_collectives_are(recorders)
    assert text == ("ranks 0-1, 3: waiting in all_reduce #6 (float32 [1]); rank 2: last completed all_reduce #5, not in a collective")


def test_a_different_op_at_the_same_sequence_number_is_a_mismatch() -> None:
    recorders: Dict[int, Optional[List[CollectiveEntry]]] = {r: steps(5) + [entry(6, done=False)] for r in (0, 1, 3)}
    recorders[2] = steps(5) + [entry(6, "broadcast", done=False)]
    text = where_collectives_are(recorders)
    assert "mismatch: rank 2 entered broadcast #6, the others all_reduce #6" in text
    assert "rank 2: waiting in broadcast #6 (float32 [1])" in text


def test_a_size_or_dtype_mismatch_names_both_sides() -> None:
    by_rank = {0: [entry(3, shape=(4, 2))], 1: [entry(3, shape=(4, 2))], 2: [entry(3, shape=(4, 3), dtype="float16")]}
    assert first_mismatch(by_rank) == "mismatch: rank 2 entered all_reduce #3 with float16 [4, 3], the others with float32 [4, 2]"


def test_agreeing_ranks_have_no_mismatch_and_one_line() -> None:
    recorders: Dict[int, Optional[List[CollectiveEntry]]] = {r: steps(9, waiting=True) for r in range(4)}
    assert where_collectives_are(recorders) == "ranks 0-3: waiting in all_reduce #9 (float32 [1])"


def test_a_silent_rank_and_several_groups_are_said() -> None:
    recorders: Dict[int, Optional[List[CollectiveEntry]]] = {
        0: steps(2) + [entry(1, group="1", done=False)],
        1: steps(2),
        2: None,
    }
    lines = where_collectives_are(recorders).splitlines()
    assert lines[0] == "process group 0: ranks 0-1: last completed all_reduce #2, not in a collective"
    assert lines[1] == "process group 1: rank 0: waiting in all_reduce #1 (float32 [1]); rank 1: no collective yet"
    assert lines[2] == "rank 2: no flight record (the process did not answer)"


def test_nothing_recorded_says_nothing() -> None:
    assert where_collectives_are({0: [], 1: None}) == ""
    assert rank_state([]) == "no collective yet"


def test_attribution_is_wanted_only_for_a_rank_stuck_in_a_collective() -> None:
    assert needs_attribution(steps(3, waiting=True))
    assert not needs_attribution(steps(3))
    assert not needs_attribution(None)


def test_ranks_whose_collective_raised_are_said_to_have_failed_in_it() -> None:
    from raydist.pool.rules.hangs import mark_failed

    recorders: Dict[int, Optional[List[CollectiveEntry]]] = {
        0: list(mark_failed(steps(6, waiting=True))),
        1: list(mark_failed(steps(6))),
        2: steps(5),
    }
    assert where_collectives_are(recorders) == (
        "ranks 0-1: failed in all_reduce #6 (float32 [1]); rank 2: last completed all_reduce #5, not in a collective"
    )
    assert needs_attribution(recorders[1])


def test_the_ranks_that_did_not_reach_a_collective_are_named_with_where_they_are() -> None:
    recorders: Dict[int, Optional[List[CollectiveEntry]]] = {r: steps(6, waiting=True) for r in (0, 1, 3)}
    recorders[2] = steps(5)
    found = not_arrived(recorders)
    assert found is not None and (found.waiting, found.behind, found.seq, found.op) == ((0, 1, 3), (2,), 6, "all_reduce")
    assert found.line(30.2) == (
        "rank 2 did not reach all_reduce #6 (float32 [1]), which ranks 0-1, 3 waited in for 30.2 s "
        "(rank 2: last completed all_reduce #5, not in a collective)"
    )
    recorders[1] = steps(5)  # the same collective, a rank more behind: another hang
    again = not_arrived(recorders)
    assert again is not None and again.behind == (1, 2) and again.key != found.key


def test_no_rank_is_behind_when_all_are_at_the_same_collective_or_one_cannot_be_read() -> None:
    level: Dict[int, Optional[List[CollectiveEntry]]] = {r: steps(4, waiting=r % 2 == 0) for r in range(4)}
    assert not_arrived(level) is None
    silent: Dict[int, Optional[List[CollectiveEntry]]] = {0: steps(3, waiting=True), 1: steps(2), 2: None}
    assert not_arrived(silent) is None  # rank 2 may be anywhere


def test_a_rank_with_no_collective_yet_is_behind_and_another_group_is_named() -> None:
    recorders: Dict[int, Optional[List[CollectiveEntry]]] = {0: steps(2) + [entry(1, group="1", done=False)], 1: steps(2)}
    found = not_arrived(recorders)
    assert found is not None and (found.group, found.behind) == ("1", (1,))
    assert found.line(5).startswith("process group 1: rank 1 did not reach all_reduce #1 (float32 [1]), which rank 0 waited in for 5.0 s")
    assert "(rank 1: no collective yet)" in found.line(5)
