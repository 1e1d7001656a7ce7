"""Cold start against the number of workers, on a simulated 4-node cluster.

``ray.cluster_utils.Cluster`` starts 4 raylets on this machine (4 CPU slots
each, 16 in all); ``raydist.run(noop, num_workers=N)`` for N = 1 .. 16, next
to the bare-actor floor of cold_start.py (spawn, import torch, gloo init,
barrier, kill). Every process runs on the same cores, so beyond the core
count this measures the machine as much as raydist.

    python benchmarks/scale.py [--sizes 1 2 4 8 16] [--reps 1] [--quick]
"""

from __future__ import annotations

import argparse
from typing import Dict, List, Optional

NODES = 4
CPUS_PER_NODE = 4


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="N = 1, 4, 16")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes = [1, 4, 16]

    import time

    import ray
    from _common import (
        expose_to_workers,
        fmt_ratio,
        fmt_s,
        header,
        median,
        print_table,
        wait_for_quiet_cpu,
    )
    from cold_start import make_time_floor, time_raydist
    from ray.cluster_utils import Cluster

    header("scale")
    expose_to_workers()  # before the raylets start: their workers import cold_start
    started = time.perf_counter()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": CPUS_PER_NODE, "include_dashboard": False},
    )
    for _ in range(NODES - 1):
        cluster.add_node(num_cpus=CPUS_PER_NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
    print(f"  {NODES}-node cluster up in {time.perf_counter() - started:.1f} s", flush=True)
    samples: Dict[tuple, List[float]] = {}
    try:
        time_floor = make_time_floor()
        time_raydist(1)  # warm-up: file caches, each raylet's first worker
        for _ in range(args.reps):
            for n in args.sizes:
                for name, timer in (("raydist", time_raydist), ("floor", time_floor)):
                    wait_for_quiet_cpu()
                    elapsed = timer(n)
                    samples.setdefault((name, n), []).append(elapsed)
                    print(f"  N={n} {name}: {elapsed:.2f} s", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()

    rows = []
    for n in args.sizes:
        rd, floor = median(samples[("raydist", n)]), median(samples[("floor", n)])
        rows.append([n, fmt_s(rd), fmt_s(floor), fmt_ratio(rd, floor), f"{rd / n:.2f} s"])
    print_table(
        f"Cold start on a simulated {NODES}-node cluster ({CPUS_PER_NODE} CPU slots each), "
        f"median of {args.reps} (all nodes share this machine's cores)",
        ["N", "raydist.run", "bare-actor floor", "raydist / floor", "raydist per worker"],
        rows,
    )


if __name__ == "__main__":
    main()
