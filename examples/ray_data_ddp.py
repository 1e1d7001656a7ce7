"""DDP over a Ray Data dataset: each rank reads its shard (``datasets=`` and
``raydist.get_dataset_shard``), with a local shuffle buffer, and every rank
runs the same number of steps in every epoch (CPU is fine).

    pip install 'raydist[data]'
    python examples/ray_data_ddp.py --num-workers 2 --epochs 2
"""

from __future__ import annotations

import argparse
from typing import Dict, List

import numpy as np
import ray
import torch
from torch.nn.parallel import DistributedDataParallel

import raydist

FEATURES = 16


def add_target(batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Preprocessing in Ray Data's tasks: features and a linear target from the row id."""
    rng = np.random.default_rng(batch["id"])
    x = rng.standard_normal((len(batch["id"]), FEATURES)).astype(np.float32)
    return {"x": x, "y": (x @ (np.arange(FEATURES, dtype=np.float32) / FEATURES))[:, None]}


def train(epochs: int, batch_size: int) -> List[int]:
    info = raydist.get_context()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    shard = raydist.get_dataset_shard("train")
    steps = []
    for epoch in range(epochs):
        count = 0
        # Batches of exactly batch_size rows: the same count on every rank, so DDP's
        # all_reduce in backward() never waits for a rank that has already finished.
        for batch in shard.iter_torch_batches(batch_size=batch_size, local_shuffle_buffer_size=4 * batch_size, drop_last=True):
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            count += 1
        if info.is_master():
            print(f"epoch {epoch}: {count} steps, loss {loss.item():.4f}", flush=True)
        steps.append(count)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--address", default="local", help="the Ray cluster (default: a new local Ray; 'auto': the running one)")
    args = parser.parse_args()
    # Ray Data would otherwise join whichever Ray last ran on this machine when the dataset is built.
    # Its tasks need CPU slots beside the workers' (else they wait for them forever): two more here.
    extra = {"num_cpus": args.num_workers + 2} if args.address == "local" else {}
    ray.init(address=args.address, include_dashboard=False, **extra)
    ray.data.DataContext.get_current().enable_progress_bars = False
    dataset = ray.data.range(args.rows, override_num_blocks=7).map_batches(add_target)
    steps = raydist.run(train, num_workers=args.num_workers, args=(args.epochs, args.batch_size), datasets={"train": dataset})
    print(f"steps per epoch, by rank: {steps}")


if __name__ == "__main__":
    main()
