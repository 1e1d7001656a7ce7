"""Bad and unusual inputs that once broke a run, each as its reproduction:
a world of one, concurrent first calls, memory resources, an interrupted
shutdown, a dropped group, result(timeout), SIGTERM from outside, a user's
SIGUSR2 handler, values that cannot travel."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
import ray
import torch.distributed as dist
from conftest import REPO, assert_nothing_left, live_raydist_actors

import raydist

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("ray_local")]

SCRIPTS = REPO / "tests" / "scripts"
RUN_TIMEOUT_S = 120


def raydist_run(*args: str) -> subprocess.CompletedProcess:
    address = ray.get_runtime_context().gcs_address
    return subprocess.run(
        [sys.executable, "-m", "raydist", "run", "--address", address, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def world_report(result: subprocess.CompletedProcess) -> Dict[str, Any]:
    lines = [line.split("WORLD ", 1)[1] for line in result.stdout.splitlines() if "WORLD " in line]
    assert len(lines) == 1, f"{result.returncode}\n{result.stdout}\n{result.stderr}"
    return json.loads(lines[0])


def group_state() -> List[Any]:
    return [dist.is_initialized(), dist.get_world_size() if dist.is_initialized() else 0]


# -- a world of one --------------------------------------------------------


def test_a_world_of_one_has_its_process_group() -> None:
    # (with --backend gloo: the CLI's case, in soak)
    assert raydist.run(group_state, num_workers=1) == [[True, 1]]  # init_process_group is on by default
    assert raydist.run(group_state, num_workers=1, init_process_group=False) == [[False, 0]]


@pytest.mark.soak  # the CLI entry point of a world of one
def test_a_world_of_one_has_its_process_group_and_memory_is_honoured_from_the_cli() -> None:
    # One run for both (each costs a CLI process and a worker): -n 1 with --backend and a memory resource.
    flags = ["-n", "1", "--backend", "gloo", "--resources-per-worker", '{"CPU": 1, "memory": 200000000}']
    report = world_report(raydist_run(*flags, str(SCRIPTS / "world_report.py")))
    assert report["initialized"] is True and report["size"] == 1, f"a world of one: {report}"
    assert report["assigned"]["memory"] == 2e8, f"memory from the CLI: {report}"


WORLD_OF_ONE = """
import torch.distributed as dist
from raydist.core.initialize import init_distributed
init_distributed(device="cpu", world_of_one=True)  # as raydist's workers call it
print("initialised", dist.get_world_size(), flush=True)
"""


def test_a_world_of_one_needs_no_free_port() -> None:
    # Concurrent runs on a node each pick a free port; another process can take it
    # before the store binds it. A world of one has no rendezvous, so no port at all.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(taken.getsockname()[1]), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        result = subprocess.run([sys.executable, "-c", WORLD_OF_ONE], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "initialised 1" in result.stdout, result.stderr[-3000:]


# -- concurrent first calls ------------------------------------------------

CONCURRENT_FIRST_CALLS = """
import threading, ray, raydist
def where():
    return ray.get_runtime_context().gcs_address
found, errors = [], []
def call():
    try:
        found.extend(raydist.run(where, num_workers=1, address="local"))
    except BaseException as error:
        errors.append(repr(error))
