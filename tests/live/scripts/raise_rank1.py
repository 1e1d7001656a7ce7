"""A torchrun-style script whose rank 1 raises (for --post-mortem)."""

import os  # noqa: F401 - read at the pdb prompt

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    table = {"rows": 3}
    print(table["columns"])
dist.barrier()
