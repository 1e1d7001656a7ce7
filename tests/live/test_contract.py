"""The engine's contract on a real Ray: the scenarios of
``tests/contract_scenarios.py`` end here exactly as on the fake cluster
(``tests/unit/driver/test_contract_fake.py``) and as the table says. Ranks
really die (``os._exit``) and hang (a long sleep); another thread really
shuts the group down or cancels its call. A few run in ``make test``, all
in ``make soak``."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any, List, Optional

import contract_scenarios
import pytest
import ray
from conftest import assert_nothing_left, drain_node, wait_for
from contract_scenarios import SCENARIOS, WORKERS, Scenario, behave, ending_of

import raydist

pytestmark = [pytest.mark.timeout(240)]
DRAIN_NOTICE_S = 20  # as the fake cluster's drain: the node is to go this long after the notice
ray.cloudpickle.register_pickle_by_value(contract_scenarios)  # the workers need not find tests/ on their path


def read(future: Any) -> Any:
    try:
        return future.result()
    except (raydist.RaydistError, KeyboardInterrupt) as error:
        return error


def act_once_rank_0_runs(scenario: Scenario, marks: Path, group: raydist.WorkerGroup, futures: List[Any]) -> Optional[threading.Thread]:
    """Another thread's shutdown() or cancel(), or Ctrl-C (SIGINT to the reading
    main thread), once rank 0 is in the first call."""
    if scenario.other_thread is None:
        return None
    assert threading.current_thread() is threading.main_thread()  # where Ctrl-C lands

    def act() -> None:
        wait_for(lambda: (marks / "call-0.started").exists(), 60, "rank 0 in its call")
        if scenario.other_thread == "interrupt":
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        elif scenario.other_thread == "shutdown":
            group.shutdown()
        else:
            futures[0].cancel()

    thread = threading.Thread(target=act)
    thread.start()
    return thread


class NodeTaker(threading.Thread):
    """Once a rank whose node a step takes away (or drains) is in its call,
    remove that node (as a machine lost), or drain it (as a spot preemption).
    What went wrong here is kept for the test to report (``check``)."""

    def __init__(self, scenario: Scenario, marks: Path, cluster: Any):
        super().__init__(name="node-taker")
        self.steps = [step for step in scenario.steps if step.kind in ("lose-node", "drain-node")]
        self.marks, self.cluster = marks, cluster
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            for step in self.steps:
                mark = self.marks / f"rank-{step.rank}.node"
                wait_for(mark.exists, 120, f"rank {step.rank} in its call")
                node_id = mark.read_text()
                if step.kind == "drain-node":
                    drain_node(self.cluster.address, node_id, DRAIN_NOTICE_S)
                    continue
                nodes = [node for node in self.cluster.worker_nodes if node.node_id == node_id]
                assert nodes, f"rank {step.rank}'s node {node_id} is none of the cluster's worker nodes"
                self.cluster.remove_node(nodes[0], allow_graceful=False)
        except BaseException as error:  # noqa: BLE001 - reported by the test's own thread
            self.error = error
            print(f"taking a node away failed: {error!r}", file=sys.stderr)

    def check(self) -> None:
        self.join(timeout=60)
        assert not self.is_alive(), "taking the node away did not end"
        if self.error is not None:
            raise self.error


def param(scenario: Scenario) -> Any:
    return pytest.param(scenario, marks=[] if scenario.in_make_test else [pytest.mark.soak])


@pytest.mark.parametrize("scenario", [param(s) for s in SCENARIOS if not s.spread], ids=lambda s: s.name)
def test_each_scenario_ends_as_on_the_fake(scenario: Scenario, tmp_path: Path, ray_local: None) -> None:
    check_scenario(scenario, tmp_path)


# A worker per node and a node to spare; the driver's node hosts none.
@pytest.mark.nodes({"num_cpus": 0}, {"num_cpus": 1}, {"num_cpus": 1}, {"num_cpus": 1})
@pytest.mark.parametrize("scenario", [param(s) for s in SCENARIOS if s.spread], ids=lambda s: s.name)
def test_each_node_scenario_ends_as_on_the_fake(scenario: Scenario, cluster: Any, tmp_path: Path) -> None:
    taker = NodeTaker(scenario, tmp_path, cluster)
    taker.start()
    try:
        check_scenario(scenario, tmp_path)
    finally:
        taker.check()


def check_scenario(scenario: Scenario, tmp_path: Path) -> None:
    options = {"num_workers": WORKERS, "accelerator": "cpu", **scenario.options}
    if not scenario.group:
        try:
            outcome: Any = raydist.run(behave, args=(scenario.steps, 0, str(tmp_path)), **options)
        except raydist.RaydistError as error:
            outcome = error
        assert (ending_of(outcome),) == scenario.endings, outcome
        assert_nothing_left(files=False)
        return
    group = raydist.WorkerGroup(**options)
    futures = [group.submit(behave, args=(scenario.steps, call, str(tmp_path))) for call in range(scenario.calls)]
    # A process started with SIGINT ignored (a background job, nohup) keeps it
    # ignored, and Ctrl-C then raises nothing: the scenario restores Python's own.
    restore = scenario.other_thread == "interrupt" and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if restore:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        other = act_once_rank_0_runs(scenario, tmp_path, group, futures)
        outcomes: List[Any] = [None] * scenario.calls
        for index in scenario.read_order:
            outcomes[index] = read(futures[index])
        if other is not None:
            other.join(timeout=60)
    finally:
        if restore:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    if scenario.other_thread == "interrupt":  # the call itself ended with the stop
        assert isinstance(read(futures[0]), raydist.WorkerGroupClosed)
    assert tuple(ending_of(outcome) for outcome in outcomes) == scenario.endings, outcomes
    assert (group.phase.value, group.restart_count) == (scenario.phase, scenario.restart_count)
    group.shutdown()
    assert_nothing_left(files=False)
