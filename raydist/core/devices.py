"""Accelerator kinds: availability, pinning a device, and the matching backend.

Every fact about a kind (its torch module, vendor extension, detection
order, default backend) comes from its row in ``raydist.core.accelerators``.
Vendor extensions (torch_npu, habana_frameworks) are imported lazily; a
missing extension means "not available", never a crash.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from types import ModuleType
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from raydist.core.accelerators import BY_DEVICE_TYPE, CPU, DETECT_ORDER, Accelerator


def _import_optional(name: str) -> Optional[ModuleType]:
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - ImportError, or a broken vendor install raising anything
        return None


def device_module(device_type: str) -> Optional[ModuleType]:
    """The ``torch.<device_type>`` module, importing its vendor extension first.

    Returns None when the kind is unknown to this torch or its extension is
    not installed.
    """
    row = BY_DEVICE_TYPE.get(device_type)
    if row is not None and row.extension and not hasattr(torch, device_type):
        _import_optional(row.extension)
    module = getattr(torch, device_type, None)
    return module if isinstance(module, ModuleType) else None


def _probe(row: Accelerator) -> Optional[ModuleType]:
    """The module whose ``is_available()`` tells whether ``row``'s kind is here."""
    if row.probe_module is None:
        return device_module(row.device_type)
    return _import_optional(row.probe_module)


def device_type_of(device: str | torch.device) -> str:
    """``"cuda:1"`` -> ``"cuda"``; works for kinds this torch does not know."""
    if isinstance(device, torch.device):
        return device.type
    return str(device).split(":", 1)[0]


def is_device_available(device: str | torch.device) -> Tuple[bool, bool]:
    """Return ``(is_available, is_known)`` for a device string such as ``"npu:0"``."""
    row = BY_DEVICE_TYPE.get(device_type_of(device))
    if row is None:
        return False, False
    if row is CPU:
        return True, True
    module = _probe(row)
    try:
        available = bool(module is not None and module.is_available())
    except Exception:  # noqa: BLE001 - a half-installed driver stack
        available = False
    return available, True


def device_count(device_type: str) -> int:
    """Number of visible devices of this kind (0 when unavailable; 1 for cpu/mps)."""
    row = BY_DEVICE_TYPE.get(device_type)
    if row is CPU:
        return 1
    available, known = is_device_available(device_type)
    if not (available and known):
        return 0
    if row is not None and not row.indexed:
        return 1
    module = device_module(device_type)
    try:
        return int(module.device_count()) if module is not None else 0
    except Exception:  # noqa: BLE001 - a half-installed driver stack counts no device
        return 0


def set_device(device: str | torch.device) -> None:
    """Make ``device`` the current device of its kind; a no-op for cpu and mps."""
    device = str(device)
    device_type = device_type_of(device)
    if not is_indexed(device_type):
        return
    module = device_module(device_type)
    if module is None or not hasattr(module, "set_device"):
        raise RuntimeError(f"cannot set device {device!r}: torch.{device_type} is not available")
    module.set_device(device)


def _has_backend(name: str) -> bool:
    # Backend.XCCL is declared on every torch >= 2.7, built with XCCL or not:
    # ask the build (dist.is_xccl_available) where this torch can tell.
    probe = getattr(dist, f"is_{name}_available", None)
    if callable(probe):
        return bool(probe())
    return hasattr(dist.Backend, name.upper()) or name in getattr(dist.Backend, "backend_list", [])


def default_backend(device_type: str) -> str:
    """The torch.distributed backend for a device kind on the installed torch.

    The accelerator table's backend (cuda->nccl, npu/hpu->hccl, xpu->xccl),
    except that xpu falls back to ccl where only oneCCL bindings exist, then
    gloo; everything else (cpu, mps, unknown) gets gloo.
    """
    row = BY_DEVICE_TYPE.get(device_type)
    if row is None:
        return "gloo"
    fallback = row.fallback
    if fallback is not None and not _has_backend(row.default_backend):
        if importlib.util.find_spec(fallback.module) is not None:
            return fallback.backend
        warnings.warn(f"no {row.default_backend} or {fallback.label} backend for {device_type} in this torch; using gloo")
        return "gloo"
    return row.default_backend


def accelerator_type() -> str:
    """The best device kind available in this process: an accelerator, else cpu."""
    for row in DETECT_ORDER:
        if is_device_available(row.device_type)[0]:
            return row.device_type
    return CPU.device_type


def is_indexed(device_type: str) -> bool:
    """Whether a process picks one of several devices of this kind (cuda:0,
    cuda:1); False for cpu and mps. Unknown kinds are taken to be indexed."""
    row = BY_DEVICE_TYPE.get(device_type)
    return row is None or row.indexed