threads = [threading.Thread(target=call) for _ in range(2)]
for thread in threads: thread.start()
for thread in threads: thread.join()
# The thread that started Ray has ended; Ray must outlive it.
found.extend(raydist.run(where, num_workers=1))
import json
print("RESULT " + json.dumps({"found": found, "errors": errors}), flush=True)
"""


@pytest.mark.soak  # a start-up race between threads (eight threads of calls run in make test)
def test_two_threads_making_the_first_run_share_one_ray_that_outlives_them() -> None:
    # Ray's socket paths must stay under 107 characters: a short private temp dir.
    ray_tmp = tempfile.mkdtemp(prefix="rd", dir="/tmp" if os.path.isdir("/tmp") else None)
    env = dict(os.environ, RAY_TMPDIR=ray_tmp)
    env.pop("RAY_ADDRESS", None)
    try:
        result = subprocess.run(
            [sys.executable, "-c", CONCURRENT_FIRST_CALLS], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    outcome = json.loads(line[len("RESULT ") :])
    assert outcome["errors"] == [], line
    assert len(outcome["found"]) == 3 and len(set(outcome["found"])) == 1, line  # all ran on the same Ray
    assert "Token authentication is enabled" not in result.stderr  # Ray's notice is not the user's business


# -- memory resources ------------------------------------------------------


def assigned() -> Dict[str, float]:
    return dict(ray.get_runtime_context().get_assigned_resources())


def test_memory_is_honoured() -> None:
    (got,) = raydist.run(assigned, num_workers=1, resources_per_worker={"CPU": 1, "memory": 2e8})
    assert got["memory"] == 2e8 and got["CPU"] == 1
    assert_nothing_left()


def test_object_store_memory_is_refused_before_ray_is_touched() -> None:
    # Ray 2.60 deprecates it per actor, and its raylet aborts on it inside a placement group.
    with pytest.raises(ValueError, match="object_store_memory"):
        raydist.RunConfig(resources_per_worker={"CPU": 1, "object_store_memory": 5e7})
    result = raydist_run("-n", "1", "--resources-per-worker", '{"object_store_memory": 50000000}', str(SCRIPTS / "world_report.py"))
    assert result.returncode == 2 and "--resources-per-worker" in result.stderr, result.stderr


# -- interrupts, dropped groups, futures -----------------------------------

INTERRUPTED_SHUTDOWN = """
import sys, threading, ray, raydist
ray.init(address=sys.argv[1])
def block():
    threading.Event().wait()
from raydist.pool.driver.startup import Holdings
release = Holdings.release
def announced_release(self, *args, **kwargs):
    print("releasing", flush=True)  # the test interrupts from here on
    release(self, *args, **kwargs)
Holdings.release = announced_release
group = raydist.WorkerGroup(1)
group.submit(block)
try:
    group.shutdown()  # graceful: waits (up to 5 s) for the busy workers to leave their process group
except KeyboardInterrupt:
    print("interrupted", flush=True)
