"""A WorkerGroup on the fake cluster: what arrives from another thread or
from the cluster while the group lives (a shutdown, a drain, new room), and
what the group does between calls (refilling its spares). Virtual time: the
poll that notices a drain, or the 5 s a spare waits before it starts, pass
in microseconds, and always in the same order."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, List

import pytest

from raydist.config import RunConfig
from raydist.errors import InfeasibleResourcesError, WorkerGroupClosed, WorkerGroupError
from raydist.pool.driver.calls import prepare_call
from raydist.pool.driver.controller import RunController, run_call
from raydist.pool.driver.group import WorkerGroup
from raydist.pool.driver.spares import REFILL_DELAY_S
from raydist.pool.records import GroupPhase
from raydist.pool.rules.policy import Action, Decision, Facts
from raydist.testing.fake import FakeCluster, Fault
from raydist.testing.workers import current_attempt, current_rank

NODES = {"node-a": {"CPU": 2}, "node-b": {"CPU": 2}, "node-c": {"CPU": 1}}


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="raydist")


def later(holder: List[WorkerGroup], act: Callable[[WorkerGroup], Any]) -> Callable[[], None]:
    """What another thread does to the group (made once the group exists)."""
    return lambda: act(holder[0])


def group_on(cluster: FakeCluster, holder: List[WorkerGroup], **options: Any) -> WorkerGroup:
    group = WorkerGroup(config=RunConfig(flight_recorder=False, **options), cluster=cluster)
    holder.append(group)
    return group


@pytest.mark.parametrize("graceful", [True, False])
def test_a_shutdown_from_another_thread_ends_the_running_call(graceful: bool) -> None:
    holder: List[WorkerGroup] = []
    shutdown = later(holder, lambda group: group.shutdown(graceful=graceful))
    cluster = FakeCluster(NODES, [Fault("execute", "hang", who=1), Fault("execute", "act", who=2, action=shutdown)])
    group = group_on(cluster, holder, num_workers=4)
    with pytest.raises(WorkerGroupClosed, match="shut down while the call ran"):
        group.run(current_rank)
    assert group.phase is GroupPhase.CLOSED and cluster.leftovers() == []
    # A graceful shutdown gives rank 1 (stuck in its call) the teardown's 5 s before it is killed.
    assert cluster.monotonic() == (5.0 if graceful else 0.0)
    with pytest.raises(RuntimeError, match="has been shut down"):
        group.run(current_rank)


def test_a_shutdown_during_a_warm_restart_ends_it_and_raises_the_failure() -> None:
    holder: List[WorkerGroup] = []
    shutdown = later(holder, lambda group: group.shutdown())
    # Rank 1 dies; while the survivors leave their process group, the group is shut down.
    cluster = FakeCluster(NODES, [Fault("execute", "die", who=1), Fault("teardown", "act", who=0, action=shutdown)])
    group = group_on(cluster, holder, num_workers=4, max_restarts=1)
    with pytest.raises(WorkerGroupError, match="root cause: rank 1 on node node-a") as failure:
        group.run(current_rank)
    assert not failure.value.restarted_in_place
    assert group.phase is GroupPhase.CLOSED and group.restarts_used == 0 and cluster.leftovers() == []


def test_a_draining_nodes_ranks_are_warned_once_with_its_deadline() -> None:
    cluster = FakeCluster(NODES, [Fault("execute", "drain-node", who=2)])  # node-b: ranks 2 and 3
    with WorkerGroup(config=RunConfig(num_workers=4, flight_recorder=False), cluster=cluster) as group:
        assert group.run(current_rank) == [0, 1, 2, 3]
        deadline = cluster.draining_nodes()["node-b"]
        cluster.sleep(10 * group.config.monitor_interval)  # ten polls
        assert group.drained_nodes == {"node-b": deadline}
        warned = {agent.node_id: agent.warned for agent in cluster.processes.agents}
        assert warned == {"node-a": [], "node-b": [(2, deadline), (3, deadline)]}
    assert cluster.leftovers() == []


def test_a_spare_takes_a_dead_ranks_place_and_a_new_spare_starts_after_the_delay() -> None:
    cluster = FakeCluster(NODES, [Fault("execute", "die", who=1)])
    with WorkerGroup(config=RunConfig(num_workers=4, spare_workers=1, max_restarts=1, flight_recorder=False), cluster=cluster) as group:
        spare = group.spares[0].pid
        with pytest.raises(WorkerGroupError) as failure:
            group.run(current_rank)
        assert failure.value.restarted_in_place and group.restart_count == 1
        assert spare in [worker.pid for worker in group.workers] and group.spares == []
        cluster.sleep(REFILL_DELAY_S - 0.1)
        assert group.spares == []  # its start waits, so as not to slow the new world's first steps
        cluster.sleep(0.2)
        assert len(group.spares) == 1 and len(cluster.processes.workers) == 6  # 4 + the spare + its successor
        assert group.run(lambda: (current_rank(), current_attempt())) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert cluster.leftovers() == []


def test_new_room_restarts_an_elastic_group_larger_not_counted() -> None:
    cluster = FakeCluster({"node-a": {"CPU": 2}})
    arrive = Fault("execute", "act", who=0, action=lambda: cluster.add_node("node-b", {"CPU": 2}))
    cluster.faults.add(arrive, Fault("execute", "hang", who=1))  # the call runs on until the group restarts
    config = RunConfig(num_workers=(2, 4), restart_to_grow=True, max_restarts=0, flight_recorder=False)
    values = run_call(
        RunController(cluster, config, fresh_restarts=True), prepare_call(cluster, lambda: (current_rank(), current_attempt()))
    )
    assert values == [(0, 1), (1, 1), (2, 1), (3, 1)]  # attempt 1, of 4, though no restart was allowed
    assert cluster.monotonic() == config.monitor_interval and cluster.leftovers() == []


class LaggingCluster(FakeCluster):
    """Ray's view of free resources lags a placement group's removal: one CPU of
    the first one freed shows as taken for a second more."""

    lagged = False

    def free(self, reservation: Any) -> None:
        super().free(reservation)
        node = next((n for n in reservation.nodes.values() if n is not None), None)
        if node is not None and not self.lagged:
            self.lagged = True
            shadow = self.nodes.occupy(node, {"CPU": 1})
            self.after(1.0, lambda: self.nodes.release(shadow), "the freed bundle shows")


def test_a_growth_waits_for_the_room_it_saw_while_the_old_world_shows_as_taken() -> None:
    cluster = LaggingCluster({"node-a": {"CPU": 2}})
    arrive = Fault("execute", "act", who=0, action=lambda: cluster.add_node("node-b", {"CPU": 2}))
    cluster.faults.add(arrive, Fault("execute", "hang", who=1))
    config = RunConfig(num_workers=(2, 4), restart_to_grow=True, max_restarts=0, flight_recorder=False)
    values = run_call(
        RunController(cluster, config, fresh_restarts=True), prepare_call(cluster, lambda: (current_rank(), current_attempt()))
    )
    # One growth to 4 (an elastic reservation would take the 3 that show, then grow again).
    assert values == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert cluster.leftovers() == []


def test_a_group_after_its_cluster_is_gone_says_so_and_starts_nothing() -> None:
    cluster = FakeCluster(NODES)
    group = WorkerGroup(config=RunConfig(num_workers=2, flight_recorder=False), cluster=cluster)
    cluster.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        group.run(current_rank)
    group.shutdown()
    assert cluster.leftovers() == []


def test_the_policy_is_the_one_that_decides() -> None:
    """An injected policy that never restarts: the dead rank's error is raised, nothing restarted."""
    asked: List[Facts] = []

    def never(error: BaseException, facts: Facts) -> Decision:
        asked.append(facts)
        return Decision(Action.RAISE)

    cluster = FakeCluster(NODES, [Fault("execute", "die", who=1)])
    config = RunConfig(num_workers=4, max_restarts=3, flight_recorder=False)
    with pytest.raises(WorkerGroupError, match="root cause: rank 1"):
        run_call(RunController(cluster, config, fresh_restarts=True, policy=never), prepare_call(cluster, current_rank))
    assert [(f.started, f.restarts_left, f.fresh_allowed) for f in asked] == [(True, 3, True)]  # asked once
    assert len(cluster.processes.workers) == 4 and cluster.leftovers() == []


