"""Object collectives: raydist's vs torch.distributed's, on the same gloo group.

Inside one ``WorkerGroup`` of 4 ranks (its process group is gloo), broadcast
from rank 0 and all-gather numpy arrays and torch tensors of 1 KB .. 256 MB:

* raydist: ``raydist.broadcast_object`` / ``raydist.all_gather_object``
  (objects at or above the group's threshold, 1 MiB by default, travel through Ray's
  object store; smaller ones are pickled over gloo);
* torch:   ``dist.broadcast_object_list`` / ``dist.all_gather_object``.

Each rank times its own collective after a barrier (up to 1 MB: a burst of
back-to-back collectives, divided by their number); a repetition counts the
slowest rank; the table gives the median over repetitions, torch and raydist
alternating. From 64 MB each repetition is its own group call, so that a slow
row can stop repeating (``--row-budget``).

    python benchmarks/collectives.py [--sizes 1K 1M 64M 256M] [--quick]
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Dict, List, Optional

TARGET_BIG_SPEEDUP = 5.0  # 256 MB broadcast: torch time / raydist time at least this
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
REPS_BY_SIZE = ((2**10, 15), (2**20, 10), (64 * 2**20, 4))  # up to this size, this many reps
BIG_REPS = 3


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def reps_for(nbytes: int) -> int:
    for limit, reps in REPS_BY_SIZE:
        if nbytes <= limit:
            return reps
    return BIG_REPS


def time_collectives(op: str, kind: str, nbytes: int, reps: int, rep_offset: int = 0) -> Dict[str, List[float]]:
    """This rank's time for each implementation, alternating torch and raydist
    (and which goes first) rep by rep so machine noise and order effects hit
    both alike (runs inside the workers)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    import raydist

    rank, world = dist.get_rank(), dist.get_world_size()
    value = rank % 251
    if op == "all_gather" or rank == 0:
        obj: Any = np.full(nbytes, value, dtype=np.uint8) if kind == "numpy" else torch.full((nbytes,), value, dtype=torch.uint8)
    else:
        obj = None
    expected = [0] if op == "broadcast" else [r % 251 for r in range(world)]
    times: Dict[str, List[float]] = {"torch": [], "raydist": []}
    # Small payloads: time a burst of back-to-back collectives and divide, so
    # that how unevenly the ranks leave the barrier does not dominate.
    burst = 20 if nbytes <= 64 * 2**10 else 4 if nbytes <= 2**20 else 1
    for rep in range(reps):
        for impl in ("torch", "raydist") if (rep + rep_offset) % 2 == 0 else ("raydist", "torch"):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(burst):
                if op == "broadcast":
                    if impl == "raydist":
                        out: Any = raydist.broadcast_object(obj, src=0)
                    else:
                        box = [obj]
                        dist.broadcast_object_list(box, src=0)
                        out = box[0]
                elif impl == "raydist":
                    out = raydist.all_gather_object(obj)
                else:
                    out = [None] * world
                    dist.all_gather_object(out, obj)
            times[impl].append((time.perf_counter() - start) / burst)
            # Check the (last) result outside the timing: sizes and contents.
            received = [out] if op == "broadcast" else list(out)
            for got, want in zip(received, expected):
                assert len(got) == nbytes and int(got[0]) == want and int(got[-1]) == want, (op, impl, kind, nbytes)
            del out, received
    return times


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["1K", "1M", "64M", "256M"])
    parser.add_argument("--kinds", nargs="+", default=["numpy", "torch"], choices=["numpy", "torch"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--row-budget", type=float, default=30.0, help="stop repeating a row once its repetitions took this many seconds")
    parser.add_argument("--object-store-gib", type=float, default=6.0)
    parser.add_argument("--quick", action="store_true", help="1K and 64M only, fewer reps")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in (["1K", "64M"] if args.quick else args.sizes)]

    import ray
    from _common import fmt_bytes, fmt_ms, fmt_ratio, header, init_ray, median, print_table, verdict

    from raydist import WorkerGroup
    from raydist.config import DEFAULT_OBJECT_STORE_THRESHOLD

    header("collectives")
    # All-gathering 256 MB on 4 ranks keeps 4 x 256 MB in the store at once.
    init_ray(num_cpus=args.workers, object_store_memory=int(args.object_store_gib * 2**30))
    results: Dict[tuple, Dict[str, List[float]]] = {}
    capped: Dict[tuple, int] = {}
    try:
        with WorkerGroup(args.workers) as group:
            group.run(time_collectives, ("broadcast", "numpy", DEFAULT_OBJECT_STORE_THRESHOLD, 1))  # warm both paths
            for nbytes in sizes:
                reps = max(1, reps_for(nbytes) // (2 if args.quick else 1))
                for kind in args.kinds:
                    for op in ("broadcast", "all_gather"):
                        key = (nbytes, kind, op)
                        results[key] = {"torch": [], "raydist": []}
                        # Small payloads repeat inside one call; big ones one call per
                        # rep, so that a slow row can stop repeating.
                        calls, per_call = (reps, 1) if nbytes >= 64 * 2**20 else (1, reps)
                        spent = 0.0
                        for call in range(calls):
                            if spent > args.row_budget:
                                capped[key] = call
                                break
                            wall = time.perf_counter()
                            # rep_offset keeps the order alternating across one-rep calls.
                            per_rank = group.run(time_collectives, (op, kind, nbytes, per_call, call))
                            spent += time.perf_counter() - wall
                            for impl in ("torch", "raydist"):
                                # A rep lasts as long as its slowest rank.
                                results[key][impl] += [max(ts) for ts in zip(*(r[impl] for r in per_rank))]
                        print(
                            f"  {fmt_bytes(nbytes)} {kind} {op}: torch {fmt_ms(median(results[key]['torch']))}, "
                            f"raydist {fmt_ms(median(results[key]['raydist']))}",
                            flush=True,
                        )
    finally:
        ray.shutdown()

    rows = []
    for nbytes in sizes:
        for kind in args.kinds:
            for op in ("broadcast", "all_gather"):
                times = results[(nbytes, kind, op)]
                torch_s, ray_s = median(times["torch"]), median(times["raydist"])
                reps = str(len(times["torch"])) + (" (capped)" if (nbytes, kind, op) in capped else "")
                rows.append([fmt_bytes(nbytes), kind, op, fmt_ms(torch_s), fmt_ms(ray_s), fmt_ratio(torch_s, ray_s), reps])
    print_table(
        f"Object collectives among {args.workers} ranks (slowest rank, median over reps; "
        f"raydist object-store threshold {fmt_bytes(DEFAULT_OBJECT_STORE_THRESHOLD)})",
        ["size", "payload", "collective", "torch.distributed (gloo)", "raydist", "torch / raydist", "reps"],
        rows,
    )

    target_rows = []
    big, small = 256 * 2**20, 2**10  # the sizes the targets name
    for kind in args.kinds:
        if big in sizes:
            times = results[(big, kind, "broadcast")]
            speedup = median(times["torch"]) / median(times["raydist"])
            target_rows.append(
                [
                    f"{fmt_bytes(big)} {kind} broadcast: raydist >= {TARGET_BIG_SPEEDUP:g}x faster",
                    f"{speedup:.2f}x",
                    verdict(speedup >= TARGET_BIG_SPEEDUP),
                ]
            )
        for op in ("broadcast", "all_gather") if small in sizes else ():
            times = results[(small, kind, op)]
            t, r = median(times["torch"]), median(times["raydist"])
            # "No slower" allows 10%: these are millisecond timings on a small shared machine.
            target_rows.append([f"{fmt_bytes(small)} {kind} {op}: raydist no slower (within 10%)", f"{t / r:.2f}x", verdict(r <= 1.1 * t)])
    if target_rows:
        print_table("Collective targets", ["target", "torch / raydist", "result"], target_rows)


if __name__ == "__main__":
    main()
