"""A torchrun script that trains DDP a few steps and ends as most do: it
destroys its process group, leaving the model to be freed with its namespace.
``STORE_URL`` (a ``file://`` store) lets one process run it many times."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo", init_method=os.environ.get("STORE_URL", "env://"))
model = DistributedDataParallel(torch.nn.Linear(64, 64))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):
    model(torch.randn(8, 64)).sum().backward()
    optimizer.step()
dist.destroy_process_group()
