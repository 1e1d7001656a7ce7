"""One row per accelerator kind: what Ray calls it, how a process is told
which devices it may use, torch's name for it, and its usual backend.

devices, placement, layout and the CLI all read this table; a new kind is
one row. Ray-free, like the rest of the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Accelerator:
    """An accelerator kind as raydist, Ray and torch see it."""

    name: str  # what users type: --accelerator gpu, -n npu
    ray_resource: Optional[str]  # Ray's resource name; None for CPU-only workers
    visible_devices_var: Optional[str]  # the variable Ray sets per worker
    device_type: str  # torch's device type: torch.device("cuda:0")
    default_backend: str  # torch.distributed backend for this kind


ACCELERATORS: Tuple[Accelerator, ...] = (
    Accelerator("gpu", "GPU", "CUDA_VISIBLE_DEVICES", "cuda", "nccl"),
    # Intel GPUs share Ray's "GPU" resource, so "auto" never picks xpu: ask for it.
    Accelerator("xpu", "GPU", "ZE_AFFINITY_MASK", "xpu", "xccl"),
    Accelerator("npu", "NPU", "ASCEND_RT_VISIBLE_DEVICES", "npu", "hccl"),
    Accelerator("hpu", "HPU", "HABANA_VISIBLE_MODULES", "hpu", "hccl"),
    Accelerator("cpu", None, None, "cpu", "gloo"),
)

BY_NAME: Dict[str, Accelerator] = {a.name: a for a in ACCELERATORS}
BY_DEVICE_TYPE: Dict[str, Accelerator] = {a.device_type: a for a in ACCELERATORS}
CPU = BY_NAME["cpu"]
# What --accelerator / accelerator= accept: "auto" picks from the cluster.
ACCELERATOR_CHOICES: Tuple[str, ...] = ("auto",) + tuple(BY_NAME)
# Kinds "auto" considers, in order, when the cluster has their Ray resource.
AUTO_ORDER: Tuple[Accelerator, ...] = (BY_NAME["gpu"], BY_NAME["npu"], BY_NAME["hpu"])
# Ray resources that stand for devices (and need device assignment).
DEVICE_RESOURCES: Tuple[str, ...] = tuple(sorted({a.ray_resource for a in ACCELERATORS if a.ray_resource}))
# Variables Ray sets to say which devices a worker may use; raydist sets them node-wide.
VISIBLE_DEVICES_VARS: Tuple[str, ...] = tuple(a.visible_devices_var for a in ACCELERATORS if a.visible_devices_var)


def accelerator_named(name: str) -> Accelerator:
    """The row for ``name`` (case-insensitive); ValueError listing the kinds."""
    row = BY_NAME.get(name.lower()) if isinstance(name, str) else None
    if row is None:
        raise ValueError(f"unknown accelerator {name!r}; valid: {', '.join(ACCELERATOR_CHOICES)}")
    return row
