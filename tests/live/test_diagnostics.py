"""Every failure explained: why a rank's process died (on whichever node),
where a hung rank is, what a @record script wrote, a value that cannot come
back, and a cancelled call."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import pytest
import torch.distributed as dist
from conftest import assert_nothing_left

import raydist

pytestmark = pytest.mark.timeout(180)

# -- live: a rank's process dies -----------------------------------------------


def die_on_rank_one(how: str) -> None:
    if dist.get_rank() == 1:
        print(f"rank 1 last words before {how}", file=sys.stderr, flush=True)
        if how == "abort":
            os.abort()
        elif how == "exit":
            os._exit(7)
        elif how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)  # as from outside: nothing can catch it
    threading.Event().wait()


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize(
    "how, cause",
    [
        ("sigkill", "SIGKILL"),
        pytest.param("abort", "killed by SIGABRT", marks=pytest.mark.soak),
        pytest.param("exit", "exited with status 7 (os._exit)", marks=pytest.mark.soak),
    ],
)
def test_a_dead_rank_is_reported_with_its_cause_and_last_stderr_lines(how: str, cause: str) -> None:
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(die_on_rank_one, num_workers=2, args=(how,), resources_per_worker={"CPU": 0.5})
    error = caught.value
    assert error.root_cause.rank == 1 and error.crashed
    assert cause in (error.root_cause.died or ""), str(error)
    assert f"rank 1 last words before {how}" in (error.root_cause.output or ""), str(error)
    message = str(error)
    assert "root cause: rank 1 on node" in message and f"last words before {how}" in message
    assert_nothing_left()


# -- live: where hung ranks are ------------------------------------------------


def rank_one_stuck_in_python() -> None:
    if dist.get_rank() == 1:

        def waiting_for_a_file_that_never_comes() -> None:
            threading.Event().wait()

        waiting_for_a_file_that_never_comes()
    dist.barrier()


@pytest.mark.soak  # make test: test_hangs::test_timeout_names_the_rank_that_skipped_a_collective_... checks the stacks of a timeout too
@pytest.mark.usefixtures("ray_local")
def test_timeout_names_where_each_rank_was_and_marks_the_odd_one() -> None:
    start = time.monotonic()
    with pytest.raises(raydist.WorkerGroupTimeout) as caught:
        raydist.run(rank_one_stuck_in_python, num_workers=2, timeout=5, resources_per_worker={"CPU": 0.5})
    assert time.monotonic() - start < 5 + 15
    stacks = caught.value.stacks
    assert "rank 0: in barrier" in stacks, stacks
    rank_one = stacks.split("rank 1:")[1]
    assert (
        rank_one.startswith(" in wait at threading.py") and "from waiting_for_a_file_that_never_comes at test_diagnostics.py" in rank_one
    ), stacks
    assert "<-- differs" in rank_one and "<-- differs" not in stacks.split("rank 1:")[0], stacks
    assert "rank 0: in barrier" in str(caught.value)
    assert_nothing_left()


@pytest.mark.soak  # make test: test_hangs::test_stacks_of_a_live_group_say_where_the_collectives_diverged
@pytest.mark.usefixtures("ray_local")
def test_stacks_of_a_live_group_without_stopping_it() -> None:
    with raydist.WorkerGroup(2, resources_per_worker={"CPU": 0.5}) as group:
        # Between calls (before the first, after one) a rank is idle: raydist's
        # own threads (its diagnostics socket) are not where it is.
        before = group.stacks()
        group.run(noop)
        for idle in (before, group.stacks()):
            assert idle.splitlines()[0] == "ranks 0-1: idle (no call running)" and "recorder.py" not in idle, idle
        future = group.submit(rank_one_stuck_in_python)
        text = group.stacks()
        for _ in range(50):  # the call may not have reached its wait yet: ask until both are there
            if "rank 0: in barrier" in text and "from waiting_for_a_file_that_never_comes" in text:
                break
            text = group.stacks()
        assert "rank 0: in barrier" in text and "from waiting_for_a_file_that_never_comes" in text, text
        assert not future.done()  # still running: stacks() stopped nothing
        assert future.cancel()
        with pytest.raises(raydist.WorkerCallCancelled):
            future.result()
    assert_nothing_left()


# -- live: values that cannot come back ----------------------------------------


class Unpicklable:
    def __init__(self) -> None:
        self.lock = threading.Lock()


def return_unpicklable_on_rank_one() -> Any:
    return Unpicklable() if dist.get_rank() == 1 else 0


@pytest.mark.soak  # make test: test_unusual_inputs::test_a_value_that_cannot_be_unpickled_on_the_driver_is_reported_as_such
@pytest.mark.usefixtures("ray_local")
def test_an_unpicklable_return_value_names_the_rank_and_type() -> None:
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(return_unpicklable_on_rank_one, num_workers=2, resources_per_worker={"CPU": 0.5})
    assert caught.value.failed_ranks == [1]
    message = str(caught.value)
    assert "the return value of rank 1 (a test_diagnostics.Unpicklable) cannot be pickled" in message, message
    assert "\x1b[" not in message and "^^^" not in message


def noop() -> None:
    return None


@pytest.mark.usefixtures("ray_local")
def test_a_horovod_rank_that_aborts_inside_hvd_init_is_reported_with_its_cause() -> None:
    pytest.importorskip("horovod.torch")
    # gloo aborts the process in hvd.init() when its interface does not exist.
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(noop, num_workers=2, backend="horovod", env={"HOROVOD_GLOO_IFACE": "nonexistent0"})
    root = caught.value.root_cause
    assert root.died == "killed by SIGABRT (aborted)", str(caught.value)
    assert "Unable to find address for: nonexistent0" in (root.output or ""), str(caught.value)
    assert_nothing_left()


def raise_in_user_code() -> None:
    def inner_helper() -> None:
        raise KeyError("missing column")

    inner_helper()


@pytest.mark.usefixtures("ray_local")
def test_a_traceback_starts_at_the_users_frame() -> None:
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(raise_in_user_code, num_workers=1)
    traceback = caught.value.root_cause.traceback or ""
    frames = [line.strip() for line in traceback.splitlines() if line.strip().startswith("File ")]
    assert frames[0].endswith("in raise_in_user_code") and frames[-1].endswith("in inner_helper"), traceback
    assert "raydist" not in traceback.replace("test_diagnostics", "")
