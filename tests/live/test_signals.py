"""`raydist run` stops on the signals torchrun handles, whatever it inherited:
each is forwarded to every rank (their handlers can save state), then the
workers are stopped and the run exits with status 1, as torchrun does."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Tuple

import pytest
import ray
from conftest import REPO, assert_nothing_left

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("ray_local")]

SCRIPTS = REPO / "tests" / "scripts"
STOP_BOUND_S = 10.0


def ignore_sigint() -> None:
    """What a background job of a non-interactive shell (CI) starts with."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_run(*args: str) -> "subprocess.Popen[str]":
    address = ray.get_runtime_context().gcs_address
    return subprocess.Popen(
        [sys.executable, "-m", "raydist", "run", "--address", address, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        preexec_fn=ignore_sigint,
    )


def wait_until_ranks_ready(driver: "subprocess.Popen[str]", count: int) -> None:
    assert driver.stdout is not None
    ready, lines = 0, []
    for line in driver.stdout:
        lines.append(line)
        ready += "ready" in line
        if ready == count:
            return
    raise AssertionError(f"the run ended before its ranks were ready (status {driver.wait()}):\n{''.join(lines)}")


def signal_when_ready(driver: subprocess.Popen, signum: int) -> Tuple[str, float]:
    """Send ``signum`` once both ranks are ready; the run's output and the seconds it took to end."""
    try:
        wait_until_ranks_ready(driver, 2)
        start = time.monotonic()
        driver.send_signal(signum)
        output = driver.communicate(timeout=60)[0]
        return output, time.monotonic() - start
    finally:
        driver.kill()


def test_sigterm_reaches_every_rank_then_the_workers_stop(tmp_path: Path) -> None:
    driver = start_run("-n", "2", str(SCRIPTS / "signal_handlers.py"), str(tmp_path))
    output, elapsed = signal_when_ready(driver, signal.SIGTERM)
    assert driver.returncode == 1, output
    assert "got SIGTERM" in output
    # Both ranks' own SIGTERM handlers ran (they save state), and what they printed came out.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["term-0", "term-1"]
    assert "rank 0 saved its state" in output and "rank 1 saved its state" in output
    assert elapsed < STOP_BOUND_S
    assert_nothing_left()


def test_the_wait_after_forwarding_is_bounded_by_shutdown_timeout(tmp_path: Path) -> None:
    # The ranks ignore SIGUSR1: they are killed once --shutdown-timeout has passed.
    driver = start_run(
        "-n", "2", "--shutdown-timeout", "2", "--signals-to-handle", "SIGUSR1", str(SCRIPTS / "signal_handlers.py"), str(tmp_path)
    )
    output, elapsed = signal_when_ready(driver, signal.SIGUSR1)  # handled (and forwarded) only because it was asked for
    assert driver.returncode == 1, output
    assert "got SIGUSR1" in output
    assert 2 <= elapsed < 2 + STOP_BOUND_S
    assert_nothing_left()
