"""One epoch of a local parquet dataset per rank: raydist's
``get_dataset_shard`` against Ray Train's (``TorchTrainer``) and against
torch ``DataLoader`` + ``DistributedSampler`` over the same files (pyarrow).

    python benchmarks/data.py [--rows 200000] [--workers 2] [--batch 256]

~200k rows of 64 float features and a label, a per-batch CPU transform
(standardise, then a small matrix product), 2 ranks, batch 256. Each rank
times its first batch (from the start of its loop) and its rows/s over the
epoch (and after its first batch); the table gives rank 0's (the ranks
read equal shares). One untimed pass over the files first starts Ray
Data's task workers and warms the file cache for all three. Needs
``pip install -e '.[bench]'`` (Ray Train and Ray Data).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import fmt_ratio, fmt_s, header, init_ray, print_table

FEATURES = 64
PROJECTION = np.random.default_rng(0).standard_normal((FEATURES, 16)).astype(np.float32)


def write_parquet(folder: str, rows: int, files: int = 8) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    os.makedirs(os.path.join(folder, "files"))
    per_file = rows // files
    for index in range(files):
        columns = {f"f{i}": rng.standard_normal(per_file).astype(np.float32) for i in range(FEATURES)}
        columns["label"] = rng.integers(0, 10, per_file)
        pq.write_table(pa.table(columns), os.path.join(folder, "files", f"part-{index}.parquet"))


def transform(features: np.ndarray) -> float:
    """The per-batch CPU work: standardise, project."""
    standard = (features - features.mean(axis=0)) / (features.std(axis=0) + 1e-6)
    return float((standard @ PROJECTION).sum())


def as_matrix(batch: Dict[str, np.ndarray]) -> np.ndarray:
    return np.stack([batch[f"f{i}"] for i in range(FEATURES)], axis=1)


def read_epoch(shard: Any, batch_size: int) -> Dict[str, float]:
    started = time.perf_counter()
    first = None
    rows = 0
    for batch in shard.iter_batches(batch_size=batch_size, batch_format="numpy"):
        if first is None:
            first = time.perf_counter() - started
        transform(as_matrix(batch))
        rows += len(batch["label"])
    seconds = time.perf_counter() - started
    return {"first": first or 0.0, "rows": rows, "seconds": seconds}


def raydist_epoch(batch_size: int) -> Dict[str, float]:
    import raydist

    return read_epoch(raydist.get_dataset_shard("train"), batch_size)


def train_loop(config: Dict[str, Any]) -> None:
    import json

    import ray.train

    result = read_epoch(ray.train.get_dataset_shard("train"), config["batch_size"])
    if ray.train.get_context().get_world_rank() == 0:  # Ray Train keeps metrics only with a checkpoint
        with open(config["out"], "w") as file:
            json.dump(result, file)


def loader_epoch(rank: int, world: int, folder: str, batch_size: int, port: int, out: Any) -> None:
    """One rank of DataLoader + DistributedSampler (its files read with pyarrow)."""
    import pyarrow.parquet as pq
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    started = time.perf_counter()
    table = pq.read_table(folder)
    features = torch.from_numpy(np.stack([table.column(f"f{i}").to_numpy() for i in range(FEATURES)], axis=1))
    dataset = TensorDataset(features, torch.from_numpy(table.column("label").to_numpy()))
    loader = DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset, shuffle=False))
    first, rows = None, 0
    for x, y in loader:
        if first is None:
            first = time.perf_counter() - started
        transform(x.numpy())
        rows += len(y)
    out.put((rank, {"first": first or 0.0, "rows": rows, "seconds": time.perf_counter() - started}))
    dist.destroy_process_group()


def run_loader(folder: str, workers: int, batch_size: int) -> Dict[str, float]:
    import torch.multiprocessing as mp
    from _common import free_port

    context = mp.get_context("spawn")
    queue = context.Queue()
    port = free_port()
    processes = [context.Process(target=loader_epoch, args=(r, workers, folder, batch_size, port, queue)) for r in range(workers)]
    for process in processes:
        process.start()
    results = dict(queue.get(timeout=600) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    return results[0]


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="50k rows")
    args = parser.parse_args(argv)
    rows = 50_000 if args.quick else args.rows
    header("data")
    folder = tempfile.mkdtemp(prefix="raydist-bench-data-")
    try:
        write_parquet(folder, rows)
        results = measure(folder, args.workers, args.batch)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report(results, rows, args.workers, args.batch)


def measure(folder: str, workers: int, batch_size: int) -> Dict[str, Dict[str, float]]:
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    import raydist

    init_ray(num_cpus=workers + 2)  # Ray Data's read and split tasks need slots beside the workers'
    ray.data.DataContext.get_current().enable_progress_bars = False
    results: Dict[str, Dict[str, float]] = {}
    dataset = ray.data.read_parquet(os.path.join(folder, "files"))
    for _ in dataset.iter_batches(batch_size=None):  # untimed: start Ray Data's task workers, warm the file cache
        pass
    results["raydist get_dataset_shard"] = raydist.run(raydist_epoch, args=(batch_size,), num_workers=workers, datasets={"train": dataset})[
        0
    ]
    print("raydist:", results["raydist get_dataset_shard"], flush=True)
    out = os.path.join(folder, "ray_train.json")
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"batch_size": batch_size, "out": out},
        scaling_config=ray.train.ScalingConfig(num_workers=workers),
        datasets={"train": dataset},
    )
    trainer.fit()
    with open(out) as file:
        results["Ray Train get_dataset_shard"] = json.load(file)
    print("Ray Train:", results["Ray Train get_dataset_shard"], flush=True)
    ray.shutdown()
    results["DataLoader + DistributedSampler"] = run_loader(os.path.join(folder, "files"), workers, batch_size)
    return results


def report(results: Dict[str, Dict[str, float]], rows: int, workers: int, batch_size: int) -> None:
    base = results["raydist get_dataset_shard"]
    table = []
    for name, result in results.items():
        speed = result["rows"] / result["seconds"]
        steady = result["rows"] / max(1e-9, result["seconds"] - result["first"])
        table.append(
            [
                name,
                f"{speed:,.0f}",
                f"{steady:,.0f}",
                fmt_s(result["first"]),
                fmt_ratio(base["rows"] / base["seconds"], speed),
                fmt_ratio(base["first"], result["first"]),
            ]
        )
    print_table(
        f"One epoch of {rows:,} rows x {FEATURES} features, {workers} ranks, batch {batch_size} (rank 0)",
        ["reader", "rows/s", "after the first batch", "first batch", "raydist rows/s ratio", "raydist first-batch ratio"],
        table,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
