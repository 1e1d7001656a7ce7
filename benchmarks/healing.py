"""Healing: a hung rank replaced, from the hang to the new world's first
step; a straggler replaced, the step time before and after.

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

The straggler (``--part straggler``), on a simulated 3-node cluster (2 CPU
slots each, 4 ranks and a spare): steps of 20 ms of work and an
``all_reduce``, one rank on a node without the spare sleeping ``--late`` s
more in each (its node is slow).

- raydist: ``straggler_action="replace"`` (default threshold and windows),
  ``spare_workers=1``: the spare takes rank 3's place; the step time of the
  next world against a healthy run's (no slow rank) on the same cluster.
- torchrun (the anchor): the same script, the slow rank kept for the whole
  run (no launcher replaces one): its step time.

The goal: the step time after the replacement within 10 % of the healthy one.

The pre-flight check (``--part preflight``): a start (``raydist.run`` of a
function that returns at once, on a local Ray) with ``health_check="quick"``
against the same start with it off, at 4 and 16 CPU ranks, interleaved; and
on the in-memory fake cluster (no Ray: the driver's own work), a group of
4,096 ranks on 512 nodes of 8, one of them slow and a spare on a 513th, started
with the check and without, and the verdict alone on 4,097 figures. The goal:
the quick check adds at most 2 s to a 4-rank start.

    python benchmarks/healing.py [--part hang|straggler|preflight|all] [--hang-timeout 5] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Tuple

WORKERS = 4
STEPS = 12
STEP_MS = 20.0
SLACK_S = 3.0  # the goal: the new world's first step within the hang timeout + this
SLOW_RANK = 3  # torchrun's straggler; under raydist, the highest rank on a node without the spare
TIMED_STEPS = 200  # steps timed in a healthy world
WARMUP_STEPS = 10  # the first steps of a world, left out of its step time
STEP_GOAL = 1.10  # the goal: the replaced world's step time within 10 % of a healthy one


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


def straggle(marks: str, late_s: float, first_steps: int, slow_rank: int = SLOW_RANK) -> int:
    """Steps of STEP_MS of work and an all_reduce (raydist's function, torchrun's
    script): in the first attempt ``first_steps`` of them, ``slow_rank`` sleeping
    ``late_s`` more in each; in later attempts TIMED_STEPS, none slow. Rank 0
    writes when each step ended, per attempt (also when the attempt fails)."""
    import torch
    import torch.distributed as dist

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, ended = dist.get_rank(), []
    slow = attempt == 0 and rank == slow_rank
    try:
        for _ in range(first_steps if attempt == 0 else TIMED_STEPS):
            end = time.perf_counter() + STEP_MS / 1000
            while time.perf_counter() < end:
                pass  # the step's work
            if slow:
                time.sleep(late_s)  # its node's slowness
            dist.all_reduce(torch.ones(1))
            ended.append(time.time())
    finally:
        if rank == 0:
            with open(os.path.join(marks, f"steps-{attempt}.json"), "w") as file:
                json.dump(ended, file)
    return len(ended)


def _step_times(marks: str) -> Dict[int, List[float]]:
    """Each attempt's steps: when each ended (rank 0's clock)."""
    found = {}
    for name in os.listdir(marks):
        if name.startswith("steps-"):
            with open(os.path.join(marks, name)) as file:
                found[int(name[6:-5])] = json.load(file)
    return found


def _step_time(ended: List[float]) -> float:
    """The median step time of an attempt, its first WARMUP_STEPS left out."""
    from _common import median

    kept = ended[WARMUP_STEPS:]
    return median([b - a for a, b in zip(kept, kept[1:])])


def raydist_straggler_once(late_s: float, replace: bool) -> Tuple[float, Optional[float], Optional[float]]:
    """(step time of the timed world, step time while the straggler ran, seconds from
    the first slow step to the last before its replacement); the last two for ``replace``."""
    import raydist

    marks = tempfile.mkdtemp(prefix="healing-straggler-")
    try:
        options = dict(spare_workers=1, resources_per_worker={"CPU": 1}, straggler_action="replace" if replace else "report")
        with raydist.WorkerGroup(WORKERS, **options) as group:  # type: ignore[arg-type]
            if not replace:
                group.run(straggle, args=(marks, 0.0, TIMED_STEPS))
            else:
                # The straggler: a rank whose node the spare is not on (the spare must replace it from elsewhere).
                spare_node = group.spares[0].node_id
                slow = max(w.rank for w in group.workers if w.node_id != spare_node)
                try:  # a first attempt far longer than the replacement takes (minutes)
                    group.run(straggle, args=(marks, late_s, 2_000, slow))
                except raydist.WorkerGroupError:
                    group.run(straggle, args=(marks, late_s, 2_000, slow))  # attempt 1: TIMED_STEPS, none slow
        steps = _step_times(marks)
        if not replace:
            return _step_time(steps[0]), None, None
        first = steps[0]
        if 1 not in steps:
            raise SystemExit(f"the straggler was not replaced in {len(first)} steps: is --late above straggler_threshold?")
        return _step_time(steps[1]), _step_time(first), first[-1] - first[0]
    finally:
        shutil.rmtree(marks, ignore_errors=True)


def torchrun_straggler_once(late_s: float) -> float:
    """torchrun's step time with the slow rank kept."""
    marks = tempfile.mkdtemp(prefix="healing-straggler-torchrun-")
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        script = os.path.join(marks, "run.py")
        with open(script, "w") as file:
            file.write(
                f"import sys; sys.path.insert(0, {here!r}); import healing; healing.straggle({marks!r}, {late_s!r}, {TIMED_STEPS})\n"
            )
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORKERS)]
        subprocess.run([*command, script], capture_output=True, text=True, timeout=300, check=True)
        return _step_time(_step_times(marks)[0])
    finally:
        shutil.rmtree(marks, ignore_errors=True)


