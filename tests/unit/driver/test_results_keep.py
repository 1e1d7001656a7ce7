"""What raydist hands back can be kept: ``raydist.run``'s results (a list
with its summary), ``WorkerGroup.run``'s values, the summary itself and every
public error pickle and deep-copy, and come back equal (a function that
returns a nested run's results, or code that saves or sends them, relies on
it). Real runs on the fake cluster make the values, so each holds what a run
really leaves in it (attempts, failures, the root cause)."""

from __future__ import annotations

import copy
import importlib
import logging
import pickle
from typing import Any, Callable, Dict, List

import pytest

import raydist
from raydist import errors
from raydist.config import RunConfig
from raydist.core.state import StateSizeError
from raydist.errors import CollectiveEntry, RaydistError, WorkerFailure, WorkerGroupError
from raydist.pool.driver.calls import prepare_call
from raydist.pool.driver.controller import RunController, run_call
from raydist.pool.driver.group import WorkerGroup
from raydist.pool.driver.summary import RunResults, RunSummary
from raydist.testing.fake import FakeCluster, Fault
from raydist.testing.workers import current_rank

NODES = {"node-a": {"CPU": 2}, "node-b": {"CPU": 2}}
KEEPS: Dict[str, Callable[[Any], Any]] = {"pickle": lambda value: pickle.loads(pickle.dumps(value)), "deepcopy": copy.deepcopy}


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="raydist")


def run_on_fake(faults: List[Fault], **options: Any) -> RunResults:
    cluster = FakeCluster(NODES, faults)
    controller = RunController(cluster, RunConfig(flight_recorder=False, **options), fresh_restarts=True)
    return run_call(controller, prepare_call(cluster, current_rank, (), None))


def fields(error: BaseException) -> Any:
    return type(error), error.args, {name: value for name, value in vars(error).items() if name != "attempts"}


@pytest.mark.parametrize("keep", KEEPS)
def test_a_runs_results_and_summary_come_back_equal(keep: str) -> None:
    # A crash and a restart: the summary holds two attempts, the first ended by rank 1.
    results = run_on_fake([Fault("execute", "die", who=1)], num_workers=4, max_restarts=1)
    assert results == [0, 1, 2, 3] and len(results.summary.attempts) == 2
    kept = KEEPS[keep](results)
    assert type(kept) is RunResults and kept == results and kept.summary == results.summary
    assert kept.summary is not results.summary and kept.summary.table() == results.summary.table()
    kept.summary.ended("still usable")  # its lock came back with it
    assert KEEPS[keep]((results, "nested")) == (results, "nested")


@pytest.mark.parametrize("keep", KEEPS)
def test_a_worker_groups_values_and_summary_come_back_equal(keep: str) -> None:
    with WorkerGroup(config=RunConfig(num_workers=2, flight_recorder=False), cluster=FakeCluster(NODES)) as group:
        values, summary = group.run(current_rank), group.summary()
        assert KEEPS[keep](values) == values == [0, 1]
        assert isinstance(summary, RunSummary) and KEEPS[keep](summary) == summary


@pytest.mark.parametrize("keep", KEEPS)
def test_a_failed_runs_error_comes_back_with_its_failures_attempts_and_summary(keep: str) -> None:
    with pytest.raises(WorkerGroupError) as caught:
        run_on_fake([Fault("execute", "die", who=1), Fault("execute", "raise", who=2, nth=1)], num_workers=4, max_restarts=1)
    error = caught.value
    assert error.summary is not None and len(error.attempts) == 1
    kept = KEEPS[keep](error)
    assert fields(kept) == fields(error) and str(kept) == str(error)
    assert [fields(a) for a in kept.attempts] == [fields(a) for a in error.attempts]
    assert kept.root_cause == error.root_cause and kept.failed_ranks == error.failed_ranks


FAILURE = WorkerFailure(
    2,
    "node-a",
    "10.0.0.1",
    4711,
    1.0,
    died="SIGKILL",
    collectives=(CollectiveEntry("0", 3, "all_reduce", ((4,),), ("float32",), 5, False),),
)


def every_public_error() -> List[BaseException]:
    """One of each error ``raydist`` exports, built as the engine builds it."""
    made = {
        errors.WorkerGroupError: errors.WorkerGroupError([FAILURE], preempted_nodes=["node-a"], collectives="rank 2: all_reduce #3"),
        errors.WorkerGroupTimeout: errors.WorkerGroupTimeout(30.0, [1, 3], stacks="rank 1: in f", collectives="rank 1: #3"),
        errors.WorkerStartupTimeout: errors.WorkerStartupTimeout(60.0, "initialised", 4, ["rank 3 on node-b"]),
        errors.WorkerGroupStopped: errors.WorkerGroupStopped("room to grow"),
        errors.WorkerGroupClosed: errors.WorkerGroupClosed("shut down while the call ran"),
        errors.WorkerCallCancelled: errors.WorkerCallCancelled("cancelled"),
        errors.InfeasibleResourcesError: errors.InfeasibleResourcesError("no node has 8 GPUs"),
        errors.RaydistError: errors.RaydistError("a run failed"),
        StateSizeError: StateSizeError("saved by 4 ranks, loaded by 2"),
    }
    # Every exported name of the modules that define errors (the rest import Ray).
    modules = {"raydist.errors", "raydist.core.state"}
    exported = {getattr(importlib.import_module(module), name) for name, module in raydist._EXPORTS.items() if module in modules}
    exported_errors = {e for e in exported if isinstance(e, type) and issubclass(e, BaseException)}
    assert exported_errors <= set(made), f"a public error with no case here: {exported_errors - set(made)}"
    return list(made.values())


@pytest.mark.parametrize("keep", KEEPS)
@pytest.mark.parametrize("error", every_public_error(), ids=lambda error: type(error).__name__)
def test_every_public_error_comes_back_equal(error: BaseException, keep: str) -> None:
    if isinstance(error, RaydistError):
        error = error.with_summary(RunSummary())
    kept = KEEPS[keep](error)
    assert fields(kept) == fields(error) and str(kept) == str(error)
    assert pickle.loads(pickle.dumps(FAILURE)) == FAILURE == copy.deepcopy(FAILURE)
