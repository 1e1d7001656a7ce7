"""Train a small model with DDP on synthetic data through raydist.run (CPU is fine).

python examples/ddp_raydist.py --num-workers 2 --steps 50
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import raydist


def train(steps: int, batch_size: int, seed: int) -> float:
    info = raydist.get_context()  # torch.distributed is already initialised
    torch.manual_seed(seed)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(seed + info.rank)  # each rank its own shard
    true_weights = torch.arange(16, dtype=torch.float32) / 16
    loss = torch.tensor(0.0)
    for step in range(steps):
        x = torch.randn(batch_size, 16, generator=generator)
        y = (x @ true_weights).unsqueeze(1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if info.is_master() and step % max(1, steps // 5) == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    # Average the final loss over ranks so every rank returns the same number.
    final = loss.detach().clone()
    dist.all_reduce(final, op=dist.ReduceOp.SUM)
    return final.item() / info.world_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    losses = raydist.run(train, num_workers=args.num_workers, args=(args.steps, args.batch_size, args.seed))
    print(f"final loss per rank: {[round(loss, 4) for loss in losses]}")


if __name__ == "__main__":
    main()
