"""Prints what a rank sees: its process group and the resources Ray gave it."""

import json

import torch.distributed as dist

try:
    import ray

    assigned = ray.get_runtime_context().get_assigned_resources()
except Exception:  # noqa: BLE001 - outside Ray (under torchrun)
    assigned = {}
print(
    "WORLD "
    + json.dumps(
        {"initialized": dist.is_initialized(), "size": dist.get_world_size() if dist.is_initialized() else 0, "assigned": assigned}
    ),
    flush=True,
)
