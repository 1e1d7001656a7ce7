"""A plain torchrun DDP script (it does not import raydist): small model,
synthetic data sharded by rank, fixed seed. It runs unchanged under torchrun
and under ``raydist run``, and gives the same final loss under both:

    torchrun --standalone --nproc-per-node 2 examples/ddp_torchrun.py --steps 50
    raydist run -n 2 examples/ddp_torchrun.py --steps 50
"""

from __future__ import annotations

import argparse
import gc
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50, help="training steps")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="cpu (gloo), cuda (nccl, one GPU per process: LOCAL_RANK picks it) or auto (cuda when available; the default)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    # The launcher's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT do the rest.
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    print(f"rank {rank} of {world_size} (local rank {local_rank}) on {socket.gethostname()}", flush=True)

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(args.seed * 1000 + rank)  # this rank's shard of the data
    true_weights = torch.arange(16, dtype=torch.float32) / 16

    loss = torch.zeros((), device=device)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 16, generator=data)
        y = (x @ true_weights).unsqueeze(1) + 0.01 * torch.randn(args.batch_size, 1, generator=data)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over ranks
        optimizer.step()
        if rank == 0 and step % max(1, args.steps // 5) == 0:
            print(f"step {step}: loss {loss.item():.6f}", flush=True)

    final = loss.detach().clone()
    dist.all_reduce(final)  # the mean over ranks, the same number everywhere
    if rank == 0:
        print(f"final loss: {final.item() / world_size:.6f}", flush=True)
    # Free DDP before leaving the process group: a DDP model still alive at
    # interpreter exit can make torch abort ("terminate called ...").
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
