"""A driver killed mid-run leaves no training state behind: its keeper (a
detached actor, so that it outlives any rank and attempt) sees the driver's
job die, writes the last committed step to ``state_dir`` and ends, with the
holders it owns; a new run resumes from what it wrote. Its timeline file,
an unfinished array, loads once closed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import ray
from conftest import REPO, assert_nothing_left, live_raydist_actors, raydist_files_of, wait_for

from raydist.core import state_files
from raydist.pool.worker.evidence import remove_stale

pytestmark = pytest.mark.timeout(300)

DRIVER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path

    import ray
    import torch

    import raydist


    def train(marks):
        tensor, step = torch.zeros(1000), 0
        while True:  # until the driver is killed
            tensor += 1
            raydist.save_state(step, weights={"t": tensor})
            if step == 3:  # step 3 committed (every rank waits for it): the keeper and its holders exist
                assert raydist.wait_committed() == 3
                Path(marks, f"rank-{os.environ['RANK']}").write_text(str(os.getpid()))
            step += 1


    ray.init(address=sys.argv[1])
    raydist.run(train, args=(sys.argv[2],), num_workers=2, state_dir=sys.argv[3], timeline=sys.argv[4])
    """
)


@pytest.mark.soak  # a killed driver (a run's state left nothing behind runs in make test)
def test_a_killed_driver_leaves_no_keeper_or_holder(ray_local: None, tmp_path: Path) -> None:
    script, marks, state_dir, timeline = tmp_path / "driver.py", tmp_path / "marks", tmp_path / "state", tmp_path / "timeline.json"
    script.write_text(DRIVER)
    marks.mkdir()
    driver = subprocess.Popen(
        [sys.executable, str(script), ray.get_runtime_context().gcs_address, str(marks), str(state_dir), str(timeline)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(list(marks.iterdir())) == 2 or driver.poll() is not None, 180, "both ranks past step 3")
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        keepers = [a for a in live_raydist_actors() if a["ActorClassName"].endswith("StateKeeper")]
        assert len(keepers) == 2  # the primary and its holder on this one-node cluster
    finally:
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(30)
    # Ray ends the run's workers (the driver owned them); the keeper ends itself.
    assert_nothing_left(within=60, files=False)
    # The killed workers' files go when the next worker starts on this machine
    # (once they are stale): swept here as that start does, so later tests' checks hold.
    pids = [int(mark.read_text()) for mark in marks.iterdir()]
    for folder in {os.path.dirname(path) for path in raydist_files_of(pids)}:
        remove_stale(folder, stale_after=0)
    assert_nothing_left()
    newest = state_files.newest(str(state_dir))
    assert newest is not None and newest.step >= 3  # the last committed step was written first
    # The run's timeline up to the kill: an unfinished array, whole once closed.
    text = timeline.read_text()
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    events = json.loads(text.rstrip().rstrip(",") + "]")
    assert {"placement", "start", "controller"} <= {e.get("cat") for e in events}, events
