"""Horovod rendezvous: repeated ``hvd.shutdown(); hvd.init()`` on one group,
with horovod's stock rendezvous handler and with raydist's.

Every ``hvd.init()`` is a fresh gloo rendezvous through the driver's
rendezvous server (scopes ``global``, ``local_<host>``, ``cross_<n>``). With
horovod 0.28.1's handler, a scope that completes resets the progress of every
other scope, so ``local_<host>`` can keep the previous round's addresses and a
rank then connects to a peer's old port: gloo aborts the worker ("Connection
refused" / "Connection reset by peer") or times out. raydist's handler clears
only the scope that finished. Each run is one ``raydist.run`` whose ranks loop
shutdown + init + one checked allreduce; a run stops at its first failure.

    python benchmarks/horovod_rendezvous.py [--runs 3] [--iterations 200] [--workers 2 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Dict, List, Optional, Tuple


def reinit_loop(iterations: int, progress_dir: str) -> int:
    """On every rank: shutdown + init + allreduce, ``iterations`` times. After
    each good iteration the count goes to a file, so a run whose process gloo
    aborted still says how far it got."""
    import horovod.torch as hvd
    import torch

    progress = os.path.join(progress_dir, f"rank{hvd.rank()}")
    for i in range(iterations):
        hvd.shutdown()
        hvd.init()
        size = hvd.size()
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1 + i)]), op=hvd.Sum).item()
        if total != size * (size + 1) / 2 + size * i:
            raise AssertionError(f"iteration {i}: allreduce gave {total}")
        with open(progress, "w") as f:
            f.write(str(i + 1))
    return iterations


def completed(progress_dir: str, num_workers: int) -> int:
    """Iterations every rank finished (the slowest rank's count)."""
    counts = []
    for rank in range(num_workers):
        try:
            with open(os.path.join(progress_dir, f"rank{rank}")) as f:
                counts.append(int(f.read() or 0))
        except FileNotFoundError:
            counts.append(0)
    return min(counts)


def one_run(num_workers: int, iterations: int, gloo_timeout_s: int) -> Tuple[int, Optional[str], float]:
    """(iterations completed, how the run failed or None, seconds)."""
    import raydist

    with tempfile.TemporaryDirectory(prefix="raydist-hvd-") as progress_dir:
        started = time.perf_counter()
        failure = None
        try:
            raydist.run(
                reinit_loop,
                args=(iterations, progress_dir),
                num_workers=num_workers,
                backend="horovod",
                # A stale address can also hang a connect: bound it.
                env={"HOROVOD_GLOO_TIMEOUT_SECONDS": str(gloo_timeout_s)},
                timeout=60 + iterations * 2.0,
            )
        except raydist.WorkerGroupTimeout:
            failure = "hung"
        except raydist.WorkerGroupError as error:
            failure = "process died" if error.crashed else "raised"
        return completed(progress_dir, num_workers), failure, time.perf_counter() - started


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per handler and group size")
    parser.add_argument("--iterations", type=int, default=200, help="shutdown + init + allreduce per run")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 3], help="group sizes")
    parser.add_argument("--gloo-timeout", type=int, default=10, help="HOROVOD_GLOO_TIMEOUT_SECONDS")
    parser.add_argument("--quick", action="store_true", help="2 runs of 100 iterations, 2 workers")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.iterations, args.workers = 2, 100, [2]

    import ray
    from _common import header, init_ray, print_table
    from horovod.runner.http.http_server import RendezvousHandler

    from raydist.backends.horovod.driver import HorovodRendezvous, scoped_rendezvous_handler

    header("horovod_rendezvous")
    init_ray(num_cpus=max(4, *args.workers))
    handlers = {"horovod stock": RendezvousHandler, "raydist": scoped_rendezvous_handler()}
    rows = []
    totals: Dict[str, List[int]] = {}
    try:
        for name, handler in handlers.items():
            HorovodRendezvous.handler_cls = handler  # the server of the next groups
            for num_workers in args.workers:
                done, failures, seconds = [], [], 0.0
                for run in range(args.runs):
                    count, failure, elapsed = one_run(num_workers, args.iterations, args.gloo_timeout)
                    seconds += elapsed
                    done.append(count)
                    failures.append(failure)
                    outcome = "ok" if failure is None else f"{failure} at iteration {count + 1}"
                    print(f"  {name}, {num_workers} ranks, run {run + 1}: {outcome} ({elapsed:.1f} s)", flush=True)
                failed_runs = sum(f is not None for f in failures)
                attempted = sum(done) + failed_runs  # a failed run ends at its failing iteration
                kinds = sorted({f for f in failures if f is not None})
                rows.append(
                    [
                        name,
                        num_workers,
                        f"{failed_runs}/{args.runs}",
                        f"{failed_runs}/{attempted}",
                        ", ".join(str(c + 1) for c, f in zip(done, failures) if f is not None) or "-",
                        ", ".join(kinds) or "-",
                        f"{seconds:.0f} s",
                    ]
                )
                total = totals.setdefault(name, [0, 0, 0, 0])
                total[0] += failed_runs
                total[1] += args.runs
                total[2] += failed_runs
                total[3] += attempted
    finally:
        HorovodRendezvous.handler_cls = None
        ray.shutdown()

    print_table(
        f"hvd.shutdown() + hvd.init() + allreduce, up to {args.iterations} times per run (a run stops at its first failure)",
        ["handler", "ranks", "failed runs", "failed iterations", "failed at iteration", "how", "time"],
        rows,
    )
    for name, (failed_runs, runs, failed_iterations, attempted) in totals.items():
        print(
            f"{name}: {failed_runs}/{runs} runs failed, {failed_iterations}/{attempted} iterations "
            f"({100 * failed_iterations / max(1, attempted):.2f} %)"
        )


if __name__ == "__main__":
    main()
