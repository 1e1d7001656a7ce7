"""Fails the way the first argument says, on the ranks the second names
(default: all): ``raise`` raises ValueError, ``exit-N`` calls sys.exit(N),
``hang`` sleeps for ten minutes. Other ranks (and other modes) finish."""

import os
import sys
import time

import torch.distributed as dist

mode = sys.argv[1]
ranks = {int(r) for r in sys.argv[2].split(",")} if len(sys.argv) > 2 else None
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} started with argv {sys.argv[1:]}", flush=True)
if ranks is None or rank in ranks:
    if mode == "raise":
        raise ValueError(f"deliberate failure on rank {rank}")
    if mode.startswith("exit-"):
        sys.exit(int(mode[len("exit-") :]))
    if mode == "hang":
        time.sleep(600)
dist.barrier()  # the healthy ranks wait here for the failing one
print(f"rank {rank} finished in {os.getcwd()}", flush=True)
