"""Failures become fast, clear errors, and leave nothing behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, List

import pytest
import ray
import torch.distributed as dist
from conftest import REPO, assert_nothing_left, live_raydist_actors, repeats

import raydist

pytestmark = pytest.mark.timeout(180)

DETECTION_BOUND_S = 5.0
INFEASIBLE_BOUND_S = 10.0


def block_forever() -> None:
    threading.Event().wait()


def die_on_rank_one(how: str) -> None:
    if dist.get_rank() == 1:
        if how == "exit":
            os._exit(7)
        os.kill(os.getpid(), signal.SIGSEGV)
    block_forever()


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("how", [pytest.param("exit", marks=pytest.mark.soak), "segfault"])  # the death's text: tests/unit/rules
def test_worker_process_death_is_reported_fast(how: str) -> None:
    with raydist.WorkerGroup(2) as group:  # rank 1 dies, rank 0 is the peer left blocked
        start = time.monotonic()
        with pytest.raises(raydist.WorkerGroupError) as caught:
            group.run(die_on_rank_one, args=(how,))
        elapsed = time.monotonic() - start
        dead_pid = group.workers[1].pid
    error = caught.value
    assert elapsed < DETECTION_BOUND_S
    assert error.failed_ranks == [1] and error.crashed
    assert error.root_cause.pid == dead_pid and error.root_cause.died
    assert "rank 1" in str(error) and "process died" in str(error)
    assert_nothing_left()


@pytest.mark.soak  # make test: test_worker_process_death_is_reported_fast and test_diagnostics' dead rank (SIGKILL)
@pytest.mark.usefixtures("ray_local")
def test_sigkill_from_the_driver_is_reported_fast() -> None:
    group = raydist.WorkerGroup(2)
    future = group.submit(block_forever)
    victim = group.workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(raydist.WorkerGroupError) as caught:
        future.result(timeout=60)
    assert time.monotonic() - start < DETECTION_BOUND_S
    assert caught.value.failed_ranks == [1]
    assert caught.value.root_cause.pid == victim.pid and caught.value.crashed
    assert "SIGKILL" in (caught.value.root_cause.died or ""), str(caught.value)
    assert_nothing_left()


def sleep_on_rank_zero() -> int:
    if dist.get_rank() == 0:
        block_forever()
    return dist.get_rank()


@pytest.mark.soak  # the engine's logic, on the fake cluster in the unit tier: test_engine_calls::test_the_groups_own_timeout_tears_down...; real stacks: test_hangs::test_timeout_names_the_rank_that_skipped_a_collective_and_both_sequence_numbers
@pytest.mark.usefixtures("ray_local")
def test_timeout_names_unfinished_ranks_and_tears_down() -> None:
    start = time.monotonic()
    with pytest.raises(raydist.WorkerGroupTimeout) as caught:
        raydist.run(sleep_on_rank_zero, num_workers=2, timeout=3)
    assert caught.value.unfinished_ranks == [0]
    assert "rank 0 had not finished" in str(caught.value)
    assert isinstance(caught.value, TimeoutError)
    assert time.monotonic() - start < 3 + 30  # start-up + timeout, not forever
    assert_nothing_left()


def raise_on_every_rank() -> None:
    raise KeyError("same on all")


@pytest.mark.soak  # make test: the grouping is tests/unit/rules (format_failures); real ranks raising: test_group::test_failed_run_names_rank_and_node_and_leaves_nothing_behind
@pytest.mark.usefixtures("ray_local")
def test_identical_tracebacks_are_shown_once_with_rank_list() -> None:
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(raise_on_every_rank, num_workers=2)
    message = str(caught.value)
    assert caught.value.failed_ranks == [0, 1]
    assert message.count("KeyError: 'same on all'") == 1
    assert "ranks 0-1" in message
    assert "[root cause]" in message


def crash_once(how: str) -> List[Any]:
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if restart == 0 and dist.get_rank() == 1:
        if how == "sigkill":  # no exit note, no chance to clean up: raydist removes its files
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3)
    return [dist.get_rank(), restart, os.environ["TORCHELASTIC_MAX_RESTARTS"], os.getpid()]


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize(
    ("how", "mode"), [pytest.param("exit", "warm", marks=pytest.mark.soak), pytest.param("sigkill", "fresh", marks=pytest.mark.soak)]
)  # make test: the engine's logic on the fake (test_engine_faults running-die rows); fresh processes after a crash, leak-checked:
# test_node_layout::test_a_crash_under_the_node_layout_restarts_whole_in_fresh_processes; a script's: test_cli's attempts
def test_restart_after_crash_reruns_on_a_new_group(how: str, mode: str) -> None:
    results = raydist.run(crash_once, num_workers=2, args=(how,), max_restarts=2, restart_mode=mode)
    assert [r[:3] for r in results] == [[0, 1, "2"], [1, 1, "2"]]
    assert_nothing_left()  # the dead rank's files included, at once (not 30 s later at some next start)


def always_raise() -> None:
    raise RuntimeError(f"attempt {os.environ['TORCHELASTIC_RESTART_COUNT']} failed")


@pytest.mark.soak  # the engine's logic, on the fake cluster in the unit tier: test_engine_calls::test_code_that_raised_is_retried_only_when_asked_and_the_error_lists_every_attempt
@pytest.mark.usefixtures("ray_local")
def test_user_exception_is_not_retried_unless_asked() -> None:
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(always_raise, num_workers=1, max_restarts=2)  # one worker: no collective involved
    assert "attempt 0 failed" in str(caught.value) and not caught.value.attempts
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(always_raise, num_workers=1, max_restarts=2, retry_on_exception=True)
    message = str(caught.value)
    assert len(caught.value.attempts) == 2
    for attempt in (0, 1):
        assert re.search(rf"attempt {attempt}: rank \d: RuntimeError: attempt {attempt} failed", message)
    assert "RuntimeError: attempt 2 failed" in message


def maybe_fail(index: int) -> int:
    if index % 3 == 0 and dist.get_rank() == 1:
        raise ValueError(f"run {index}")
    return index


@pytest.mark.usefixtures("ray_local")
@pytest.mark.timeout(900)  # up to 30 runs of 2 fresh workers: 5-6 s each on 2 cores, more while the host steals them
@repeats(0, 30, every_session=8)  # soak only: make test leak-checks every run it makes, and test_engine_faults' schedules check the ledger
def test_thirty_runs_some_failing_leave_nothing_behind(repeat: int) -> None:
    for index in range(repeat):
        if index % 3 == 0:
            with pytest.raises(raydist.WorkerGroupError, match=f"run {index}"):
                raydist.run(maybe_fail, num_workers=2, args=(index,))
        else:
            assert raydist.run(maybe_fail, num_workers=2, args=(index,)) == [index, index]
    assert_nothing_left()


INTERRUPTED_DRIVER = """
import sys, threading, ray, raydist
ray.init(address=sys.argv[1])
def block():
    print("worker ready", flush=True)
    threading.Event().wait()
