"""Training throughput: the same DDP loop under raydist.run and under torchrun.

A small MLP trained with DistributedDataParallel on CPU (gloo), a fixed batch,
a fixed number of steps. Only the loop is timed, inside the workers (the
slowest rank counts) in windows of 30 steps, a run's rate taken from its median
window; launcher start-up is excluded: this measures whether running inside a
Ray actor slows the steps down. Both launchers get the same
torch thread count, set explicitly in the loop and printed.

    python benchmarks/training.py [--workers 2] [--steps 300] [--reps 3] [--quick]
    python benchmarks/training.py --recorder   # raydist with / without its flight recorder
                                               # and straggler watch, same run, alternating
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

TARGET_RATIO = 0.98  # raydist steps/s at least this fraction of torchrun's
RECORDER_TARGET = 0.98  # steps/s with the flight recorder + straggler watch, over without


WINDOW_STEPS = 30  # the loop is timed in windows of this many steps


def train_loop(steps: int, warmup: int, threads: int, width: int, batch: int) -> Dict[str, Any]:
    """The timed loop; the process group is already up (raydist) or is
    initialised here from torchrun's environment."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    launcher_threads = torch.get_num_threads()  # what the launcher left us
    torch.set_num_threads(threads)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 10),
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, width, generator=generator)
    y = torch.randint(0, 10, (batch,), generator=generator)

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    dist.barrier()
    start = window_start = time.perf_counter()
    windows: List[float] = []
    for index in range(1, steps + 1):
        step()
        if index % WINDOW_STEPS == 0:
            now = time.perf_counter()
            windows.append(now - window_start)
            window_start = now
    elapsed = time.perf_counter() - start
    return {
        "rank": rank,
        "elapsed": elapsed,
        "windows": windows,
        "launcher_threads": launcher_threads,
        "threads": torch.get_num_threads(),
        "omp_env": os.environ.get("OMP_NUM_THREADS", "unset"),
    }


def torchrun_worker(args: argparse.Namespace) -> None:
    """The torchrun script: run the loop, rank 0 writes every rank's record."""
    import torch.distributed as dist

    record = train_loop(args.steps, args.warmup, args.threads, args.width, args.batch)
    records: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(records, record)
    if dist.get_rank() == 0:
        with open(args.result_file, "w") as out:
            json.dump(records, out)
    dist.destroy_process_group()


def run_torchrun(args: argparse.Namespace) -> List[Dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        result_file = os.path.join(tmp, "result.json")
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.workers}",
            os.path.abspath(__file__),
            "--torchrun-worker",
            "--result-file",
            result_file,
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--threads",
            str(args.threads),
            "--width",
            str(args.width),
            "--batch",
            str(args.batch),
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"torchrun exited {done.returncode}: {done.stderr[-2000:]}")
        with open(result_file) as src:
            return json.load(src)


def run_raydist(args: argparse.Namespace, flight_recorder: bool = True) -> List[Dict[str, Any]]:
    import raydist

    return raydist.run(
        train_loop,
        num_workers=args.workers,
        args=(args.steps, args.warmup, args.threads, args.width, args.batch),
        flight_recorder=flight_recorder,
    )


def run_without_recorder(args: argparse.Namespace) -> List[Dict[str, Any]]:
    return run_raydist(args, flight_recorder=False)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker, under both launchers")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3, help="runs per launcher, alternating")
    parser.add_argument("--quick", action="store_true", help="1 run per launcher, 100 steps")
    parser.add_argument(
        "--recorder",
        action="store_true",
        help="compare raydist with its flight recorder and straggler watch (the default) against "
        "flight_recorder=False, instead of raydist against torchrun",
    )
    parser.add_argument("--torchrun-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torchrun_worker:
        torchrun_worker(args)
        return
    if args.quick:
        args.reps, args.steps = 1, 100

    import ray
    from _common import header, init_ray, median, print_table, verdict, wait_for_quiet_cpu

    header("training")
    init_ray(num_cpus=max(4, args.workers))
    launchers = (
        (("recorder on", run_raydist), ("recorder off", run_without_recorder))
        if args.recorder
        else (("torchrun", run_torchrun), ("raydist", run_raydist))
    )
    rates: Dict[str, List[float]] = {name: [] for name, _ in launchers}
    threads_seen: Dict[str, set] = {name: set() for name, _ in launchers}
    try:
        for rep in range(args.reps):
            for name, launch in launchers:
                wait_for_quiet_cpu()
                records = launch(args)
                # A window lasts as long as its slowest rank; the median window
                # shrugs off bursts of other work on a shared machine.
                windows = [max(ts) for ts in zip(*(r["windows"] for r in records))]
                rate = WINDOW_STEPS / median(windows)
                rates[name].append(rate)
                whole = args.steps / max(r["elapsed"] for r in records)
                threads_seen[name] |= {(r["omp_env"], r["launcher_threads"], r["threads"]) for r in records}
                print(f"  run {rep} {name}: {rate:.1f} steps/s (median window), {whole:.1f} (whole loop)", flush=True)
    finally:
        ray.shutdown()

    def threads_text(name: str) -> str:
        return "; ".join(f"OMP_NUM_THREADS={o}, launcher left {left}, ran with {t}" for o, left, t in sorted(threads_seen[name]))

    rows = [[name, f"{median(values):.1f}", f"{max(values):.1f}", len(values), threads_text(name)] for name, values in rates.items()]
    print_table(
        f"DDP training, {args.workers} workers, MLP {args.width}x{args.width}x{args.width}x10, batch {args.batch}, "
        f"{args.steps} steps timed after {args.warmup} (steps/s: median {WINDOW_STEPS}-step window of the slowest rank)",
        ["launcher", "median steps/s", "best steps/s", "runs", "threads per worker"],
        rows,
    )
    if args.recorder:
        _recorder_ratio(rates)
        return
    # Best-of is the steadier figure when other work shares the machine.
    ratio_rows = []
    for label, pick in (("median", median), ("best", max)):
        ratio = pick(rates["raydist"]) / pick(rates["torchrun"])
        ratio_rows.append([label, f"{ratio:.2f}x", verdict(ratio >= TARGET_RATIO)])
    print_table("Training ratio", ["steps/s", "raydist / torchrun", f">= {TARGET_RATIO}x"], ratio_rows)


def _recorder_ratio(rates: Dict[str, List[float]]) -> None:
    from _common import median, print_table, verdict

    rows = []
    for label, pick in (("median", median), ("best", max)):
        ratio = pick(rates["recorder on"]) / pick(rates["recorder off"])
        rows.append([label, f"{ratio:.3f}x", verdict(ratio >= RECORDER_TARGET)])
    # Each rep runs on, then off, back to back: the median of those pairs' ratios
    # shrugs off the load of other work that shifts between reps.
    paired = median([on / off for on, off in zip(rates["recorder on"], rates["recorder off"])])
    rows.append(["median of pairs", f"{paired:.3f}x", verdict(paired >= RECORDER_TARGET)])
    print_table("Flight recorder + straggler watch", ["steps/s", "on / off", f">= {RECORDER_TARGET}x"], rows)


if __name__ == "__main__":
    main()