group.shutdown()
print("released", flush=True)
threading.Event().wait()  # the driver lives on, as a notebook kernel does
"""


@pytest.mark.soak  # make test: test_interrupts' SIGINT at a moment; a stop at each moment: tests/unit/driver/test_engine_faults.py
def test_an_interrupt_during_shutdown_leaves_nothing() -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_SHUTDOWN, ray.get_runtime_context().gcs_address],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert driver.stdout is not None
        seen: List[str] = []
        for line in driver.stdout:
            seen.append(line)
            if "releasing" in line and not any("releasing" in earlier for earlier in seen[:-1]):
                driver.send_signal(signal.SIGINT)  # lands inside the first shutdown(); the second is left to finish
            if "released" in line:
                break
        assert any("interrupted" in line for line in seen), "".join(seen)
        assert driver.poll() is None  # the driver lives on ...
        assert_nothing_left()  # ... and holds nothing
    finally:
        driver.kill()


def test_a_dropped_group_is_freed() -> None:
    group = raydist.WorkerGroup(1)  # one worker: the count is not what is checked
    assert len(live_raydist_actors()) == 1
    del group
    gc.collect()
    assert_nothing_left()


def sleep_then_rank(seconds: float) -> int:
    time.sleep(seconds)
    return dist.get_rank()


@pytest.mark.soak  # the engine's logic, on the fake cluster in the unit tier: test_engine_calls::test_a_result_timeout_leaves_the_call_running_as_concurrent_futures_does
def test_result_timeout_leaves_the_call_running_as_concurrent_futures_does() -> None:
    with raydist.WorkerGroup(1) as group:
        future = group.submit(sleep_then_rank, args=(3,))
        with pytest.raises(TimeoutError):
            future.result(timeout=0.5)
        assert not future.done()
        assert future.result() == [0]  # the same call, finished
        assert group.run(sleep_then_rank, args=(0,)) == [0]  # the group lives on


@pytest.mark.soak  # the engine's logic, on the fake cluster in the unit tier: test_engine_calls::test_the_groups_own_timeout_tears_down_and_asking_again_gives_the_same_error
def test_the_groups_own_timeout_tears_down_and_asking_again_gives_the_same_error() -> None:
    group = raydist.WorkerGroup(1, timeout=1)
    future = group.submit(sleep_then_rank, args=(60,))
    with pytest.raises(raydist.WorkerGroupTimeout) as first:
        future.result()
    with pytest.raises(raydist.WorkerGroupTimeout) as second:
        future.result()
    assert second.value is first.value  # not "SIGKILL from outside": that was raydist's own teardown
    assert first.value.timeout == 1 and str(first.value).startswith("timed out after 1 s; rank 0 had not finished"), str(first.value)
    assert_nothing_left()


# -- signals from outside, a user's signal handlers -------------------------


def block_forever() -> None:
    threading.Event().wait()


@pytest.mark.soak  # make test: test_diagnostics::test_a_dead_rank_is_reported_with_its_cause_and_last_stderr_lines (a signal named)
def test_a_rank_killed_by_sigterm_from_outside_is_reported_with_the_signal() -> None:
    group = raydist.WorkerGroup(2)
    future = group.submit(block_forever)
    victim = group.workers[1]
    os.kill(victim.pid, signal.SIGTERM)
    with pytest.raises(raydist.WorkerGroupError) as caught:
        future.result(timeout=60)
    assert caught.value.root_cause.rank == 1
    assert "killed by SIGTERM" in (caught.value.root_cause.died or ""), str(caught.value)
    assert_nothing_left()


def install_user_sigusr2_handler(path: str) -> None:
    def handler(signum: int, frame: Any) -> None:
        with open(path, "a") as note:
            note.write("ran\n")

    signal.signal(signal.SIGUSR2, handler)  # what SLURM users do for --signal=USR2@90


@pytest.mark.soak  # make test: test_hangs::test_stacks_of_a_live_group_say_where_the_collectives_diverged (stacks of a live group)
def test_a_users_sigusr2_handler_does_not_disable_stacks(tmp_path: Path) -> None:
    note = tmp_path / "sigusr2"
    with raydist.WorkerGroup(2, preemption_signal="SIGUSR2") as group:  # raydist does not use SIGUSR2 itself
        group.run(install_user_sigusr2_handler, args=(str(note),))
        future = group.submit(block_forever)
        stacks = group.stacks()
        assert "in block_forever" in stacks or "from block_forever" in stacks, stacks
        assert not note.exists()  # the user's handler was not run by raydist
        future.cancel()


# -- values that cannot travel ---------------------------------------------


class CannotPickle:
    def __reduce__(self) -> Any:
        raise TypeError("not picklable")


def unpicklable() -> CannotPickle:
    return CannotPickle()


@pytest.mark.soak  # make test: test_a_value_that_cannot_be_unpickled_on_the_driver_is_reported_as_such
def test_an_unpicklable_value_costs_no_output_wait(caplog: pytest.LogCaptureFixture) -> None:
    with raydist.WorkerGroup(1) as group:
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="raydist"), pytest.raises(raydist.WorkerGroupError) as caught:
            group.run(unpicklable)
        elapsed = time.monotonic() - start
    assert "cannot be pickled to send it back" in str(caught.value)
    assert elapsed < 4.0  # the wait for output markers (5 s) is not paid
    assert "had not arrived" not in caplog.text


WORKER_ONLY_MODULE = "class Payload:\n    pass\n"


def worker_only_value(directory: str) -> Any:
    """A value of a class importable only on the worker (its module is on the worker's path only)."""
    sys.path.insert(0, directory)
    import raydist_worker_only

    return raydist_worker_only.Payload()


def test_a_value_that_cannot_be_unpickled_on_the_driver_is_reported_as_such(tmp_path: Path) -> None:
    (tmp_path / "raydist_worker_only.py").write_text(WORKER_ONLY_MODULE)
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(worker_only_value, args=(str(tmp_path),), num_workers=1)
    message = str(caught.value)
    assert "cannot be unpickled on the driver" in message and "raydist_worker_only" in message, message
    assert "cannot be pickled" not in message
