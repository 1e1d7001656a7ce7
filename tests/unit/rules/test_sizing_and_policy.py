"""Sizing and restart rules: how many workers fit, elastic sizes, how a call
ended and whether the run restarts."""

from __future__ import annotations

from raydist.pool.rules.policy import RestartReason, restart_line
from raydist.pool.rules.sizing import elastic_size, workers_that_fit


def test_workers_that_fit_by_strategy() -> None:
    free = [{"CPU": 2.0}, {"CPU": 3.0}, {"CPU": 0.5}]
    bundle = {"CPU": 1.0}
    assert workers_that_fit(bundle, free, "PACK") == 5
    assert workers_that_fit(bundle, free, "SPREAD") == 5
    assert workers_that_fit(bundle, free, "STRICT_PACK") == 3
    assert workers_that_fit(bundle, free, "STRICT_SPREAD") == 2
    assert workers_that_fit({"CPU": 1.0, "GPU": 1.0}, [{"CPU": 4.0, "GPU": 1.0}], "PACK") == 1


def test_elastic_size_is_what_fits_between_min_and_max() -> None:
    assert elastic_size(2, 6, 9) == 6
    assert elastic_size(2, 6, 4) == 4
    assert elastic_size(2, 6, 1) is None


def test_restart_line_says_why_and_how_many() -> None:
    line = restart_line(RestartReason("node lost", "rank 3 on node abc: its node died", True), 6, 1, 2, 1)
    assert line == ("raydist: node lost: rank 3 on node abc: its node died; world size was 6; starting attempt 1 (restart 1 of 2)")
    assert "not counted against max_restarts" in restart_line(RestartReason("preemption", "x", False), 6, 1, 0, 0)
