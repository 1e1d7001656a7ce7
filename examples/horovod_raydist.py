"""Train a small model with hvd.DistributedOptimizer through raydist (CPU is fine).

bash scripts/install-horovod.sh .venv/bin/python   # once: builds horovod for this torch
python examples/horovod_raydist.py --num-workers 2 --steps 50
"""

from __future__ import annotations

import argparse

import horovod.torch as hvd
import torch

import raydist


def train(steps: int, seed: int) -> float:
    # raydist already ran hvd.init() with the rendezvous of this worker group.
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size()),
        named_parameters=model.named_parameters(),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    generator = torch.Generator().manual_seed(seed + hvd.rank())
    true_weights = torch.linspace(-1, 1, 8)
    loss = torch.tensor(0.0)
    for step in range(steps):
        x = torch.randn(32, 8, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), (x @ true_weights).unsqueeze(1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if hvd.rank() == 0 and step % max(1, steps // 5) == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    return hvd.allreduce(loss.detach(), op=hvd.Average).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    losses = raydist.run(train, num_workers=args.num_workers, backend="horovod", args=(args.steps, args.seed))
    print(f"final loss (averaged over ranks): {losses[0]:.4f}")


if __name__ == "__main__":
    main()
