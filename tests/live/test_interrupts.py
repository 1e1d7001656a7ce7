"""Ctrl-C at any moment, as torchrun: `raydist run --standalone` interrupted
while its private Ray starts, while the workers start, during the script's
imports or its run, exits with status 1 within seconds and leaves no process
behind (Ray's agents included)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List, Set

import psutil
import pytest
from conftest import REPO, repeats

pytestmark = pytest.mark.timeout(240)

# Seconds after the start: Ray starting, Ray up and the workers starting,
# the script's imports, its run (a timing picks a phase; the assertions hold at any moment).
MOMENTS_S = (0.5, 1.5, 2.5, 3.5, 4.5, 6.0, 9.0)
# A Ctrl-C during ray.init is held until Ray is whole (signals.deferred), then the run
# stops it: the exit waits for the rest of Ray's start and its stop. On a 2-core machine
# busy with another test process, interrupted at 0.5 s, that once took over 10 s.
STOP_BOUND_S = 15.0
GONE_BOUND_S = 5.0

LOOPING_SCRIPT = """
import time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
print("worker ready", flush=True)
for _ in range(600):
    dist.all_reduce(torch.ones(1))
    time.sleep(0.1)
"""


def ignore_sigint() -> None:
    """What a background job of a non-interactive shell (CI) starts with."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def descendants(pid: int) -> Set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def session_processes(marker: str) -> Set[int]:
    """Processes whose command line names ``marker`` (the run's private temp dir)."""
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in process.info["cmdline"] or ()):
            found.add(process.pid)
    return found


def alive(pids: Set[int]) -> List[str]:
    left = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {' '.join(process.cmdline())[:160]}")
        except psutil.Error:
            pass
    return left


def poll(until: float) -> Iterator[None]:
    while time.monotonic() < until:
        yield
        time.sleep(0.05)  # polling interval, not a synchronisation


def interrupt_at(script: Path, temp_dir: Path, moment: float) -> None:
    env = {**os.environ, "RAY_TMPDIR": str(temp_dir), "PYTHONFAULTHANDLER": "1"}
    driver = subprocess.Popen(
        [sys.executable, "-m", "raydist", "run", "--standalone", "-n", "2", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        env=env,
        preexec_fn=ignore_sigint,
        start_new_session=True,
    )
    seen: Set[int] = set()
    try:
        for _ in poll(time.monotonic() + moment):  # who it starts, until the moment comes
            seen |= descendants(driver.pid) | session_processes(str(temp_dir))
            if driver.poll() is not None:
                break
        start = time.monotonic()
        driver.send_signal(signal.SIGINT)
        while driver.poll() is None and time.monotonic() - start < STOP_BOUND_S:
            seen |= descendants(driver.pid)
            time.sleep(0.05)  # polling interval
        output = driver.communicate(timeout=max(0.1, STOP_BOUND_S - (time.monotonic() - start)))[0]
        elapsed = time.monotonic() - start
        assert driver.returncode == 1, f"interrupted at {moment} s: status {driver.returncode}\n{output}"
        assert elapsed < STOP_BOUND_S, f"interrupted at {moment} s: took {elapsed:.1f} s\n{output}"
        left: List[str] = []
        for _ in poll(time.monotonic() + GONE_BOUND_S):
            left = alive(seen | session_processes(str(temp_dir)))
            if not left:
                break
        assert not left, f"interrupted at {moment} s, still running:\n" + "\n".join(left) + f"\n{output}"
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()


# make test interrupts before Ray's start and during the workers' start (during Ray's own start:
# test_ctrl_c_while_ray_builds_the_drivers_core_worker_ends_the_program_cleanly; test_faults interrupts a
# running script); make soak at every moment.
QUICK_MOMENTS_S = (0.5, 3.5)


@pytest.mark.parametrize("moment", [m if m in QUICK_MOMENTS_S else pytest.param(m, marks=pytest.mark.soak) for m in MOMENTS_S])
def test_sigint_at_any_moment_stops_the_run_and_everything_it_started(tmp_path: Path, moment: float) -> None:
    script = tmp_path / "loop.py"
    script.write_text(LOOPING_SCRIPT)
    temp_dir = Path("/tmp") / f"rdi{os.getpid()}{int(moment * 10)}"  # short: Ray's socket paths are bounded
    temp_dir.mkdir(exist_ok=True)
    try:
        interrupt_at(script, temp_dir, moment)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)  # the private Ray's session files


