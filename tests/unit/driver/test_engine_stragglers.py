"""A straggler acted on (``straggler_action="replace"``), on the fake cluster:
a rank that enters every collective late is killed once it has stayed late
by ``straggler_threshold`` for ``straggler_windows`` windows in a row, and a
ready spare on another node takes its place in a warm restart that is not
counted against ``max_restarts``; its node hosts no rank again. Without such
a spare, or below the threshold, it is only reported."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping

import pytest

from raydist.config import RunConfig
from raydist.errors import CallEnd, WorkerGroupError
from raydist.pool.driver.group import WorkerGroup
from raydist.pool.records import GroupPhase
from raydist.pool.rules.stragglers import WINDOW
from raydist.testing.fake import STRAGGLE_STEP_S, FakeCluster, Fault
from raydist.testing.workers import current_attempt, current_rank

# Ranks 0-1 on node-a, 2-3 on node-b; the spare last in rank order, on node-c.
NODES = {"node-a": {"CPU": 2}, "node-b": {"CPU": 2}, "node-c": {"CPU": 1}}
CALL_S = 60.0  # how long the straggler's call runs unless it is replaced
WINDOWS = 3
REPLACING = {"straggler_action": "replace", "straggler_windows": WINDOWS, "spare_workers": 1}


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="raydist")


def straggling(rank: int, late: float) -> List[Fault]:
    """``rank`` enters each collective of the first call ``late`` seconds after the others, for CALL_S."""
    return [Fault("execute", "straggle", who=rank, seconds=CALL_S, late=late)]


def rank_and_attempt() -> tuple:
    return current_rank(), current_attempt()


def group_on(cluster: FakeCluster, nodes: Mapping[str, Any] = NODES, **options: Any) -> WorkerGroup:
    return WorkerGroup(config=RunConfig(num_workers=4, **options), cluster=cluster)


def test_a_rank_late_for_its_windows_is_replaced_by_a_spare_on_another_node_not_counted() -> None:
    cluster = FakeCluster(NODES, straggling(1, late=0.2))
    with group_on(cluster, max_restarts=0, **REPLACING) as group:
        assert {s.node_id for s in group.spares} == {"node-c"}
        with pytest.raises(WorkerGroupError) as failed:
            group.run(current_rank)
        error = failed.value
        assert error.end is CallEnd.REPLACED and error.restarted_in_place and error.root_cause.rank == 1
        assert error.root_cause.died is not None and error.root_cause.died.startswith(
            f"replaced by raydist: it reached collectives 200 ms after the others for {WINDOWS} windows of {WINDOW} collectives"
        )
        # Seen after its windows (each WINDOW new collectives), long before the call would have ended.
        assert WINDOWS * WINDOW * STRAGGLE_STEP_S <= cluster.monotonic() < (WINDOWS + 1) * WINDOW * STRAGGLE_STEP_S + 5
        # Not charged to max_restarts=0: the world runs on, with the spare, and none of its ranks on node-a but the kept one.
        assert group.phase is GroupPhase.RUNNING and group.restart_count == 1 and group.restarts_used == 0
        assert group.run(rank_and_attempt) == [(rank, 1) for rank in range(4)]
        nodes: Dict[str, int] = {}
        for worker in group.workers:
            nodes[worker.node_id] = nodes.get(worker.node_id, 0) + 1
        assert nodes == {"node-a": 1, "node-b": 2, "node-c": 1}
    assert cluster.leftovers() == []


def test_the_straggler_s_freed_place_gets_no_new_spare() -> None:
    # The placement group's only free bundle after the replacement is the straggler's, on
    # node-a: the used spare's refill would start there, and does not.
    cluster = FakeCluster(NODES, straggling(1, late=0.2))
    with group_on(cluster, **REPLACING) as group:
        with pytest.raises(WorkerGroupError):
            group.run(current_rank)
        cluster.sleep(10)  # a used spare's replacement starts in the background after REFILL_DELAY_S
        assert group.spares == [] and group.run(current_rank) == [0, 1, 2, 3]
    assert cluster.leftovers() == []


def test_a_straggler_with_its_only_spare_on_its_own_node_is_only_reported() -> None:
    # Ranks 2-3 and the spare share node-b: a replacement there would be as slow.
    cluster = FakeCluster({"node-a": {"CPU": 2}, "node-b": {"CPU": 3}}, straggling(2, late=0.2))
    with group_on(cluster, **REPLACING) as group:
        assert {s.node_id for s in group.spares} == {"node-b"}
        assert group.run(current_rank) == [0, 1, 2, 3]
        assert group.restart_count == 0 and cluster.monotonic() >= CALL_S
        assert [s.rank for s in group.stragglers()] == [2]
    assert cluster.leftovers() == []


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({**REPLACING, "straggler_threshold": 0.5}, id="below-the-threshold"),
        pytest.param({"spare_workers": 1}, id="straggler_action-report"),
    ],
)
def test_a_straggler_is_only_reported_below_the_threshold_or_by_default(options: Dict[str, Any]) -> None:
    cluster = FakeCluster(NODES, straggling(1, late=0.2))
    with group_on(cluster, **options) as group:
        assert group.run(current_rank) == [0, 1, 2, 3]
        assert group.restart_count == 0 and cluster.monotonic() >= CALL_S
        assert [(s.rank, round(s.late_s, 3)) for s in group.stragglers()] == [(1, 0.2)]
    assert cluster.leftovers() == []
