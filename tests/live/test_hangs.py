"""Where a hang diverged: the ranks' flight recorders read on `timeout=`, on
group.stacks() and when the process group's own timeout fires, for
raydist.run and for `raydist run` scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import assert_nothing_left, ray_address

import raydist

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("ray_local")]
HALF_CPU = {"CPU": 0.5}
# Two ranks where the count is not what is looked at; three where the others are several.
SKIPPED = "rank 0: waiting in all_reduce #6 (float32 [1]); rank 1: last completed all_reduce #5, not in a collective"
SKIPPED_OF_3 = "ranks 0-1: waiting in all_reduce #6 (float32 [1]); rank 2: last completed all_reduce #5, not in a collective"


def last_rank_skips_the_sixth(instead: str = "") -> None:
    """Six all_reduces; the last rank skips the sixth and waits for a file that never comes (or calls ``instead``)."""
    t = torch.ones(1)
    for step in range(1, 7):
        if dist.get_rank() == dist.get_world_size() - 1 and step == 6:
            if instead == "broadcast":
                dist.broadcast(t, 0)
            else:
                waiting_for_a_file_that_never_comes()
            return
        dist.all_reduce(t)


def waiting_for_a_file_that_never_comes() -> None:
    threading.Event().wait()


def test_timeout_names_the_rank_that_skipped_a_collective_and_both_sequence_numbers() -> None:
    start = time.monotonic()
    with pytest.raises(raydist.WorkerGroupTimeout) as caught:
        raydist.run(last_rank_skips_the_sixth, num_workers=3, timeout=4, resources_per_worker=HALF_CPU)
    assert time.monotonic() - start < 4 + 20
    assert caught.value.collectives == SKIPPED_OF_3
    assert SKIPPED_OF_3 in str(caught.value) and "in all_reduce at distributed_c10d.py" in str(caught.value)
    # Where each rank's Python was: the odd one out marked, at the user's own function.
    stacks = caught.value.stacks
    assert "ranks 0-1: in all_reduce" in stacks, stacks
    rank_two = stacks.split("rank 2:")[1]
    assert rank_two.startswith(" in wait at threading.py") and "from waiting_for_a_file_that_never_comes at test_hangs.py" in rank_two
    assert "<-- differs" in rank_two and "<-- differs" not in stacks.split("rank 2:")[0], stacks
    assert_nothing_left()


@pytest.mark.soak  # a second kind of divergence (a skipped collective is named in make test)
def test_a_different_op_at_the_same_sequence_number_is_named_as_a_mismatch() -> None:
    with pytest.raises(raydist.WorkerGroupTimeout) as caught:
        raydist.run(last_rank_skips_the_sixth, args=("broadcast",), num_workers=3, timeout=8, resources_per_worker=HALF_CPU)
    assert "mismatch: rank 2 entered broadcast #6, the others all_reduce #6" in caught.value.collectives, str(caught.value)


def test_a_process_group_timeout_reports_where_each_rank_was() -> None:
    """``pg_timeout`` bounds a collective a peer never joins (gloo uses it, not torch's 30 minutes)."""
    start = time.monotonic()
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(last_rank_skips_the_sixth, num_workers=2, pg_timeout=3, resources_per_worker=HALF_CPU)
    assert time.monotonic() - start < 3 + 30
    assert caught.value.failed_ranks == [0] and "Timed out waiting 3000ms" in str(caught.value)
    expected = "failed in all_reduce #6 (float32 [1]); rank 1: last completed all_reduce #5, not in a collective"
    assert caught.value.collectives.endswith(expected), str(caught.value)
    assert expected in str(caught.value)
    assert_nothing_left()


def rank_one_waits_outside() -> None:
    t = torch.ones(1)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        threading.Event().wait()
    dist.all_reduce(t)


def test_stacks_of_a_live_group_say_where_the_collectives_diverged() -> None:
    with raydist.WorkerGroup(2, resources_per_worker=HALF_CPU) as group:
        future = group.submit(rank_one_waits_outside)
        expected = "rank 0: waiting in all_reduce #2 (float32 [1]); rank 1: last completed all_reduce #1, not in a collective"
        text = group.stacks()
        for _ in range(50):  # rank 0 may not have entered its second all_reduce yet
            if expected in text:
                break
            text = group.stacks()
        assert expected in text, text
        assert not future.done()
        future.cancel()


@pytest.mark.soak  # the recorder switched off (on, it runs in make test)
def test_flight_recorder_off_reports_no_collectives() -> None:
    with pytest.raises(raydist.WorkerGroupTimeout) as caught:
        raydist.run(last_rank_skips_the_sixth, num_workers=2, timeout=8, resources_per_worker=HALF_CPU, flight_recorder=False)
    assert caught.value.collectives == ""
    assert "rank 0: in all_reduce" in caught.value.stacks, caught.value.stacks


SCRIPT = """
import threading
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
for step in range(1, 7):
    if dist.get_rank() == 1 and step == 6:
        threading.Event().wait()  # rank 1 skips the sixth and waits elsewhere
    dist.all_reduce(t)
"""


@pytest.mark.soak  # the CLI entry point of hang attribution
def test_a_raydist_run_script_with_its_own_process_group(tmp_path: Path) -> None:
    script = tmp_path / "skip.py"
    script.write_text(SCRIPT)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "raydist",
            "run",
            "--address",
            ray_address(),
            "-n",
            "2",
            "--resources-per-worker",
            '{"CPU": 0.5}',
            "--timeout",
            "10",
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 1
    assert SKIPPED in done.stderr, done.stderr[-3000:]


def skips_the_sixth_on_the_first_attempt() -> float:
    """``last_rank_skips_the_sixth`` in attempt 0; in the next, every rank reaches
    the sixth. The sum of the last all_reduce (every rank's 1: the world's size)."""
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        last_rank_skips_the_sixth()
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())


def test_a_hung_rank_is_replaced_by_a_spare_after_the_hang_timeout() -> None:
    # Rank 2 never reaches the sixth all_reduce: with hang_timeout it is killed after 3 s
    # (not the process group's 30 minutes), the others' all_reduce fails (their peer gone),
    # and the spare takes its place: the call, sent again by raydist.run, gives every rank's value.
    start = time.monotonic()
    values = raydist.run(
        skips_the_sixth_on_the_first_attempt,
        num_workers=3,
        max_restarts=1,
        spare_workers=1,
        hang_timeout=3,
        resources_per_worker=HALF_CPU,
    )
    assert values == [3.0, 3.0, 3.0]
    assert time.monotonic() - start < 3 + 40  # start, the hang's 3 s, the warm restart: never the group's timeout
    assert [a.number for a in values.summary.attempts] == [0, 1]  # type: ignore[attr-defined]
    assert_nothing_left(within=30, files=False)  # the killed rank's files: the next start on this machine removes them