def stragglers(late_s: float, rounds: int) -> None:
    import ray
    from _common import expose_to_workers, fmt_ms, fmt_ratio, fmt_s, median, print_table, verdict, wait_for_quiet_cpu
    from ray.cluster_utils import Cluster

    expose_to_workers()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
    healthy: List[float] = []
    replaced: List[Tuple[float, Optional[float], Optional[float]]] = []
    kept: List[float] = []
    try:
        for _ in range(rounds):  # interleaved: the machine's load hits every case alike
            wait_for_quiet_cpu()
            healthy.append(raydist_straggler_once(late_s, replace=False)[0])
            wait_for_quiet_cpu()
            replaced.append(raydist_straggler_once(late_s, replace=True))
            wait_for_quiet_cpu()
            kept.append(torchrun_straggler_once(late_s))
    finally:
        ray.shutdown()
        cluster.shutdown()
    good, after = median(healthy), median([r[0] for r in replaced])
    slow, anchor = median([r[1] or 0.0 for r in replaced]), median(kept)
    until = median([r[2] or 0.0 for r in replaced])
    print_table(
        f"A straggler (1 rank of {WORKERS}, {late_s * 1e3:.0f} ms late each step), step time, median of {rounds}",
        ["run", "step time", "vs healthy", "runs"],
        [
            ["raydist, no straggler (healthy)", fmt_ms(good), "1.00x", ", ".join(f"{s * 1e3:.1f}" for s in healthy)],
            [
                "raydist, while the straggler runs",
                fmt_ms(slow),
                fmt_ratio(slow, good),
                ", ".join(f"{(r[1] or 0) * 1e3:.1f}" for r in replaced),
            ],
            ["raydist, after its replacement", fmt_ms(after), fmt_ratio(after, good), ", ".join(f"{r[0] * 1e3:.1f}" for r in replaced)],
            ["torchrun: the straggler kept", fmt_ms(anchor), fmt_ratio(anchor, good), ", ".join(f"{s * 1e3:.1f}" for s in kept)],
        ],
    )
    print_table(
        "Straggler ratios",
        ["torchrun / raydist after", "raydist replaced after", f"raydist after <= {STEP_GOAL:.2f}x healthy"],
        [[fmt_ratio(anchor, after), fmt_s(until), verdict(after <= STEP_GOAL * good)]],
    )


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
    parser.add_argument("--part", choices=("hang", "straggler", "preflight", "all"), default="all")
    parser.add_argument("--late", type=float, default=0.1, help="the straggler's extra seconds per step (above straggler_threshold, 0.05)")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds

    from _common import header

    header("healing")
    if args.part in ("hang", "all"):
        hangs(args.hang_timeout, args.hang_at, rounds)
    if args.part in ("straggler", "all"):
        stragglers(args.late, rounds)
    if args.part in ("preflight", "all"):
        preflight(rounds)


