"""A run leaves nothing behind on the machine and prints nothing that is not
the user's: no per-worker or per-run files in the temp directory, no Ray
paragraph about a worker raydist already reported."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Optional, Set

import pytest
import ray
import torch.distributed as dist
from conftest import REPO, listening_ports, raydist_files_of, repeats

import raydist

pytestmark = [pytest.mark.timeout(400), pytest.mark.usefixtures("ray_local")]


def pid_or_fail(index: int) -> int:
    if index % 4 == 0 and dist.get_rank() == 1:
        raise ValueError(f"run {index}")
    if index % 4 == 1 and dist.get_rank() == 1:
        os._exit(5)  # a death leaves an exit note
    return os.getpid()


def new_threads(before: Set[Optional[int]]) -> List[str]:
    return [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]


@repeats(0, 20, every_session=6)  # soak only: every other live test's leak check looks for these files too
def test_twenty_runs_some_failing_leave_no_files(repeat: int) -> None:
    before = {name for name in os.listdir(tempfile.gettempdir()) if "raydist" in name}
    threads_before = {t.ident for t in threading.enumerate()}
    ports_before = listening_ports()
    pids: Set[int] = set()
    for index in range(repeat):
        try:
            pids.update(raydist.run(pid_or_fail, args=(index,), num_workers=2))
        except raydist.WorkerGroupError as error:
            pids.update(failure.pid for failure in error.failures)
    assert len(pids) >= repeat
    assert raydist_files_of(pids) == []
    # No new per-run directory either (the old raydist-errors/<run id> ones).
    errors_dir = Path(tempfile.gettempdir()) / "raydist-errors"
    assert not errors_dir.exists() or "raydist-errors" in before
    # Nor a thread or a listening port in the driver (each run's pdb relay once kept both).
    deadline = time.monotonic() + 10
    while new_threads(threads_before) and time.monotonic() < deadline:
        threading.Event().wait(0.1)  # threads end on their own once told to stop
    assert new_threads(threads_before) == []
    assert listening_ports() <= ports_before


CRASHING_DRIVER = """
import os, sys, ray, raydist
import torch.distributed as dist
ray.init(address=sys.argv[1])
def die():
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()
try:
    raydist.run(die, num_workers=2)
except raydist.WorkerGroupError as error:
    print("REPORTED", error.root_cause.died, flush=True)
ray.shutdown()
"""


def test_rays_paragraph_about_a_reported_death_is_not_printed() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CRASHING_DRIVER, ray.get_runtime_context().gcs_address],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "REPORTED exited with status 3" in result.stdout, result.stdout + result.stderr
    assert "A worker died or was killed" not in result.stdout + result.stderr


def test_files_a_killed_worker_could_not_remove_go_at_the_next_start_on_its_machine() -> None:
    scratch = Path(tempfile.gettempdir(), "raydist-workers")
    scratch.mkdir(exist_ok=True)
    gone = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    gone.wait()  # a worker SIGKILLed with its driver: nothing removed its files
    left = [scratch / f"exit-{gone.pid}", scratch / f"stacks-{gone.pid}", scratch / f"diag-{gone.pid}.sock"]
    mine = scratch / f"stacks-{os.getpid()}"  # a live process's file, newer than the process: kept
    for path in [*left, mine]:
        path.write_text("")
    an_hour_ago = time.time() - 3600
    for path in left:
        os.utime(path, (an_hour_ago, an_hour_ago))
    try:
        assert raydist.run(os.getpid, num_workers=1)
        assert [path for path in left if path.exists()] == []
        assert mine.exists()
    finally:
        mine.unlink(missing_ok=True)
