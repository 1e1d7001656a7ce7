"""One row per accelerator kind: every fact raydist knows about it.

What Ray calls it, how a process is told which devices it may use, torch's
name for it and the module (vendor extension) that provides it, how to ask
it whether it is there, its usual backend, where it stands when a process or
"auto" looks for the best kind, and a line of help. devices, placement,
layout, config and the CLI all read this table; a new kind is one row.
Ray-free and torch-free, like the rest of the core's tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class BackendFallback:
    """What a kind uses when this torch lacks its default backend."""

    backend: str  # torch.distributed backend name: "ccl"
    module: str  # the package that provides it: "oneccl_bindings_for_pytorch"
    label: str  # how a warning names it: "oneCCL"


@dataclass(frozen=True)
class Accelerator:
    """A device kind as raydist, Ray and torch see it."""

    name: str  # what users type: --accelerator gpu, -n npu
    ray_resource: Optional[str]  # Ray's resource name; None: Ray cannot place it
    visible_devices_var: Optional[str]  # the variable Ray sets per worker
    device_type: str  # torch's device type: torch.device("cuda:0")
    default_backend: str  # torch.distributed backend for this kind
    # Module imported before torch.<device_type> is looked up, for kinds torch
    # lacks natively (its vendor extension); None: torch has the kind itself.
    extension: Optional[str] = None
    # Module whose is_available() tells; None: torch.<device_type>.
    probe_module: Optional[str] = None
    # Where a process looks for its best kind (devices.accelerator_type), lower
    # first; None: never looked for (cpu is what remains).
    detect_order: Optional[int] = None
    # Whether accelerator="auto" may pick it when the cluster has its Ray resource
    # (in detect_order).
    auto: bool = False
    # Whether users may name it (accelerator=, --accelerator, -n KIND); a kind
    # without a Ray resource (mps) is still a torch device a process can use.
    selectable: bool = True
    # Devices are numbered (cuda:0, cuda:1): set_device pins one; False: one
    # device per process, nothing to pin (cpu, mps).
    indexed: bool = True
    fallback: Optional[BackendFallback] = None  # when this torch lacks default_backend
    help: str = ""  # a few words for --help: which devices these are


ROWS: Tuple[Accelerator, ...] = (
    Accelerator(
        "gpu",
        "GPU",
        "CUDA_VISIBLE_DEVICES",
        "cuda",
        "nccl",
        detect_order=0,
        auto=True,
        help="NVIDIA or AMD GPUs",
    ),
    # Intel GPUs share Ray's "GPU" resource, so "auto" never picks xpu: ask for it.
    Accelerator(
        "xpu",
        "GPU",
        "ZE_AFFINITY_MASK",
        "xpu",
        "xccl",
        detect_order=2,
        fallback=BackendFallback("ccl", "oneccl_bindings_for_pytorch", "oneCCL"),
        help="Intel GPUs; never picked by 'auto', as they share Ray's GPU resource",
    ),
    Accelerator(
        "npu",
        "NPU",
        "ASCEND_RT_VISIBLE_DEVICES",
        "npu",
        "hccl",
        extension="torch_npu",
        detect_order=1,
        auto=True,
        help="Huawei Ascend NPUs, with torch_npu",
    ),
    Accelerator(
        "hpu",
        "HPU",
        "HABANA_VISIBLE_MODULES",
        "hpu",
        "hccl",
        extension="habana_frameworks.torch",
        detect_order=3,
        auto=True,
        help="Intel Gaudi, with habana_frameworks",
    ),
    Accelerator("cpu", None, None, "cpu", "gloo", indexed=False, help="no accelerator"),
    # Apple's GPU: a torch device without a Ray resource (one per machine).
    Accelerator(
        "mps",
        None,
        None,
        "mps",
        "gloo",
        probe_module="torch.backends.mps",
        detect_order=4,
        selectable=False,
        indexed=False,
        help="Apple GPUs",
    ),
)

# The kinds users may ask for, in the order they are listed.
ACCELERATORS: Tuple[Accelerator, ...] = tuple(a for a in ROWS if a.selectable)
BY_NAME: Dict[str, Accelerator] = {a.name: a for a in ACCELERATORS}
BY_DEVICE_TYPE: Dict[str, Accelerator] = {a.device_type: a for a in ROWS}
CPU = BY_NAME["cpu"]
# What --accelerator / accelerator= accept: "auto" picks from the cluster.
ACCELERATOR_CHOICES: Tuple[str, ...] = ("auto",) + tuple(BY_NAME)
# Device kinds a process looks for, best first (cpu is what remains).
DETECT_ORDER: Tuple[Accelerator, ...] = tuple(
    sorted((a for a in ROWS if a.detect_order is not None), key=lambda a: a.detect_order)  # type: ignore[arg-type, return-value]
)
# Kinds "auto" considers, in order, when the cluster has their Ray resource.
AUTO_ORDER: Tuple[Accelerator, ...] = tuple(a for a in DETECT_ORDER if a.auto and a.ray_resource)
# Ray resources that stand for devices (and need device assignment).
DEVICE_RESOURCES: Tuple[str, ...] = tuple(sorted({a.ray_resource for a in ROWS if a.ray_resource}))
# Variables Ray sets to say which devices a worker may use; raydist sets them node-wide.
VISIBLE_DEVICES_VARS: Tuple[str, ...] = tuple(a.visible_devices_var for a in ROWS if a.visible_devices_var)


def auto_help() -> str:
    """What "auto" picks, in words: "GPU if the cluster has GPUs, else NPU, ..., else CPU"."""
    first, *rest = [a.ray_resource for a in AUTO_ORDER]
    steps = [f"{first} if the cluster has {first}s", *(f"else {name}" for name in rest), "else CPU"]
    return ", ".join(steps)


def kinds_help() -> str:
    """Each kind a user may name, with its help: "gpu (NVIDIA ...), xpu (...), ..."."""
    return ", ".join(f"{a.name} ({a.help})" if a.help else a.name for a in ACCELERATORS)