def test_a_run_waits_for_room_that_another_group_frees_within_startup_timeout() -> None:
    cluster = FakeCluster({"node-a": {"CPU": 2}, "node-b": {"CPU": 2}})
    other = WorkerGroup(config=RunConfig(num_workers=2, flight_recorder=False), cluster=cluster)  # holds 2 of the 4 CPUs
    cluster.after(12.0, other.shutdown, "test-other-group-ends")
    config = RunConfig(num_workers=4, startup_timeout=30, flight_recorder=False)
    assert run_call(RunController(cluster, config, fresh_restarts=True), prepare_call(cluster, current_rank)) == [0, 1, 2, 3]
    assert 12.0 <= cluster.monotonic() < 30.0 and other.closed and cluster.leftovers() == []


def test_a_run_that_never_gets_room_gives_up_after_startup_timeout_leaving_nothing() -> None:
    cluster = FakeCluster({"node-a": {"CPU": 2}, "node-b": {"CPU": 2}})
    with WorkerGroup(config=RunConfig(num_workers=2, flight_recorder=False), cluster=cluster):  # holds 2 of the 4 CPUs
        with pytest.raises(InfeasibleResourcesError, match="gave up after 30 s"):
            WorkerGroup(config=RunConfig(num_workers=4, startup_timeout=30, flight_recorder=False), cluster=cluster)
        assert cluster.monotonic() >= 30.0
    assert cluster.leftovers() == []


