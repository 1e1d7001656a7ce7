"""The engine's contract on the fake cluster: every scenario of
``tests/contract_scenarios.py`` ends as its table says (the live tier runs
the same table on a real Ray: ``tests/live/test_contract.py``)."""

from __future__ import annotations

import logging
from typing import Any, Callable, List

import pytest
from contract_scenarios import HANG_S, SCENARIOS, WORKERS, Scenario, behave, ending_of

from raydist.config import RunConfig
from raydist.errors import RaydistError, WorkerGroupClosed
from raydist.pool.driver.calls import WorkerFuture, prepare_call
from raydist.pool.driver.controller import RunController, run_call
from raydist.pool.driver.group import WorkerGroup
from raydist.testing.fake import FakeCluster, Fault

NODES = {"node-a": {"CPU": 4}}  # one machine, as the live tier's local Ray
SPREAD = {"node-a": {"CPU": 1}, "node-b": {"CPU": 1}, "node-c": {"CPU": 1}}  # a worker per node, one to spare


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="raydist")


def faults_for(scenario: Scenario, futures: List[WorkerFuture], group: List[WorkerGroup]) -> List[Fault]:
    """The fake's faults: a rank that dies or hangs in its n-th call; another thread's act at rank 0's first call."""
    faults = [
        Fault("execute", step.kind, who=step.rank, nth=step.attempt + step.call, seconds=HANG_S if step.kind == "drain-node" else 0.0)
        for step in scenario.steps
        if step.kind in ("die", "hang", "lose-node", "drain-node")
    ]
    act: Callable[[], Any]
    if scenario.other_thread == "interrupt":
        return [*faults, Fault("execute", "interrupt", who=0)]
    if scenario.other_thread == "shutdown":
        act = lambda: group[0].shutdown()  # noqa: E731
    elif scenario.other_thread == "cancel":
        act = lambda: futures[0].cancel()  # noqa: E731
    else:
        return faults
    return [*faults, Fault("execute", "act", who=0, action=act)]


def read(future: Any) -> Any:
    try:
        return future.result()
    except (RaydistError, KeyboardInterrupt) as error:
        return error


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_each_scenario_ends_as_the_contract_says_on_the_fake(scenario: Scenario) -> None:
    futures: List[WorkerFuture] = []
    holder: List[WorkerGroup] = []
    cluster = FakeCluster(SPREAD if scenario.spread else NODES, faults_for(scenario, futures, holder))
    config = RunConfig(**{"num_workers": WORKERS, "flight_recorder": False, **scenario.options})
    if not scenario.group:
        try:
            outcome: Any = run_call(RunController(cluster, config, fresh_restarts=True), prepare_call(cluster, behave, (scenario.steps, 0)))
        except RaydistError as error:
            outcome = error
        assert (ending_of(outcome),) == scenario.endings
        assert cluster.leftovers() == []
        return
    group = WorkerGroup(config=config, cluster=cluster)
    holder.append(group)
    futures.extend(group.submit(behave, (scenario.steps, call)) for call in range(scenario.calls))
    outcomes = [None] * scenario.calls
    for index in scenario.read_order:
        outcomes[index] = read(futures[index])
    assert tuple(ending_of(outcome) for outcome in outcomes) == scenario.endings
    if scenario.other_thread == "interrupt":  # the call itself ended with the stop
        assert isinstance(read(futures[0]), WorkerGroupClosed)
    assert (group.phase.value, group.restart_count) == (scenario.phase, scenario.restart_count)
    group.shutdown()
    assert cluster.leftovers() == []
