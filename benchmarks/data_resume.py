"""What resuming an epoch mid-way costs: rank 0 of 4 reads the rest of an
epoch from a position 90 % in, against reading the epoch from the start
(what a restart does without a saved position) and against skipping the
consumed batches (the usual way to resume with torch's sampler: read them
and drop them). The floor is reading as many rows from the epoch's start.

    python benchmarks/data_resume.py [--rows 1000000] [--batch 256] [--reps 3]

- The sampler: ``raydist.DistributedSampler`` with a ``DataLoader``
  (``num_workers=0``) over a map-style dataset of 64 float features per
  row; torch's ``DistributedSampler`` for the anchors.
- Ray Data: ``DataConfig(exactly_once=True)``'s shard (``PositionalShard``)
  over ``ray.data.range`` with the same features, its blocks read by the
  driver as ``raydist.run`` reads them, in Ray's object store.

Each figure is the median of ``--reps``; one untimed pass first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import fmt_ms, fmt_ratio, header, init_ray, median, print_table, verdict

FEATURES = 64
WORLD = 4
AT = 0.9  # the position resumed from, as a fraction of the epoch


class Rows:
    """A map-style dataset: row i is 64 floats (one numpy row, as a feature store gives)."""

    def __init__(self, rows: int) -> None:
        self.data = np.random.default_rng(0).standard_normal((rows, FEATURES)).astype(np.float32)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        return self.data[index]


def timed(read: Callable[[], int], reps: int) -> float:
    read()  # untimed: caches warm
    samples: List[float] = []
    for _ in range(reps):
        started = time.perf_counter()
        read()
        samples.append(time.perf_counter() - started)
    return median(samples)


def sampler_rows(rows: int, batch: int, reps: int) -> Dict[str, Optional[float]]:
    import torch.utils.data as tud

    from raydist.core.sampler import DistributedSampler

    dataset = Rows(rows)
    consumed = int(rows * AT) // (WORLD * batch) * (WORLD * batch)  # a step boundary

    def torch_epoch(skip_batches: int = 0) -> int:
        sampler = tud.DistributedSampler(dataset, num_replicas=WORLD, rank=0, seed=0)
        count = 0
        for index, _ in enumerate(tud.DataLoader(dataset, batch_size=batch, sampler=sampler)):
            count += index >= skip_batches
        return count

    def resumed() -> int:
        sampler = DistributedSampler(dataset, num_replicas=WORLD, rank=0, seed=0)
        sampler.load_state_dict({"epoch": 0, "position": consumed, "rows": rows, "seed": 0, "shuffle": True})
        return sum(1 for _ in sampler.track(tud.DataLoader(dataset, batch_size=batch, sampler=sampler)))

    left = -(-(rows - consumed) // (WORLD * batch))

    def floor() -> int:
        sampler = DistributedSampler(dataset, num_replicas=WORLD, rank=0, seed=0)
        taken = 0
        for _ in sampler.track(tud.DataLoader(dataset, batch_size=batch, sampler=sampler)):
            taken += 1
            if taken == left:
                break
        return taken

    return {
        "from the start": timed(torch_epoch, reps),
        "skip": timed(lambda: torch_epoch(consumed // (WORLD * batch)), reps),
        "resumed": timed(resumed, reps),
        "floor": timed(floor, reps),
    }


def ray_data_rows(rows: int, batch: int, reps: int) -> Dict[str, Optional[float]]:
    import ray

    from raydist.pool.worker.positional import PositionalShard, read_blocks

    def features(batch: Dict[str, Any]) -> Dict[str, Any]:
        generator = np.random.default_rng(int(batch["id"][0]))
        return {"id": batch["id"], "x": generator.standard_normal((len(batch["id"]), FEATURES)).astype(np.float32)}

    dataset = ray.data.range(rows, override_num_blocks=16).map_batches(features)
    blocks = read_blocks(dataset)
    consumed = int(rows * AT) // (WORLD * batch) * (WORLD * batch)

    def epoch(position: int, limit: int = 10**9) -> int:
        shard = PositionalShard(blocks, "train", 0, WORLD, shuffle=True, seed=0)
        shard.load_state_dict({"epoch": 0, "position": position, "rows": rows, "seed": 0, "shuffle": True})
        taken = 0
        for _ in shard.iter_batches(batch_size=batch):
            taken += 1
            if taken == limit:
                break
        return taken

    left = -(-(rows - consumed) // (WORLD * batch))
    return {
        "from the start": timed(lambda: epoch(0), reps),
        "skip": None,  # a streaming split has no position to skip to: a restart reads the epoch from the start
        "resumed": timed(lambda: epoch(consumed), reps),
        "floor": timed(lambda: epoch(0, left), reps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    options = parser.parse_args()
    header(f"data_resume: rank 0 of {WORLD} resumes an epoch of {options.rows:,} rows {AT:.0%} in, batches of {options.batch}")
    found: Dict[str, Dict[str, Optional[float]]] = {"sampler (DataLoader)": sampler_rows(options.rows, options.batch, options.reps)}
    init_ray(num_cpus=2)
    found["Ray Data (exactly_once)"] = ray_data_rows(options.rows, options.batch, options.reps)
    table = []
    for source, figures in found.items():
        resumed, floor = figures["resumed"], figures["floor"]
        met = None if resumed is None or floor is None else resumed <= floor * 1.1  # within noise of reading the rows that remain
        table.append(
            [
                source,
                fmt_ms(figures["from the start"]),
                fmt_ms(figures["skip"]),
                fmt_ms(figures["resumed"]),
                fmt_ms(figures["floor"]),
                fmt_ratio(figures["resumed"], figures["from the start"]),
                verdict(met),
            ]
        )
    print_table(
        f"Resuming at {AT:.0%} of the epoch (medians of {options.reps})",
        [
            "reader",
            "epoch from the start",
            "skip the consumed batches",
            "resumed",
            "the rows that remain, read from the start",
            "resumed / from the start",
            "resume <= rows that remain",
        ],
        table,
    )


if __name__ == "__main__":
    main()
