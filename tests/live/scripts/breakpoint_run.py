"""raydist.run from a Python script, with a breakpoint() on rank 1; argv[1]: the Ray to attach to."""

import os
import sys

import ray
import torch.distributed as dist

import raydist


def stop_on_rank_one() -> str:
    if dist.get_rank() == 1:
        breakpoint()
    dist.barrier()
    return os.environ["RANK"]


if __name__ == "__main__":
    ray.init(address=sys.argv[1])  # named: never another Ray that happens to run on the machine
    print("results:", raydist.run(stop_on_rank_one, num_workers=2, resources_per_worker={"CPU": 0.5}), flush=True)
