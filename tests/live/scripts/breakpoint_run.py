"""raydist.run from a Python script, with a breakpoint() on rank 1."""

import os

import ray
import torch.distributed as dist

import raydist


def stop_on_rank_one() -> str:
    if dist.get_rank() == 1:
        breakpoint()
    dist.barrier()
    return os.environ["RANK"]


if __name__ == "__main__":
    # A private Ray: never another one that happens to run on this machine.
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    print("results:", raydist.run(stop_on_rank_one, num_workers=2, resources_per_worker={"CPU": 0.5}), flush=True)
