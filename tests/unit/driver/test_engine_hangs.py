"""A hang acted on (``hang_timeout``), on the fake cluster: ranks that never
reach a collective the others wait in are killed once the straggler watch
has seen it for ``hang_timeout`` seconds, and their death is a failure like
any other (a warm restart with a spare, or the run's end naming the hang)."""

from __future__ import annotations

import logging
from typing import List

import pytest

from raydist.config import RunConfig
from raydist.errors import WorkerGroupError, WorkerGroupTimeout
from raydist.pool.driver.group import WorkerGroup
from raydist.pool.records import GroupPhase
from raydist.testing.fake import FakeCluster, Fault
from raydist.testing.workers import current_attempt, current_rank

NODES = {"node-a": {"CPU": 3}, "node-b": {"CPU": 2}}
HANG_TIMEOUT_S = 5.0
POLL_S = 0.5  # the straggler watch's poll: a hang is seen within one


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="raydist")


def rank_2_never_arrives() -> List[Fault]:
    """Ranks 0, 1 and 3 wait in all_reduce #3 of the first call; rank 2 never reaches it."""
    waiting = [Fault("execute", "hang", who=rank, collective=3) for rank in (0, 1, 3)]
    return [*waiting, Fault("execute", "hang", who=2, collective=3, entered=False)]


def rank_and_attempt() -> tuple:
    return current_rank(), current_attempt()


def test_a_rank_that_never_reaches_a_collective_is_replaced_by_a_spare_after_the_hang_timeout() -> None:
    cluster = FakeCluster(NODES, rank_2_never_arrives())
    config = RunConfig(num_workers=4, max_restarts=1, spare_workers=1, hang_timeout=HANG_TIMEOUT_S)
    with WorkerGroup(config=config, cluster=cluster) as group:
        with pytest.raises(WorkerGroupError) as failed:
            group.run(current_rank)
        error = failed.value
        assert error.restarted_in_place and error.root_cause.rank == 2
        assert HANG_TIMEOUT_S <= cluster.monotonic() <= HANG_TIMEOUT_S + 2 * POLL_S + 1  # not the process group's timeout
        assert error.root_cause.died is not None and error.root_cause.died.startswith(
            "killed by raydist: it did not reach all_reduce #3 (float32 [1]), which ranks 0-1, 3 waited in for"
        )
        assert "(rank 2: last completed all_reduce #2, not in a collective); hang_timeout=5 s" in error.root_cause.died
        # The others' calls failed in the collective (their peer gone), as gloo's do; they kept their processes.
        assert {f.rank for f in error.failures} == {0, 1, 2, 3} and [f.rank for f in error.failures if f.crashed] == [2]
        assert group.phase is GroupPhase.RUNNING and group.restart_count == 1
        assert group.run(rank_and_attempt) == [(rank, 1) for rank in range(4)]
    assert cluster.leftovers() == []


def test_without_a_restart_the_run_ends_at_the_hang_timeout_naming_the_hang() -> None:
    cluster = FakeCluster(NODES, rank_2_never_arrives())
    group = WorkerGroup(config=RunConfig(num_workers=4, hang_timeout=HANG_TIMEOUT_S), cluster=cluster)
    with pytest.raises(WorkerGroupError) as failed:
        group.run(current_rank)
    assert not failed.value.restarted_in_place and failed.value.root_cause.rank == 2
    assert "did not reach all_reduce #3" in str(failed.value)
    assert group.closed and cluster.monotonic() <= HANG_TIMEOUT_S + 2 * POLL_S + 1 and cluster.leftovers() == []


def test_ranks_all_waiting_in_the_same_collective_are_not_a_hang_to_act_on() -> None:
    # Every rank entered all_reduce #3 and none leaves it: no rank is behind, so none is
    # killed; the call's own timeout ends it, as without hang_timeout.
    cluster = FakeCluster(NODES, [Fault("execute", "hang", who=rank, collective=3) for rank in range(4)])
    group = WorkerGroup(config=RunConfig(num_workers=4, hang_timeout=1, timeout=20, max_restarts=1), cluster=cluster)
    with pytest.raises(WorkerGroupTimeout):
        group.run(current_rank)
    assert cluster.monotonic() == 20.0 and group.restart_count == 0 and cluster.leftovers() == []


def test_without_hang_timeout_a_hang_is_left_to_the_calls_timeout() -> None:
    cluster = FakeCluster(NODES, rank_2_never_arrives())
    group = WorkerGroup(config=RunConfig(num_workers=4, timeout=20, max_restarts=1), cluster=cluster)
    with pytest.raises(WorkerGroupTimeout, match="rank 2: last completed all_reduce #2, not in a collective"):
        group.run(current_rank)
    assert cluster.monotonic() == 20.0 and group.restart_count == 0
