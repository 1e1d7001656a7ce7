"""The process group is bound to this process's accelerator (``device_id``).

torch's NCCL backend requires ``init_process_group(device_id=...)`` from
torch 2.15 on and starts its communicator eagerly with it. No GPU here: CUDA
is faked as available, and ``dist.init_process_group`` records what it got
and stops the initialization there (the one thing that cannot run).
"""

from __future__ import annotations

import sys
import types
from typing import Any, Dict, List

import pytest
import torch
import torch.distributed as dist

from raydist.core import initialize
from raydist.core.environment import DEVICE_INDEX_VAR


class Joined(Exception):
    """Raised by the recording init_process_group: nothing past it can run here."""


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> List[Dict[str, Any]]:
    calls: List[Dict[str, Any]] = []

    def record(**kwargs: Any) -> None:
        calls.append(kwargs)
        raise Joined

    monkeypatch.setattr(dist, "init_process_group", record)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    for name, value in {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(DEVICE_INDEX_VAR, raising=False)
    monkeypatch.setattr(initialize, "_context", None)
    return calls


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)


def test_nccl_gets_the_local_ranks_device(recorded: List[Dict[str, Any]], fake_cuda: None) -> None:
    with pytest.raises(Joined):
        initialize.init_distributed("cuda", backend="nccl")
    assert recorded[0]["backend"] == "nccl"
    assert recorded[0]["device_id"] == torch.device("cuda", 1)


def test_raydists_device_assignment_wins_over_the_local_rank(
    recorded: List[Dict[str, Any]], fake_cuda: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEVICE_INDEX_VAR, "0")
    with pytest.raises(Joined):
        initialize.init_distributed("cuda", backend="nccl")
    assert recorded[0]["device_id"] == torch.device("cuda", 0)


def test_gloo_on_an_accelerator_is_not_bound(recorded: List[Dict[str, Any]], fake_cuda: None) -> None:
    with pytest.raises(Joined):
        initialize.init_distributed("cuda", backend="gloo")
    assert "device_id" not in recorded[0]


def test_cpu_and_no_set_device_rank_are_not_bound(recorded: List[Dict[str, Any]], fake_cuda: None) -> None:
    with pytest.raises(Joined):
        initialize.init_distributed("cpu", backend="gloo")
    with pytest.raises(Joined):
        initialize.init_distributed("cuda", backend="nccl", no_set_device_rank=True)
    assert ["device_id" in call for call in recorded] == [False, False]


def test_a_kind_that_fell_back_to_cpu_is_not_bound(recorded: List[Dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="falling back to CPU"), pytest.raises(Joined):
        initialize.init_distributed("cuda")
    assert recorded[0]["backend"] == "gloo" and "device_id" not in recorded[0]


def test_a_kind_torch_cannot_name_is_pinned_but_not_bound(recorded: List[Dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.npu without torch_npu imported: torch.device("npu", 1) is not a name torch knows.
    module = types.ModuleType("torch.npu")
    module.is_available = lambda: True  # type: ignore[attr-defined]
    module.device_count = lambda: 2  # type: ignore[attr-defined]
    module.set_device = lambda device: None  # type: ignore[attr-defined]
    monkeypatch.setattr(torch, "npu", module, raising=False)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(Joined):
        initialize.init_distributed("npu", backend="hccl")
    assert recorded[0]["backend"] == "hccl" and "device_id" not in recorded[0]
