"""The accelerator table holds every fact about a kind; devices, config and
the CLI's help read the rows (no list of kinds written anywhere else)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from raydist.core import accelerators, devices
from raydist.core.accelerators import (
    ACCELERATOR_CHOICES,
    ACCELERATORS,
    AUTO_ORDER,
    BY_DEVICE_TYPE,
    BY_NAME,
    DETECT_ORDER,
    ROWS,
    Accelerator,
)


def test_the_table_keeps_todays_behaviour() -> None:
    assert ACCELERATOR_CHOICES == ("auto", "gpu", "xpu", "npu", "hpu", "cpu")
    assert [row.device_type for row in DETECT_ORDER] == ["cuda", "npu", "xpu", "hpu", "mps"]
    assert [row.name for row in AUTO_ORDER] == ["gpu", "npu", "hpu"]  # xpu shares "GPU": never auto
    assert {row.device_type: row.extension for row in ROWS if row.extension} == {
        "npu": "torch_npu",
        "hpu": "habana_frameworks.torch",
    }
    mps = BY_DEVICE_TYPE["mps"]
    assert mps.ray_resource is None and not mps.selectable and "mps" not in BY_NAME
    assert [row.device_type for row in ROWS if not row.indexed] == ["cpu", "mps"]
    assert not hasattr(accelerators, "accelerator_named")
    assert all(row.help for row in ACCELERATORS)


def test_help_is_written_from_the_rows() -> None:
    from raydist.cli import build_parser

    _, run = build_parser()
    helps = {option: action.help for action in run._actions for option in action.option_strings}
    accelerator_help = " ".join(helps["--accelerator"].split())
    assert "'auto' (GPU if the cluster has GPUs, else NPU, else HPU, else CPU)" in accelerator_help
    for row in ACCELERATORS:
        assert f"{row.name} ({row.help})" in accelerator_help
        assert repr(row.name) in helps["--nproc-per-node"]
    assert "mps" not in accelerator_help


def test_help_follows_a_new_row(monkeypatch: pytest.MonkeyPatch) -> None:
    tpu = Accelerator("tpu", "TPU", "TPU_VISIBLE_CHIPS", "xla", "xla", detect_order=1, auto=True, help="Google TPUs")
    rows = ACCELERATORS[:-1] + (tpu,) + ACCELERATORS[-1:]
    monkeypatch.setattr(accelerators, "ACCELERATORS", rows)
    monkeypatch.setattr(accelerators, "AUTO_ORDER", (BY_NAME["gpu"], tpu))
    assert accelerators.auto_help() == "GPU if the cluster has GPUs, else TPU, else CPU"
    assert "tpu (Google TPUs), cpu (no accelerator)" in accelerators.kinds_help()


EXTENSION = """
import types
import torch

fpu = types.ModuleType("torch.fpu")
fpu.is_available = lambda: True
fpu.device_count = lambda: 3
torch.fpu = fpu  # registers the kind, as torch_npu registers torch.npu
"""


@pytest.fixture
def fake_kind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Accelerator:
    """A kind torch lacks until its vendor extension is imported: one new row."""
    row = Accelerator("fpu", "FPU", "FPU_VISIBLE", "fpu", "fccl", extension="fake_fpu_ext", detect_order=-1)
    (tmp_path / "fake_fpu_ext.py").write_text(EXTENSION)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_fpu_ext", raising=False)  # removed again afterwards
    monkeypatch.setattr(torch, "fpu", None, raising=False)
    monkeypatch.delattr(torch, "fpu")  # undone after the test, whatever the extension added
    monkeypatch.setitem(devices.BY_DEVICE_TYPE, "fpu", row)
    monkeypatch.setattr(devices, "DETECT_ORDER", (row,) + DETECT_ORDER)
    return row


def test_devices_read_the_row(fake_kind: Accelerator) -> None:
    assert devices.is_device_available("fpu:0") == (True, True)  # the extension was imported
    assert devices.device_count("fpu") == 3
    assert devices.accelerator_type() == "fpu"  # first in the detection order
    assert devices.default_backend("fpu") == "fccl"
    assert devices.is_indexed("fpu")


def test_unknown_kind() -> None:
    assert devices.is_device_available("abc:0") == (False, False)
    assert devices.default_backend("abc") == "gloo"


def test_rows_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        BY_NAME["gpu"].auto = False  # type: ignore[misc]
