"""Leaks: many successive raydist.run calls in one driver leave nothing behind.

100 calls of ``raydist.run`` (every 4th raising on rank 1), then counts what
is left: live raydist actors (Ray's state API), placement groups not REMOVED,
the driver's RSS growth and its listening TCP ports. The anchor is the same
driver state measured before the calls (after a few warm-up calls, which load
the modules and Ray's client-side caches once).

    python benchmarks/leaks.py [--calls 100] [--workers 2] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any, Dict, List, Optional, Set

RSS_BUDGET_MB = 50.0  # growth over all the calls that still counts as "nothing left"


def succeed() -> int:
    import raydist

    return raydist.get_context().rank


def fail_on_rank_1() -> int:
    import raydist

    rank = raydist.get_context().rank
    if rank == 1:
        raise ValueError("planned failure on rank 1")
    return rank


def listening_ports(process: Any) -> Set[int]:
    return {c.laddr.port for c in process.net_connections(kind="tcp") if c.status == "LISTEN"}


def leftovers() -> Dict[str, int]:
    """Live raydist actors (and, to show the filter matches, all raydist actors
    Ray still lists) and placement groups not REMOVED."""
    import ray
    from ray.util.state import list_actors

    # Name this driver's cluster: other Ray instances on the machine would be ambiguous.
    address = ray.get_runtime_context().gcs_address
    actors = list_actors(address=address, limit=10_000, raise_on_missing_output=False)
    ours = [a for a in actors if "RayWorker" in (a.class_name or "")]
    live = [a for a in ours if a.state != "DEAD"]
    groups = [pg for pg in ray.util.placement_group_table().values() if pg.get("state") != "REMOVED"]
    return {"actors": len(live), "listed": len(ours), "placement_groups": len(groups)}


def worker_processes(timeout_s: float) -> tuple:
    """raydist worker processes still running under this driver's raylet, after
    giving killed ones up to ``timeout_s`` to exit; and how long that took."""
    import psutil
    import ray

    raylet = psutil.Process(ray._private.worker._global_node.all_processes["raylet"][0].process.pid)
    started = time.monotonic()
    while True:
        alive = []
        for child in raylet.children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE and "RayWorker" in " ".join(child.cmdline()):
                    alive.append(child.pid)
            except psutil.NoSuchProcess:
                continue
        waited = time.monotonic() - started
        if not alive or waited > timeout_s:
            return len(alive), waited
        time.sleep(0.1)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="20 calls")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls = 20

    import psutil
    import ray
    from _common import header, init_ray, print_table, verdict

    import raydist

    header("leaks")
    init_ray(num_cpus=max(4, args.workers), include_dashboard=True)  # the state API needs the dashboard
    driver = psutil.Process()
    failures_seen = 0
    try:
        for _ in range(args.warmup):
            raydist.run(succeed, num_workers=args.workers)
        gc.collect()
        rss_before = driver.memory_info().rss
        ports_before = listening_ports(driver)
        started = time.perf_counter()
        for call in range(args.calls):
            if call % 4 == 3:
                try:
                    raydist.run(fail_on_rank_1, num_workers=args.workers)
                except raydist.WorkerGroupError as error:
                    assert [f.rank for f in error.failures] == [1], error
                    failures_seen += 1
                else:
                    raise AssertionError("the failing call did not raise")
            else:
                assert raydist.run(succeed, num_workers=args.workers) == list(range(args.workers))
            if (call + 1) % 20 == 0:
                print(f"  {call + 1} calls, {(time.perf_counter() - started) / (call + 1):.2f} s per call", flush=True)
        elapsed = time.perf_counter() - started
        gc.collect()
        rss_after = driver.memory_info().rss
        ports_after = listening_ports(driver)
        left = leftovers()
        processes, waited = worker_processes(timeout_s=10.0)
    finally:
        ray.shutdown()

    growth_mb = (rss_after - rss_before) / 2**20
    new_ports = sorted(ports_after - ports_before)
    checks = [
        ["live raydist actors", left["actors"], "0", verdict(left["actors"] == 0)],
        ["raydist worker processes (after up to 10 s to exit)", f"{processes} (gone after {waited:.1f} s)", "0", verdict(processes == 0)],
        ["placement groups not REMOVED", left["placement_groups"], "0", verdict(left["placement_groups"] == 0)],
        [
            "driver RSS growth",
            f"{growth_mb:+.1f} MB ({growth_mb * 1024 / args.calls:+.0f} KB/call)",
            f"< {RSS_BUDGET_MB:g} MB",
            verdict(growth_mb < RSS_BUDGET_MB),
        ],
        [
            "new listening TCP ports of the driver",
            f"{len(new_ports)} {new_ports if new_ports else ''}".strip(),
            "0",
            verdict(not new_ports),
        ],
    ]
    print_table(
        f"Leaks after {args.calls} raydist.run calls of {args.workers} workers "
        f"({failures_seen} failing on rank 1; {elapsed / args.calls:.2f} s per call)",
        ["left behind", "measured", "expected", "result"],
        checks,
    )
    ok = all(row[-1] == "MET" for row in checks)
    print(
        f"nothing left: {'PASS' if ok else 'FAIL'}  ({left['listed']} raydist actors listed by the state API; "
        f"driver listening ports before: {len(ports_before)}, after: {len(ports_after)})"
    )


if __name__ == "__main__":
    main()
