"""The core without Ray: run under torchrun (or SLURM, horovodrun).

python -m torch.distributed.run --standalone --nproc-per-node 2 examples/core_demo.py
"""

import sys

import raydist


def main() -> None:
    info = raydist.init_distributed(device="cpu")
    config = raydist.broadcast_object({"lr": 0.1, "chosen_by": info.rank} if info.is_master() else None)
    ranks = raydist.all_gather_object(info.rank)
    gathered = raydist.gather_object(f"hello from {info.rank}", dst=0)
    mine = raydist.scatter_object([f"work item {r}" for r in range(info.world_size)] if info.is_master() else None)
    line = (
        f"rank {info.rank}/{info.world_size} (local {info.local_rank}, backend {info.backend}): "
        f"config={config} all_gather={ranks} scatter={mine!r}" + (f" gather={gathered}" if gathered is not None else "")
    )
    sys.stdout.write(line + "\n")  # one write, so ranks' lines do not interleave
    sys.stdout.flush()
    raydist.shutdown()


if __name__ == "__main__":
    main()
