"""Warm call: the per-call cost of a live group.

``WorkerGroup(4).run(noop)`` against the least Ray can do for the same thing,
``ray.get([a.noop.remote() for a in 4 bare actors])``, both after warm-up.
``--timeline``: a third group, writing its run's timeline, alternates with them.

    python benchmarks/warm_call.py [--calls 200] [--workers 4] [--quick] [--timeline]
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Dict, List, Optional

TARGET_MEDIAN_S = 0.005
TARGET_RATIO = 1.3  # raydist median / bare median
TARGET_TIMELINE_RATIO = 1.05  # with the timeline on / off (median)


def noop() -> None:
    return None


class BareActor:
    def noop(self) -> None:
        return None


def sample(calls: Dict[str, Callable[[], object]], count: int, warmup: int) -> Dict[str, List[float]]:
    """Time each call ``count`` times, alternating between them so that
    background noise on the machine hits both alike."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    times: Dict[str, List[float]] = {name: [] for name in calls}
    for _ in range(count):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="50 calls")
    parser.add_argument("--timeline", action="store_true", help="also a group that writes its timeline")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls = 50

    import contextlib
    import os
    import tempfile

    import ray
    from _common import fmt_ms, fmt_ratio, header, init_ray, median, percentile, print_table, verdict

    from raydist import WorkerGroup

    header("warm call")
    init_ray(num_cpus=(3 if args.timeline else 2) * args.workers)  # every pool alive at once, calls alternate
    folder = tempfile.mkdtemp(prefix="warm-call-")
    try:
        actors = [ray.remote(num_cpus=1)(BareActor).remote() for _ in range(args.workers)]
        with contextlib.ExitStack() as stack:
            group = stack.enter_context(WorkerGroup(args.workers))
            calls: Dict[str, Callable[[], object]] = {
                "raydist": lambda: group.run(noop),
                "bare": lambda: ray.get([a.noop.remote() for a in actors]),
            }
            if args.timeline:
                traced = stack.enter_context(WorkerGroup(args.workers, timeline=os.path.join(folder, "timeline.json")))
                calls["timeline"] = lambda: traced.run(noop)
            times = sample(calls, args.calls, args.warmup)
        for actor in actors:
            ray.kill(actor)
    finally:
        ray.shutdown()
    raydist_times, bare_times = times["raydist"], times["bare"]

    rows = []
    named = [("raydist group.run(noop)", raydist_times), ("bare actors ray.get", bare_times)]
    if args.timeline:
        named.append(("raydist, timeline on", times["timeline"]))
    for name, samples in named:
        rows.append([name, fmt_ms(median(samples)), fmt_ms(percentile(samples, 99)), fmt_ms(min(samples))])
    print_table(
        f"Warm call, {args.workers} workers, {args.calls} calls each (alternating) after {args.warmup} warm-up",
        ["method", "median", "p99", "min"],
        rows,
    )
    rd_median, bare_median = median(raydist_times), median(bare_times)
    print_table(
        "Warm call ratios",
        [
            "raydist / bare (median)",
            "raydist / bare (p99)",
            f"median ratio <= {TARGET_RATIO:g}x",
            f"raydist median <= {TARGET_MEDIAN_S * 1000:g} ms",
        ],
        [
            [
                fmt_ratio(rd_median, bare_median),
                fmt_ratio(percentile(raydist_times, 99), percentile(bare_times, 99)),
                verdict(rd_median <= TARGET_RATIO * bare_median),
                verdict(rd_median <= TARGET_MEDIAN_S),
            ]
        ],
    )
    if args.timeline:
        on = median(times["timeline"])
        print_table(
            "Warm call with the run's timeline on",
            ["timeline on / off (median)", f"<= {TARGET_TIMELINE_RATIO:g}x"],
            [[fmt_ratio(on, rd_median), verdict(on <= TARGET_TIMELINE_RATIO * rd_median)]],
        )


if __name__ == "__main__":
    main()
