"""Cold start: one whole no-op distributed call, from nothing to torn down.

On an already-initialised local Ray, for N workers, times:

* raydist     ``raydist.run(noop, num_workers=N)``: place, start, init gloo,
              run, tear down;
* floor       bare Ray actors: spawn, ``import torch``, gloo init on a TCP
              address, barrier, kill (what any Ray launcher must at least do);
* TorchTrainer ``TorchTrainer(noop).fit()`` from ray[train], same no-op;
* torchrun    ``python -m torch.distributed.run --standalone`` as a whole
              process, its script doing gloo init + barrier.

Methods are interleaved (one sample of each per round) so slow drift on a
small machine hits them alike; a warm-up round is not counted.

    python benchmarks/cold_start.py [--reps 3] [--sizes 2 4] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Callable, Dict, List, Optional

TARGET_VS_FLOOR = 1.3  # raydist at most this many times the floor
TARGET_VS_TRAINER = 5.0  # TorchTrainer at least this many times raydist


def torchrun_worker() -> None:
    """The torchrun script: what a no-op job needs (gloo init + barrier)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()


def noop() -> None:
    return None


def noop_train_fn() -> None:
    return None


class FloorWorker:
    """A bare actor: the least a Ray launcher has to do per rank."""

    def init_and_barrier(self, rank: int, world_size: int, port: int) -> int:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        dist.barrier()
        dist.destroy_process_group()
        return os.getpid()

    def ping(self) -> int:
        return os.getpid()


def time_raydist(n: int) -> float:
    import raydist

    start = time.perf_counter()
    raydist.run(noop, num_workers=n)
    return time.perf_counter() - start


def make_time_floor() -> Callable[[int], float]:
    import ray

    from _common import free_port

    remote_worker = ray.remote(num_cpus=1)(FloorWorker)

    def time_floor(n: int) -> float:
        start = time.perf_counter()
        actors = [remote_worker.remote() for _ in range(n)]
        port = free_port()
        ray.get([actor.init_and_barrier.remote(rank, n, port) for rank, actor in enumerate(actors)])
        for actor in actors:
            ray.kill(actor, no_restart=True)
        # Wait until Ray knows they are dead, as raydist's teardown does.
        ray.wait([actor.ping.remote() for actor in actors], num_returns=n, timeout=5.0)
        return time.perf_counter() - start

    return time_floor


def time_torchrun(n: int) -> float:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
        os.path.abspath(__file__), "--torchrun-worker",
    ]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"torchrun exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def make_time_trainer(storage: str) -> Callable[[int], float]:
    """TorchTrainer timing, or an exception saying why it cannot run."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def time_trainer(n: int) -> float:
        start = time.perf_counter()
        TorchTrainer(
            noop_train_fn,
            scaling_config=ScalingConfig(num_workers=n, use_gpu=False),
            run_config=RunConfig(storage_path=storage, name=f"noop-{uuid.uuid4().hex[:8]}"),
        ).fit()
        return time.perf_counter() - start

    return time_trainer


def train_version() -> str:
    try:
        from ray.train.v2._internal.constants import V2_ENABLED_ENV_VAR, is_v2_enabled
    except ImportError:
        return "Ray Train v1 (no v2 in this Ray)"
    set_to = os.environ.get(V2_ENABLED_ENV_VAR)
    how = f"{V2_ENABLED_ENV_VAR}={set_to}" if set_to is not None else f"{V2_ENABLED_ENV_VAR} unset: this Ray's default"
    return f"Ray Train {'v2' if is_v2_enabled() else 'v1'} ({how})"


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="timed rounds (after one warm-up round)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4], help="numbers of workers")
    parser.add_argument("--quick", action="store_true", help="one timed round")
    parser.add_argument("--torchrun-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torchrun_worker:
        torchrun_worker()
        return
    if args.quick:
        args.reps = 1

    import ray

    from _common import (
        fmt_ratio, fmt_s, header, init_ray, median, print_table, verdict, wait_for_quiet_cpu,
    )

    header("cold start")
    # Ray Train's controller needs a CPU slot of its own next to the N workers.
    init_ray(num_cpus=max(args.sizes) + 4)
    storage = tempfile.mkdtemp(prefix="raydist-bench-train-")
    methods: Dict[str, Callable[[int], float]] = {"raydist": time_raydist, "floor": make_time_floor()}
    unavailable: Dict[str, str] = {}
    try:
        methods["TorchTrainer"] = make_time_trainer(storage)
    except Exception as error:  # noqa: BLE001 - an anchor that cannot run is reported, not fatal
        unavailable["TorchTrainer"] = f"{type(error).__name__}: {error}"
    methods["torchrun"] = time_torchrun

    samples: Dict[tuple, List[float]] = {}
    try:
        for round_index in range(1 + args.reps):
            # Round 0 (smallest N only) warms file caches and Ray's worker pool.
            for n in args.sizes[:1] if round_index == 0 else args.sizes:
                for name, timer in methods.items():
                    if name in unavailable:
                        continue
                    wait_for_quiet_cpu()
                    try:
                        elapsed = timer(n)
                    except Exception as error:  # noqa: BLE001
                        unavailable[name] = f"{type(error).__name__}: {str(error).strip()[:500]}"
                        continue
                    if round_index > 0:
                        samples.setdefault((name, n), []).append(elapsed)
                    print(f"  round {round_index} N={n} {name}: {elapsed:.2f} s", flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)

    def med(name: str, n: int) -> Optional[float]:
        values = samples.get((name, n))
        return median(values) if values else None

    rows = []
    for n in args.sizes:
        for name in methods:
            values = samples.get((name, n))
            if values:
                rows.append([n, name, fmt_s(median(values)), fmt_s(min(values)), len(values)])
            else:
                rows.append([n, name, "unavailable", "", 0])
    print_table(
        f"Cold start, whole call, no-op function ({args.reps} timed rounds after a warm-up call)",
        ["N", "method", "median", "min", "samples"],
        rows,
    )

    ratio_rows = []
    for n in args.sizes:
        rd, floor, trainer, torchrun = (med(m, n) for m in ("raydist", "floor", "TorchTrainer", "torchrun"))
        vs_floor = rd / floor if rd and floor else None
        vs_trainer = trainer / rd if rd and trainer else None
        ratio_rows.append([
            n,
            fmt_ratio(rd, floor),
            verdict(None if vs_floor is None else vs_floor <= TARGET_VS_FLOOR),
            fmt_ratio(trainer, rd),
            verdict(None if vs_trainer is None else vs_trainer >= TARGET_VS_TRAINER),
            fmt_ratio(torchrun, rd),
        ])
    print_table(
        "Cold start ratios (medians)",
        ["N", "raydist / floor", f"<= {TARGET_VS_FLOOR}x", "TorchTrainer / raydist", f">= {TARGET_VS_TRAINER:g}x", "torchrun / raydist"],
        ratio_rows,
    )
    print(f"TorchTrainer anchor: {train_version()}")
    for name, reason in unavailable.items():
        print(f"{name} unavailable: {reason}")
    if "raydist" in unavailable:
        sys.exit(1)  # an anchor may be missing; raydist failing is a failure


if __name__ == "__main__":
    main()