def returns() -> int:
    return 0


def preflight(rounds: int) -> None:
    import ray
    from _common import fmt_ms, fmt_ratio, fmt_s, init_ray, median, print_table, verdict, wait_for_quiet_cpu

    import raydist

    sizes = (4, 16)
    starts: Dict[Tuple[int, str], List[float]] = {(n, mode): [] for n in sizes for mode in ("off", "quick")}
    init_ray(num_cpus=WORKERS)
    try:
        for _ in range(rounds):  # interleaved: the machine's load hits both alike
            for n in sizes:
                for mode in ("off", "quick"):
                    wait_for_quiet_cpu()
                    start = time.perf_counter()
                    raydist.run(returns, num_workers=n, health_check=mode, resources_per_worker={"CPU": WORKERS / n})
                    starts[(n, mode)].append(time.perf_counter() - start)
    finally:
        ray.shutdown()
    rows = []
    for n in sizes:
        off, quick = median(starts[(n, "off")]), median(starts[(n, "quick")])
        rows.append([n, fmt_s(off), fmt_s(quick), fmt_s(quick - off), fmt_ratio(quick, off)])
    print_table(
        f"A run's start (raydist.run of a function that returns at once), health_check off / quick, median of {rounds}",
        ["ranks", "off", "quick", "the check's cost", "quick / off"],
        rows,
    )
    with_check, without, decision = _simulated_preflight(rounds)
    four = median(starts[(4, "quick")]) - median(starts[(4, "off")])
    print_table(
        "Pre-flight on the fake cluster: 4,096 ranks on 512 nodes (no Ray: the driver's work), one node slow",
        ["start without", "start with the check", "the verdict alone", "the quick check adds <= 2 s at 4 ranks"],
        [[fmt_s(without), fmt_s(with_check), fmt_ms(decision), verdict(four <= 2.0)]],
    )


def _simulated_preflight(rounds: int) -> Tuple[float, float, float]:
    """(start with the check, without, judge + split on 4,097 figures): medians, seconds of wall time."""

    from _common import median

    from raydist.config import RunConfig
    from raydist.pool.driver.group import WorkerGroup
    from raydist.pool.rules.health import Probed, judge, split_healthy
    from raydist.testing.fake import FakeCluster

    logging.getLogger("raydist").setLevel(logging.ERROR)
    nodes = {f"node-{i:03d}": {"CPU": 8} for i in range(513)}
    timed: Dict[str, List[float]] = {"quick": [], "off": []}
    for _ in range(rounds):
        for mode in ("off", "quick"):
            cluster = FakeCluster(nodes, speeds={"node-007": 10.0})
            start = time.perf_counter()
            group = WorkerGroup(config=RunConfig(num_workers=4096, spare_workers=8, health_check=mode), cluster=cluster)
            timed[mode].append(time.perf_counter() - start)
            group.shutdown()
    probed = [Probed(i, f"node-{i // 8:03d}", 10.0 if i // 8 == 7 else 100.0) for i in range(4097)]
    decisions = []
    for _ in range(max(rounds, 5)):
        start = time.perf_counter()
        split_healthy(probed, judge(probed, 0.5), 4096, 4096)
        decisions.append(time.perf_counter() - start)
    return median(timed["quick"]), median(timed["off"]), median(decisions)


def hangs(hang_timeout: float, hang_at: int, rounds: int) -> None:
    import ray
    from _common import fmt_ratio, fmt_s, init_ray, median, print_table, verdict, wait_for_quiet_cpu

    ours: List[float] = []
    theirs: List[Optional[float]] = []
    init_ray(num_cpus=WORKERS)
    try:
        for _ in range(rounds):  # interleaved: the machine's load hits both alike
            wait_for_quiet_cpu()
            ours.append(raydist_once(hang_timeout, hang_at))
            wait_for_quiet_cpu()
            theirs.append(torchrun_once(hang_timeout, hang_at))
    finally:
        ray.shutdown()
    h = hang_timeout
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