# -- a Python driver's exit ------------------------------------------------------

# A program that uses raydist.run and stops on Ctrl-C the usual way (catch it, sys.exit). "build" sends its own
# SIGINT while Ray builds the driver's core worker (PythonGCThread is made inside that construction): a signal
# there once left a core worker nothing could shut down, and Ray's C++ exit handler crashed on it (-11).
PYTHON_DRIVER = """
import os, signal, sys, time
import raydist

def rank_value(seconds):
    time.sleep(seconds)
    return 1

if sys.argv[1] == "build":
    import ray._private.gc_collect_manager as gc_manager
    build = gc_manager.PythonGCThread.__init__
    def interrupted(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        build(self, *args, **kwargs)
    gc_manager.PythonGCThread.__init__ = interrupted
try:
    print("result", raydist.run(rank_value, args=(0.1 if sys.argv[1] == "normal" else 120,), num_workers=2), flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(1)
"""


def python_driver_exit(script: Path, mode: str, moment: float = 0.0) -> str:
    """Run the driver (``normal``, ``build``, or ``signal``: a SIGINT ``moment``
    seconds after its start) and check how it ended; its output."""
    temp_dir = Path("/tmp") / f"rdp{os.getpid()}"  # short: Ray's socket paths are bounded
    temp_dir.mkdir(exist_ok=True)
    driver = subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        env={**os.environ, "RAY_TMPDIR": str(temp_dir), "PYTHONFAULTHANDLER": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # Python's own Ctrl-C handling, whatever was inherited
        start_new_session=True,
    )
    try:
        if mode == "signal":
            with contextlib.suppress(subprocess.TimeoutExpired):
                driver.wait(moment)  # the moment comes (or the driver ended before it: checked below)
            driver.send_signal(signal.SIGINT)
        output = driver.communicate(timeout=120)[0]
        expected = (0, "result [1, 1]") if mode == "normal" else (1, "interrupted")
        assert (driver.returncode, expected[1] in output) == (expected[0], True), f"{mode} {moment}: status {driver.returncode}\n{output}"
        left: List[str] = []
        for _ in poll(time.monotonic() + GONE_BOUND_S):
            left = alive(session_processes(str(temp_dir)))
            if not left:
                break
        assert not left, f"{mode} {moment}: its Ray still runs:\n" + "\n".join(left)
        return output
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ctrl_c_while_ray_builds_the_drivers_core_worker_ends_the_program_cleanly(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(PYTHON_DRIVER)
    python_driver_exit(script, "build")


@pytest.mark.timeout(900)  # 40 drivers, each starting a private Ray and two workers
@repeats(0, 20, every_session=6)  # soak only: make test runs the interrupt that crashed (above); test_connect's drivers exit normally
def test_a_python_drivers_exits_never_crash(tmp_path: Path, repeat: int) -> None:
    script = tmp_path / "driver.py"
    script.write_text(PYTHON_DRIVER)
    for _ in range(repeat):
        python_driver_exit(script, "normal")
    for index in range(repeat):  # half while Ray builds the core worker, half from outside at moments through the run
        if index % 2:
            python_driver_exit(script, "build")
        else:
            python_driver_exit(script, "signal", 0.5 + 6.0 * index / repeat)


@pytest.mark.soak  # its own 2-node cluster; the mechanics (a run's end waits for its polls) are unit-tested: tests/unit/driver/test_polls_end.py
def test_a_driver_that_shuts_ray_down_right_after_a_lost_node_goes_on() -> None:
    """After ``ray.shutdown()`` a Ray call from any thread ends the process: no
    poll of a run that ended may still be in one."""
    script = REPO / "tests" / "live" / "scripts" / "shutdown_after_a_lost_node.py"
    driver = subprocess.run(
        [sys.executable, str(script), "3"],
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    assert driver.returncode == 0 and driver.stdout.endswith("the driver went on\n"), driver.stdout + driver.stderr
    assert driver.stdout.count("shut down after: its node died or left the cluster") == 3, driver.stdout
