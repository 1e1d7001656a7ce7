"""Device kinds, availability, pinning and the default backend, branch by branch.

Vendor modules are faked: a ``torch.npu`` module object injected into torch,
and ``sys.modules[name] = None`` where an extension must look uninstalled.
"""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import pytest
import torch
import torch.distributed as dist

from raydist.core import devices

pytestmark = pytest.mark.timeout(120)


def fake_device_module(name: str, available: bool = True, count: int = 2, calls: Optional[List[Any]] = None) -> types.ModuleType:
    """A stand-in for ``torch.npu`` / ``torch.hpu`` that records set_device calls."""
    module = types.ModuleType(f"torch.{name}")
    module.is_available = lambda: available  # type: ignore[attr-defined]
    module.device_count = lambda: count  # type: ignore[attr-defined]
    module.set_device = (calls if calls is not None else []).append  # type: ignore[attr-defined]
    return module


def _hide(monkeypatch: pytest.MonkeyPatch, kind: str, extension: str) -> None:
    """Make ``torch.<kind>`` absent and its extension uninstalled, undone after the test."""
    # setattr-then-delattr registers an undo that also removes an attribute the
    # code under test might add (an extension sets torch.<kind> when imported).
    monkeypatch.setattr(torch, kind, None, raising=False)
    monkeypatch.delattr(torch, kind)
    monkeypatch.setitem(sys.modules, extension, None)  # None in sys.modules: import raises ImportError


@pytest.fixture
def no_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "npu", "torch_npu")


@pytest.fixture
def no_hpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "hpu", "habana_frameworks.torch")
    monkeypatch.setitem(sys.modules, "habana_frameworks", None)


