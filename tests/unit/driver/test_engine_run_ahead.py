"""``run_ahead`` on the fake cluster: which processes the engine asks to run the
call ahead to its ``load_state``, and when. What the function does there is the
worker's (``tests/unit/worker/test_run_ahead.py``, and live in
``tests/live/test_run_ahead.py``)."""

from __future__ import annotations

import logging
from typing import Any, List

import pytest

from raydist.config import RunConfig
from raydist.pool.driver.calls import prepare_call
from raydist.pool.driver.controller import RunController, run_call
from raydist.pool.driver.group import WorkerGroup
from raydist.testing.fake import FakeCluster, Fault
from raydist.testing.workers import current_attempt, current_rank

NODES = {"node-a": {"CPU": 2}, "node-b": {"CPU": 2}, "node-c": {"CPU": 1}}


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="raydist")


def run(cluster: FakeCluster, **options: Any) -> List[Any]:
    config = RunConfig(flight_recorder=False, timeout=60, startup_timeout=30, num_workers=4, max_restarts=1, **options)
    return run_call(RunController(cluster, config, fresh_restarts=True), prepare_call(cluster, lambda: (current_rank(), current_attempt())))


def test_a_spare_runs_the_call_ahead_and_the_kept_ranks_do_after_their_teardown() -> None:
    cluster = FakeCluster(NODES, [Fault("execute", "die", who=1)])
    values = run(cluster, spare_workers=1, run_ahead=True)
    assert values == [(rank, 1) for rank in range(4)]
    first, dead, *others, spare = cluster.processes.workers  # in start order: the world's four, then the spare
    assert spare.ran_ahead == [(None, 0)]  # once the call was sent, before it had a rank
    # Each kept process after it left its process group (its first teardown), its old rank still set.
    assert [w.ran_ahead for w in (first, *others)] == [[(0, 1)], [(2, 1)], [(3, 1)]]
    assert dead.ran_ahead == []


def test_without_the_option_nothing_runs_ahead() -> None:
    cluster = FakeCluster(NODES, [Fault("execute", "die", who=1)])
    assert run(cluster, spare_workers=1) == [(rank, 1) for rank in range(4)]
    assert all(worker.ran_ahead == [] for worker in cluster.processes.workers)


def test_a_refilled_spare_runs_the_call_ahead_once_it_stood_by() -> None:
    # Rank 1 dies in the first attempt; a new spare is started 5 s later, while the second attempt runs.
    cluster = FakeCluster(NODES, [Fault("execute", "die", who=1), Fault("execute", "slow", who=0, nth=1, seconds=30.0)])
    assert run(cluster, spare_workers=1, run_ahead=True) == [(rank, 1) for rank in range(4)]
    refilled = cluster.processes.workers[-1]
    assert refilled.rank is None and refilled.ran_ahead == [(None, 0)]


def test_a_fresh_restart_runs_nothing_ahead() -> None:
    cluster = FakeCluster(NODES, [Fault("execute", "die", who=1)])
    with pytest.raises(ValueError, match="run_ahead readies the processes of a warm restart"):
        run(cluster, restart_mode="fresh", run_ahead=True)


def test_a_worker_group_refuses_the_option_before_anything_starts() -> None:
    cluster = FakeCluster(NODES)
    with pytest.raises(ValueError, match="a WorkerGroup's next call is the caller's to send"):
        WorkerGroup(config=RunConfig(num_workers=2, max_restarts=1, run_ahead=True), cluster=cluster)
    assert cluster.processes.workers == []