@pytest.mark.parametrize(("method", "nth"), [("describe", 1), ("stand_by", 0)])  # slot 1's: its first worker described once
def test_a_spare_that_dies_while_starting_is_left_out_and_nothing_leaks(method: str, nth: int) -> None:
    # Rank 1 dies; the spare takes its place; its successor (in slot 1, 5 s later) dies while it starts.
    cluster = FakeCluster(NODES, [Fault("execute", "die", who=1), Fault(method, "die", who=1, nth=nth)])
    with WorkerGroup(config=RunConfig(num_workers=4, spare_workers=1, max_restarts=1, flight_recorder=False), cluster=cluster) as group:
        with pytest.raises(WorkerGroupError):
            group.run(current_rank)
        cluster.sleep(REFILL_DELAY_S + 1)
        assert group.spares == [] and len(cluster.processes.workers) == 6  # tried once, not again and again
        assert group.run(current_rank) == [0, 1, 2, 3]  # the group runs on without a spare
    assert cluster.leftovers() == []


@pytest.mark.parametrize("order", ["newest first", "oldest first"])
def test_two_calls_in_flight_end_the_same_way_whatever_order_they_are_read_in(order: str) -> None:
    # Rank 1 dies in the first of two calls in flight; the group may restart once.
    cluster = FakeCluster(NODES, [Fault("execute", "die", who=1)])
    group = group_on(cluster, [], num_workers=4, max_restarts=1)
    first, second = group.submit(current_rank), group.submit(current_rank)
    errors = []
    for future in [second, first] if order == "newest first" else [first, second]:
        with pytest.raises(WorkerGroupError, match="root cause: rank 1") as failed:
            future.result()
        errors.append(failed.value)
    # One restart for the one failure: both calls say the group restarted in place, and it serves the next call.
    assert [error.restarted_in_place for error in errors] == [True, True]
    assert group.phase is GroupPhase.RUNNING and group.restart_count == 1 and group.restarts_used == 1
    assert group.run(current_rank) == [0, 1, 2, 3]
    group.shutdown()
    assert cluster.leftovers() == []


def test_two_calls_in_flight_read_from_two_threads_at_once_restart_the_group_once() -> None:
    cluster = FakeCluster(NODES, [Fault("execute", "die", who=1)])
    group = group_on(cluster, [], num_workers=4, max_restarts=1)
    futures = [group.submit(current_rank) for _ in range(3)]
    outcomes: List[Any] = [None] * len(futures)

    def read(index: int) -> None:
        try:
            outcomes[index] = futures[index].result()
        except BaseException as error:  # noqa: BLE001 - what each thread saw is the test's
            outcomes[index] = error

    threads = [threading.Thread(target=read, args=(i,)) for i in reversed(range(len(futures)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [type(outcome) for outcome in outcomes] == [WorkerGroupError] * 3, outcomes
    assert all(outcome.restarted_in_place for outcome in outcomes)
    assert group.phase is GroupPhase.RUNNING and group.restarts_used == 1
    assert group.run(current_rank) == [0, 1, 2, 3]
    group.shutdown()
    assert cluster.leftovers() == []