@pytest.fixture
def nothing_available(monkeypatch: pytest.MonkeyPatch, no_npu: None, no_hpu: None) -> None:
    """A CPU-only machine, whatever this one has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.fixture
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# -- device_type_of --------------------------------------------------------------


@pytest.mark.parametrize(
    "device,kind",
    [("cuda:1", "cuda"), ("npu", "npu"), ("cpu", "cpu"), (torch.device("cpu"), "cpu"), ("tpu:7", "tpu")],
)
def test_device_type_of(device: Any, kind: str) -> None:
    assert devices.device_type_of(device) == kind


# -- is_device_available ---------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cpu:0", torch.device("cpu")])
def test_cpu_is_always_available(device: Any) -> None:
    assert devices.is_device_available(device) == (True, True)


@pytest.mark.parametrize("available", [True, False])
def test_mps_follows_torch_backends(monkeypatch: pytest.MonkeyPatch, available: bool) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: available)
    assert devices.is_device_available("mps") == (available, True)


def test_mps_without_backend_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.backends, "mps")
    assert devices.is_device_available("mps") == (False, True)


@pytest.mark.parametrize("available", [True, False])
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_follows_torch_cuda(monkeypatch: pytest.MonkeyPatch, device: str, available: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    assert devices.is_device_available(device) == (available, True)


def test_broken_driver_counts_as_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> bool:
        raise RuntimeError("driver/library version mismatch")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    assert devices.is_device_available("cuda") == (False, True)


@pytest.mark.usefixtures("no_npu")
@pytest.mark.parametrize("device", ["npu", "npu:0"])
def test_npu_without_torch_npu_is_known_but_unavailable(device: str) -> None:
    assert devices.is_device_available(device) == (False, True)
    assert devices.device_module("npu") is None


@pytest.mark.usefixtures("no_npu")
@pytest.mark.parametrize("available", [True, False])
def test_npu_with_fake_module(monkeypatch: pytest.MonkeyPatch, available: bool) -> None:
    monkeypatch.setattr(torch, "npu", fake_device_module("npu", available=available), raising=False)
    assert devices.is_device_available("npu:1") == (available, True)


@pytest.mark.usefixtures("no_npu")
def test_npu_extension_is_imported_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A stand-in torch_npu that registers torch.npu on import, as the real one does.
    package = tmp_path / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import types, torch\nnpu = types.ModuleType('torch.npu')\nnpu.is_available = lambda: True\ntorch.npu = npu\n"
    )
    monkeypatch.delitem(sys.modules, "torch_npu")  # uninstall the fixture's blocker; restored after
    monkeypatch.syspath_prepend(str(tmp_path))
    assert devices.is_device_available("npu") == (True, True)
    assert devices.device_module("npu") is torch.npu  # type: ignore[attr-defined]


@pytest.mark.usefixtures("no_npu")
def test_broken_vendor_extension_does_not_crash(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    package = tmp_path / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('CANN toolkit not found')\n")
    monkeypatch.delitem(sys.modules, "torch_npu")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert devices.is_device_available("npu") == (False, True)


@pytest.mark.usefixtures("no_hpu")
def test_hpu_with_and_without_fake_module(monkeypatch: pytest.MonkeyPatch) -> None:
    assert devices.is_device_available("hpu") == (False, True)
    monkeypatch.setattr(torch, "hpu", fake_device_module("hpu"), raising=False)
    assert devices.is_device_available("hpu") == (True, True)


@pytest.mark.parametrize("available", [True, False])
def test_xpu_follows_torch_xpu(monkeypatch: pytest.MonkeyPatch, available: bool) -> None:
    monkeypatch.setattr(torch.xpu, "is_available", lambda: available)
    assert devices.is_device_available("xpu") == (available, True)


def test_non_module_attribute_is_not_a_device(monkeypatch: pytest.MonkeyPatch, no_npu: None) -> None:
    # Something else called torch.npu (not a module) must not be mistaken for the backend.
    monkeypatch.setattr(torch, "npu", object(), raising=False)
    assert devices.is_device_available("npu") == (False, True)


@pytest.mark.parametrize("device", ["tpu", "foo:3", "ipu"])
def test_unknown_kind(device: str) -> None:
    assert devices.is_device_available(device) == (False, False)


# -- set_device ------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cpu:0", "mps", "mps:0"])
def test_set_device_cpu_and_mps_are_no_ops(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    calls: List[Any] = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    assert devices.set_device(device) is None
    assert calls == []


@pytest.mark.usefixtures("no_npu")
def test_set_device_npu_calls_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: List[Any] = []
    monkeypatch.setattr(torch, "npu", fake_device_module("npu", calls=calls), raising=False)
    devices.set_device("npu:3")
    devices.set_device(torch.device("cpu"))  # no-op, does not reach torch.npu
    assert calls == ["npu:3"]


def test_set_device_cuda_calls_torch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: List[Any] = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    devices.set_device("cuda:1")
    assert calls == ["cuda:1"]


@pytest.mark.usefixtures("no_npu")
def test_set_device_without_module_raises() -> None:
    with pytest.raises(RuntimeError, match=r"cannot set device 'npu:0': torch\.npu is not available"):
        devices.set_device("npu:0")


@pytest.mark.usefixtures("no_npu")
def test_set_device_module_without_set_device_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("torch.npu")
    monkeypatch.setattr(torch, "npu", module, raising=False)
    with pytest.raises(RuntimeError, match="npu:1"):
        devices.set_device("npu:1")


def test_set_device_unknown_kind_raises() -> None:
    with pytest.raises(RuntimeError, match="tpu"):
        devices.set_device("tpu:0")


# -- default_backend ---------------------------------------------------------------


@pytest.mark.usefixtures("no_warnings")
@pytest.mark.parametrize(
    "kind,backend",
    [("cuda", "nccl"), ("npu", "hccl"), ("hpu", "hccl"), ("mps", "gloo"), ("cpu", "gloo"), ("tpu", "gloo")],
)
def test_default_backend(kind: str, backend: str) -> None:
    assert devices.default_backend(kind) == backend


class _BackendWithXccl:
    XCCL = "xccl"
    backend_list = ["gloo", "nccl", "xccl"]


class _BackendWithoutXccl:
    backend_list = ["gloo", "nccl"]


def _find_spec_with(present: Optional[str]) -> Callable[..., Any]:
    real = importlib.util.find_spec

    def find_spec(name: str, package: Optional[str] = None) -> Any:
        if name == "oneccl_bindings_for_pytorch":
            return object() if present == name else None
        return real(name, package)

    return find_spec


@pytest.mark.usefixtures("no_warnings")
def test_xpu_uses_xccl_when_torch_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "Backend", _BackendWithXccl)
    monkeypatch.setattr(dist, "is_xccl_available", lambda: True, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", _find_spec_with("oneccl_bindings_for_pytorch"))
    assert devices.default_backend("xpu") == "xccl"  # preferred over oneCCL bindings


@pytest.mark.usefixtures("no_warnings")
def test_xpu_uses_xccl_on_torch_without_availability_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    # Older torch: no dist.is_xccl_available, so the Backend enum decides.
    monkeypatch.delattr(dist, "is_xccl_available", raising=False)
    monkeypatch.setattr(dist, "Backend", _BackendWithXccl)
    assert devices.default_backend("xpu") == "xccl"


@pytest.mark.usefixtures("no_warnings")
def test_xpu_declared_but_unbuilt_xccl_falls_to_ccl(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch >= 2.7 declares Backend.XCCL even when built without it.
    monkeypatch.setattr(dist, "Backend", _BackendWithXccl)
    monkeypatch.setattr(dist, "is_xccl_available", lambda: False, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", _find_spec_with("oneccl_bindings_for_pytorch"))
    assert devices.default_backend("xpu") == "ccl"


@pytest.mark.usefixtures("no_warnings")
def test_xpu_uses_ccl_with_oneccl_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(dist, "is_xccl_available", raising=False)
    monkeypatch.setattr(dist, "Backend", _BackendWithoutXccl)
    monkeypatch.setattr(importlib.util, "find_spec", _find_spec_with("oneccl_bindings_for_pytorch"))
    assert devices.default_backend("xpu") == "ccl"


def test_xpu_without_any_ccl_warns_and_uses_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(dist, "is_xccl_available", raising=False)
    monkeypatch.setattr(dist, "Backend", _BackendWithoutXccl)
    monkeypatch.setattr(importlib.util, "find_spec", _find_spec_with(None))
    with pytest.warns(UserWarning, match="no xccl or oneCCL backend"):
        assert devices.default_backend("xpu") == "gloo"


def test_xpu_backend_matches_this_build() -> None:
    # The answer must be a backend this torch can actually run (no probe: nothing to compare).
    probe = getattr(dist, "is_xccl_available", None)
    if probe is None:
        pytest.skip("this torch cannot tell whether it was built with xccl")
    if probe():
        expected = "xccl"
    else:
        expected = "ccl" if importlib.util.find_spec("oneccl_bindings_for_pytorch") else "gloo"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert devices.default_backend("xpu") == expected


# -- device_count / accelerator_type -------------------------------------------------


def test_device_count_cpu_is_one() -> None:
    assert devices.device_count("cpu") == 1


@pytest.mark.usefixtures("nothing_available")
@pytest.mark.parametrize("kind", ["cuda", "npu", "hpu", "xpu", "mps", "tpu"])
def test_device_count_unavailable_is_zero(kind: str) -> None:
    assert devices.device_count(kind) == 0


@pytest.mark.usefixtures("nothing_available")
def test_device_count_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch, "npu", fake_device_module("npu", count=4), raising=False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert (devices.device_count("cuda"), devices.device_count("npu"), devices.device_count("mps")) == (8, 4, 1)


@pytest.mark.usefixtures("nothing_available")
def test_device_count_broken_module_is_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_device_module("npu")

    def broken() -> int:
        raise RuntimeError("device lost")

    module.device_count = broken  # type: ignore[attr-defined]
    monkeypatch.setattr(torch, "npu", module, raising=False)
    assert devices.device_count("npu") == 0


def test_accelerator_type_here() -> None:
    if torch.cuda.is_available() or torch.xpu.is_available() or torch.backends.mps.is_available():
        pytest.skip("this host has an accelerator")
    assert devices.accelerator_type() == "cpu"


@pytest.mark.usefixtures("nothing_available")
def test_accelerator_type_cpu_only() -> None:
    assert devices.accelerator_type() == "cpu"


@pytest.mark.usefixtures("nothing_available")
def test_accelerator_type_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert devices.accelerator_type() == "mps"
    monkeypatch.setattr(torch, "npu", fake_device_module("npu"), raising=False)
    assert devices.accelerator_type() == "npu"  # an accelerator before mps
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices.accelerator_type() == "cuda"  # cuda first
