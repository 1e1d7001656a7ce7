"""A torchrun-style script that stops rank 1 in pdb (and rank 0, with --both)."""

import os
import sys

import torch.distributed as dist

if not dist.is_initialized():
    dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 1 or "--both" in sys.argv:
    marker = f"stopped on rank {os.environ['RANK']}"
    breakpoint()
dist.barrier()
print(f"rank {rank} finished", flush=True)
