"""Calls on a group, on the fake cluster: timeouts (the caller's and the
group's), cancellation, and which failures a run retries. Each was a live
test that started Ray and torch to check the engine's own bookkeeping."""

from __future__ import annotations

import logging
import re

import pytest

from raydist.config import RunConfig
from raydist.errors import WorkerCallCancelled, WorkerGroupClosed, WorkerGroupError, WorkerGroupTimeout
from raydist.pool.driver.calls import prepare_call
from raydist.pool.driver.controller import CALL_SESSION_GONE, RunController, run_call
from raydist.pool.driver.group import WorkerGroup
from raydist.pool.records import GroupPhase
from raydist.testing.fake import FakeCluster, Fault
from raydist.testing.workers import current_attempt, current_rank

NODES = {"node-a": {"CPU": 2}, "node-b": {"CPU": 2}}


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="raydist")


def test_a_result_timeout_leaves_the_call_running_as_concurrent_futures_does() -> None:
    cluster = FakeCluster(NODES, [Fault("execute", "slow", who=0, seconds=3.0)])
    with WorkerGroup(config=RunConfig(num_workers=2, flight_recorder=False), cluster=cluster) as group:
        future = group.submit(current_rank)
        with pytest.raises(TimeoutError, match="still running"):
            future.result(timeout=0.5)
        assert not future.done() and group.phase is GroupPhase.RUNNING
        assert future.result() == [0, 1] and cluster.monotonic() == 3.0  # the same call, finished
        assert group.run(current_rank) == [0, 1]  # the group lives on
    assert cluster.leftovers() == []


def test_the_groups_own_timeout_tears_down_and_asking_again_gives_the_same_error() -> None:
    cluster = FakeCluster(NODES, [Fault("execute", "hang", who=1)])
    group = WorkerGroup(config=RunConfig(num_workers=2, timeout=1, flight_recorder=False), cluster=cluster)
    future = group.submit(current_rank)
    with pytest.raises(WorkerGroupTimeout) as first:
        future.result()
    with pytest.raises(WorkerGroupTimeout) as second:
        future.result()
    assert second.value is first.value and first.value.timeout == 1
    assert str(first.value).startswith("timed out after 1 s; rank 1 had not finished")
    assert group.closed and cluster.monotonic() == 1.0 and cluster.leftovers() == []


def test_a_call_that_ray_shutdown_cut_short_says_so_and_never_returns_values() -> None:
    # ray.shutdown() (the fake's shutdown) while rank 1 is still in the call: none of its
    # ranks can be read any more, so the call cannot have finished.
    cluster = FakeCluster(NODES, [Fault("execute", "hang", who=1), Fault("execute", "act", who=0, action=lambda: cluster.shutdown())])
    group = WorkerGroup(config=RunConfig(num_workers=2, flight_recorder=False), cluster=cluster)
    future = group.submit(current_rank)
    with pytest.raises(WorkerGroupClosed, match=re.escape(CALL_SESSION_GONE)):
        future.result()
    assert group.closed
    with pytest.raises(WorkerGroupClosed, match=re.escape("has been shut down (ray.shutdown())")):
        group.run(current_rank)


def test_a_finished_calls_values_survive_the_cancel_of_a_later_call() -> None:
    cluster = FakeCluster(NODES, [Fault("execute", "hang", who=0, nth=1)])
    group = WorkerGroup(config=RunConfig(num_workers=2, flight_recorder=False), cluster=cluster)
    first = group.submit(current_rank)
    assert first.done()  # its ranks ran when asked
    later = group.submit(current_rank)
    assert later.cancel()
    assert first.result() == [0, 1]
    with pytest.raises(WorkerCallCancelled):
        later.result()
    assert group.closed and cluster.leftovers() == []


def test_code_that_raised_is_retried_only_when_asked_and_the_error_lists_every_attempt() -> None:
    raising = [Fault("execute", "raise", who=0, nth=n) for n in range(3)]  # every attempt's rank 0 raises
    cluster = FakeCluster(NODES, [*raising])
    with pytest.raises(WorkerGroupError) as caught:
        run_call(
            RunController(cluster, RunConfig(num_workers=2, max_restarts=2, flight_recorder=False), True),
            prepare_call(cluster, current_rank),
        )
    assert not caught.value.attempts and len(cluster.faults.fired) == 1  # not retried
    cluster = FakeCluster(NODES, [Fault("execute", "raise", who=0, nth=n) for n in range(3)])
    config = RunConfig(num_workers=2, max_restarts=2, retry_on_exception=True, flight_recorder=False)
    with pytest.raises(WorkerGroupError) as caught:
        run_call(RunController(cluster, config, True), prepare_call(cluster, current_attempt))
    message = str(caught.value)
    assert len(caught.value.attempts) == 2 and len(cluster.faults.fired) == 3
    for attempt in (0, 1):
        assert re.search(rf"attempt {attempt}: rank 0: RuntimeError: fault injected", message), message
    assert cluster.leftovers() == []
