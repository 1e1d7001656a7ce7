"""Healing: a hung rank replaced, from the hang to the new world's first step.

The same training function runs under both launchers: 4 ranks, steps of
20 ms of work and an ``all_reduce``; in the first attempt rank 1 stops
before the all_reduce of step ``--hang-at`` (it waits for an event that
never comes) and notes the moment. The others wait in that all_reduce.

- raydist: ``raydist.run(..., hang_timeout=H, spare_workers=1,
  max_restarts=1)``: the straggler watch sees rank 1 behind for H s, the
  loop kills it, the spare takes its place in a warm restart.
- torchrun (the anchor): ``--max-restarts 1``, the process group's timeout
  set to H (``init_process_group(timeout=)``), as short as raydist's: the
  waiting ranks fail after H s and torchrun restarts every process.

Each row: seconds from the hang to rank 0's first step of the next attempt
(median of ``--rounds``), the part that is the timeout itself, and the
ratio. The goal (issue "A group that heals itself"): raydist's first step
within H + 3 s.

    python benchmarks/healing.py [--hang-timeout 5] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional

WORKERS = 4
STEPS = 12
STEP_MS = 20.0
SLACK_S = 3.0  # the goal: the new world's first step within the hang timeout + this


def train(hang_at: int, marks: str, pg_timeout_s: Optional[float] = None) -> int:
    """The training function (also torchrun's script, below). Returns the steps it ran."""
    import torch
    import torch.distributed as dist

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if not dist.is_initialized():  # under torchrun: the process group's timeout is the only hang detector
        # The first attempt's timeout is the hang's detector; the next attempt's start (four
        # processes connecting on two cores) gets torch's default. torchrun keeps its agent
        # store across restarts: a prefix per attempt (as benchmarks/elastic.py).
        timeout = datetime.timedelta(seconds=pg_timeout_s) if pg_timeout_s and attempt == 0 else datetime.timedelta(minutes=30)
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        prefixed = dist.PrefixStore(f"attempt-{attempt}", store)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", store=prefixed, rank=rank, world_size=world, timeout=timeout)
    rank = dist.get_rank()
    t = torch.ones(1)
    for step in range(STEPS):
        end = time.perf_counter() + STEP_MS / 1000
        while time.perf_counter() < end:
            pass  # the step's work
        if attempt == 0 and step == hang_at and rank == 1:
            with open(os.path.join(marks, "hang"), "w") as file:
                file.write(repr(time.time()))
            threading.Event().wait()  # hung: never reaches the all_reduce
        dist.all_reduce(t)
        if attempt > 0 and rank == 0 and step == 0:
            with open(os.path.join(marks, "first"), "w") as file:
                file.write(repr(time.time()))
    return STEPS


def _seconds(marks: str) -> float:
    hang = float(open(os.path.join(marks, "hang")).read())
    first = float(open(os.path.join(marks, "first")).read())
    return first - hang


def raydist_once(hang_timeout: float, hang_at: int) -> float:
    import raydist

    marks = tempfile.mkdtemp(prefix="healing-")
    try:
        options = dict(num_workers=WORKERS, max_restarts=1, spare_workers=1, hang_timeout=hang_timeout)
        raydist.run(train, args=(hang_at, marks), resources_per_worker={"CPU": 0.5}, **options)  # type: ignore[arg-type]
        return _seconds(marks)
    finally:
        shutil.rmtree(marks, ignore_errors=True)


def torchrun_once(hang_timeout: float, hang_at: int) -> Optional[float]:
    """torchrun's seconds, or None where its restarted attempt failed too (said, with why)."""
    marks = tempfile.mkdtemp(prefix="healing-torchrun-")
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        script = os.path.join(marks, "run.py")
        with open(script, "w") as file:
            file.write(f"import sys; sys.path.insert(0, {here!r}); import healing; healing.train({hang_at}, {marks!r}, {hang_timeout!r})\n")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORKERS), "--max-restarts", "1"]
        result = subprocess.run([*command, script], capture_output=True, text=True, timeout=300)
        if result.returncode != 0 or not os.path.exists(os.path.join(marks, "first")):
            why = [line for line in result.stderr.splitlines() if "terminate called" in line or "Error" in line][:2]
            print(f"torchrun: the run failed (exit {result.returncode}): {' / '.join(why) or result.stderr[-300:]}", flush=True)
            return None
        return _seconds(marks)
    finally:
        shutil.rmtree(marks, ignore_errors=True)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hang-timeout", type=float, default=5.0, help="raydist's hang_timeout and torchrun's process group timeout")
    parser.add_argument("--hang-at", type=int, default=5, help="the step whose all_reduce rank 1 never reaches")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds

    import ray
    from _common import fmt_ratio, fmt_s, header, init_ray, median, print_table, verdict, wait_for_quiet_cpu

    header("healing")
    ours: List[float] = []
    theirs: List[Optional[float]] = []
    init_ray(num_cpus=WORKERS)
    try:
        for _ in range(rounds):  # interleaved: the machine's load hits both alike
            wait_for_quiet_cpu()
            ours.append(raydist_once(args.hang_timeout, args.hang_at))
            wait_for_quiet_cpu()
            theirs.append(torchrun_once(args.hang_timeout, args.hang_at))
    finally:
        ray.shutdown()
    h = args.hang_timeout
    finished = [t for t in theirs if t is not None]
    if not finished:
        raise SystemExit("torchrun failed in every round: no anchor")
    mine, anchor = median(ours), median(finished)
    failed = f"; {len(theirs) - len(finished)} of {len(theirs)} torchrun runs failed" if len(finished) < len(theirs) else ""
    print_table(
        f"A hung rank (1 of {WORKERS}), hang to the next attempt's first step, median of {rounds} (timeout {h:g} s on both){failed}",
        ["launcher", "seconds", "after the timeout", "runs"],
        [
            ["raydist: hang_timeout, a spare, warm restart", fmt_s(mine), fmt_s(mine - h), ", ".join(f"{s:.2f}" for s in ours)],
            [
                "torchrun: process group timeout, restart all",
                fmt_s(anchor),
                fmt_s(anchor - h),
                ", ".join("failed" if s is None else f"{s:.2f}" for s in theirs),
            ],
        ],
    )
    print_table(
        "Healing ratios",
        ["torchrun / raydist", "raydist after its timeout / torchrun's", f"raydist <= timeout + {SLACK_S:g} s"],
        [[fmt_ratio(anchor, mine), fmt_ratio(mine - h, anchor - h), verdict(mine <= h + SLACK_S)]],
    )


if __name__ == "__main__":
    main()
