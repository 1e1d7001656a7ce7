"""The driver's wait for a call's output: the markers every rank's streams end with."""

from __future__ import annotations

from typing import Dict, List, Tuple

from raydist.pool.driver.output import Awaited, Key


class CountedMarks(Dict[Tuple[Key, bool], int]):
    """The marks seen per stream, counting how often the wait looks one up."""

    looked = 0

    def get(self, key: Tuple[Key, bool], default: int = -1) -> int:  # type: ignore[override]
        CountedMarks.looked += 1
        return super().get(key, default)


def test_waiting_for_n_ranks_markers_looks_at_each_about_once() -> None:
    # The wait looked at every rank's marker each time one arrived: quadratic in the ranks.
    ranks = 1000
    keys: List[Key] = [("10.0.0.1", str(pid)) for pid in range(ranks)]
    awaited, marks = Awaited([(key, False, 5) for key in keys]), CountedMarks()
    CountedMarks.looked = 0
    for key in keys:
        assert not awaited.arrived(marks)
        marks[(key, False)] = 5
    assert awaited.arrived(marks)
    assert CountedMarks.looked <= 2 * ranks + 1


def test_a_marker_of_an_earlier_call_is_not_this_calls() -> None:
    key: Key = ("10.0.0.1", "7")
    awaited = Awaited([(key, False, 5), (key, True, 5)])
    assert not awaited.arrived({(key, False): 4, (key, True): 5})
    assert not awaited.arrived({(key, False): 5, (key, True): 4})
    assert awaited.arrived({(key, False): 6, (key, True): 5})