raydist.run(block, num_workers=2)
"""

BLOCKING_SCRIPT = """
import threading
print("worker ready", flush=True)
threading.Event().wait()
"""


def ignore_sigint() -> None:
    """What a background job of a non-interactive shell (CI) starts with."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def default_sigint() -> None:
    """SIGINT as a terminal's foreground job has it (Python raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_line(driver: "subprocess.Popen[str]", text: str, count: int = 1) -> None:
    assert driver.stdout is not None
    for line in driver.stdout:  # the workers' prints are forwarded to the driver
        count -= text in line
        if count == 0:
            return
    raise AssertionError(f"the driver ended before printing {text!r} (status {driver.wait()})")


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("ready", [1, pytest.param(2, marks=pytest.mark.soak)])
def test_ctrl_c_in_the_driver_kills_every_worker(tmp_path: Any, ready: int) -> None:
    """`raydist run` started with SIGINT ignored stops on SIGINT all the same, as torchrun does,
    also while a rank has not started the script yet (``ready`` 1: killed, not waited for)."""
    script = tmp_path / "block.py"
    script.write_text(BLOCKING_SCRIPT)
    address = ray.get_runtime_context().gcs_address
    driver = subprocess.Popen(
        [sys.executable, "-m", "raydist", "run", "--address", address, "-n", "2", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        preexec_fn=ignore_sigint,
    )
    try:
        wait_for_line(driver, "worker ready", ready)
        if ready == 2:
            assert sorted(a["ActorClassName"] for a in live_raydist_actors()) == ["RayWorker", "RayWorker"]  # no node agent here
        start = time.monotonic()
        driver.send_signal(signal.SIGINT)
        output = driver.communicate(timeout=30)[0]
        assert driver.returncode == 1, output  # as torchrun exits after a signal
        assert "got SIGINT" in output
        assert time.monotonic() - start < DETECTION_BOUND_S
    finally:
        driver.kill()
    assert_nothing_left()


@pytest.mark.soak  # make test: test_interrupts::test_sigint_at_any_moment_stops_the_run_and_everything_it_started
@pytest.mark.usefixtures("ray_local")
def test_ctrl_c_in_a_python_driver_kills_every_worker() -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_DRIVER, ray.get_runtime_context().gcs_address],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        preexec_fn=default_sigint,
    )
    try:
        wait_for_line(driver, "worker ready")
        start = time.monotonic()
        driver.send_signal(signal.SIGINT)
        output = driver.communicate(timeout=30)[0]
        assert "KeyboardInterrupt" in output
        assert time.monotonic() - start < DETECTION_BOUND_S
    finally:
        driver.kill()
    assert_nothing_left()


# -- infeasible requests: a cluster with 2 (fake) GPUs -------------------------


@pytest.mark.soak  # make test: tests/unit/rules (sizing feasibility) and test_bundle_bigger_than_any_node_fails_fast on a real cluster
@pytest.mark.nodes({"num_cpus": 4, "num_gpus": 2})
@pytest.mark.usefixtures("cluster")
def test_more_gpus_than_the_cluster_has_fails_fast() -> None:
    start = time.monotonic()
    with pytest.raises(raydist.InfeasibleResourcesError) as caught:
        raydist.run(lambda: None, num_workers=8, accelerator="gpu")
    assert time.monotonic() - start < INFEASIBLE_BOUND_S
    message = str(caught.value)
    assert "8 workers" in message and "GPU: 8" in message and "GPU: 2" in message
    assert_nothing_left()


@pytest.mark.nodes({"num_cpus": 4, "num_gpus": 2})
@pytest.mark.usefixtures("cluster")
def test_bundle_bigger_than_any_node_fails_fast() -> None:
    start = time.monotonic()
    with pytest.raises(raydist.InfeasibleResourcesError) as caught:
        raydist.run(lambda: None, num_workers=1, accelerator="cpu", resources_per_worker={"CPU": 64})
    assert time.monotonic() - start < INFEASIBLE_BOUND_S
    assert "CPU: 64" in str(caught.value) and "CPU: 4" in str(caught.value)


@pytest.mark.nodes({"num_cpus": 4, "num_gpus": 2})
@pytest.mark.usefixtures("cluster")
def test_busy_cluster_waits_then_gives_up_with_the_same_kind_of_message() -> None:
    with raydist.WorkerGroup(2, accelerator="gpu"):  # holds both GPUs
        start = time.monotonic()
        with pytest.raises(raydist.InfeasibleResourcesError, match="gave up after 2 s") as caught:
            raydist.run(lambda: None, num_workers=1, accelerator="gpu", startup_timeout=2)
        assert 2 <= time.monotonic() - start < 2 + INFEASIBLE_BOUND_S
    # What was asked, and what is free of those kinds, zeros included; no Ray internals.
    message = str(caught.value)
    assert "of {CPU: 1, GPU: 1} each" in message and "GPU: 0}" in message.split("currently free", 1)[1]
    assert "bundle_group" not in message and "_group_" not in message
    assert_nothing_left()


@pytest.mark.nodes({"num_cpus": 4, "num_gpus": 2})
@pytest.mark.usefixtures("cluster")
def test_with_an_autoscaler_an_unmet_request_waits_up_to_the_startup_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from raydist.pool import ray_private

    assert not ray_private.cluster_has_autoscaler()  # a plain cluster: no node types to add
    monkeypatch.setattr(ray_private, "cluster_has_autoscaler", lambda: True)
    start = time.monotonic()
    with pytest.raises(raydist.InfeasibleResourcesError, match="gave up after 2 s") as caught:
        raydist.run(lambda: None, num_workers=8, accelerator="gpu", startup_timeout=2)
    assert time.monotonic() - start >= 2  # it waited for nodes that might come
    assert "GPU: 2" in str(caught.value)
    assert_nothing_left()


def test_autoscaler_detection_that_cannot_read_the_cluster_warns_and_waits(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import ray.experimental.internal_kv as internal_kv

    from raydist.pool import ray_private

    def unavailable() -> None:
        raise RuntimeError("no GCS client in this Ray")

    # The private API a newer Ray might lack: the fallback must say so, not silently decide.
    monkeypatch.setattr(internal_kv, "internal_kv_get_gcs_client", unavailable)
    monkeypatch.setattr(ray_private, "_warned", set())
    with caplog.at_level("WARNING", logger="raydist"):
        assert ray_private.cluster_has_autoscaler() is True
    assert "cannot tell whether this cluster autoscales" in caplog.text
    assert "no GCS client in this Ray" in caplog.text


@pytest.mark.soak  # the engine's logic, on the fake cluster in the unit tier: test_engine_faults rows starting-hang and initialising-hang
def test_start_up_timeout_names_the_stage_and_who_is_still_starting() -> None:
    from raydist.errors import WorkerGroupTimeout, WorkerStartupTimeout

    error = WorkerStartupTimeout(30.0, "initialised", 4, ["rank 2 (node 0123456789ab, 10.0.0.2)"])
    assert str(error) == (
        "start-up timed out: 3 of 4 workers initialised after 30 s; rank 2 (node 0123456789ab, 10.0.0.2) still initialising"
    )
    assert isinstance(error, TimeoutError) and not isinstance(error, WorkerGroupTimeout)


def barrier_on_rank_zero_only() -> None:
    if dist.get_rank() == 0:
        dist.barrier()  # rank 1 never joins


@pytest.mark.soak  # make test: test_hangs::test_a_process_group_timeout_reports_where_each_rank_was checks the same bound
@pytest.mark.usefixtures("ray_local")
def test_pg_timeout_bounds_a_collective_a_peer_never_joins() -> None:
    start = time.monotonic()
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(barrier_on_rank_zero_only, num_workers=2, pg_timeout=3)
    assert time.monotonic() - start < 3 + 30  # not torch's 30 minutes
    assert caught.value.failed_ranks == [0]
    assert "Timed out waiting 3000ms" in str(caught.value)  # gloo used our timeout
    assert_nothing_left()
