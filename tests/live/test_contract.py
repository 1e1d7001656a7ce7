"""The engine's contract on a real Ray: the scenarios of
``tests/contract_scenarios.py`` end here exactly as on the fake cluster
(``tests/unit/driver/test_contract_fake.py``) and as the table says. Ranks
really die (``os._exit``) and hang (a long sleep); another thread really
shuts the group down or cancels its call. A few run in ``make test``, all
in ``make soak``."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any, List, Optional

import contract_scenarios
import pytest
import ray
from conftest import assert_nothing_left, wait_for
from contract_scenarios import SCENARIOS, WORKERS, Scenario, behave, ending_of

import raydist

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("ray_local")]
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


@pytest.mark.parametrize(
    "scenario", [pytest.param(s, marks=[] if s.in_make_test else [pytest.mark.soak]) for s in SCENARIOS], ids=lambda s: s.name
)
def test_each_scenario_ends_as_on_the_fake(scenario: Scenario, tmp_path: Path) -> None:
    options = dict(num_workers=WORKERS, accelerator="cpu", **scenario.options)
    if not scenario.group:
        try:
            outcome: Any = raydist.run(behave, args=(scenario.steps, 0), **options)
        except raydist.RaydistError as error:
            outcome = error
        assert (ending_of(outcome),) == scenario.endings, outcome
        assert_nothing_left(files=False)
        return
    group = raydist.WorkerGroup(**options)
    futures = [group.submit(behave, args=(scenario.steps, call, str(tmp_path))) for call in range(scenario.calls)]
    other = act_once_rank_0_runs(scenario, tmp_path, group, futures)
    outcomes: List[Any] = [None] * scenario.calls
    for index in scenario.read_order:
        outcomes[index] = read(futures[index])
    if other is not None:
        other.join(timeout=60)
    if scenario.other_thread == "interrupt":  # the call itself ended with the stop
        assert isinstance(read(futures[0]), raydist.WorkerGroupClosed)
    assert tuple(ending_of(outcome) for outcome in outcomes) == scenario.endings, outcomes
    assert (group.phase.value, group.restart_count) == (scenario.phase, scenario.restart_count)
    group.shutdown()
    assert_nothing_left(files=False)
