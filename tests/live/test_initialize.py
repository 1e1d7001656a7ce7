"""init_distributed / get_context / shutdown and the object collectives in one
process: world size 1, the errors of a multi-process job that never
initialised, and the horovod and device-pinning branches through fakes."""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import torch
import torch.distributed as dist

import raydist
from raydist.core import initialize
from raydist.core.devices import accelerator_type
from raydist.core.initialize import DistInfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from core_launch import clear_launcher_vars

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No launcher variables, no raydist record and no process group, before and after."""
    clear_launcher_vars(monkeypatch)
    raydist.shutdown()
    assert initialize._context is None and not dist.is_initialized()
    yield
    raydist.shutdown()
    assert initialize._context is None


@pytest.fixture
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# -- world size 1 ------------------------------------------------------------------


@pytest.mark.usefixtures("no_warnings")
def test_no_launcher_is_world_one_without_process_group() -> None:
    info = raydist.init_distributed(device="cpu")
    assert info == DistInfo(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        device="cpu",
        backend=None,
        distributed=False,
        horovod=False,
    )
    assert not dist.is_initialized()
    assert raydist.get_context() is info
    assert info.is_master() and info.is_master(local=True)
    assert info.torch_device == torch.device("cpu")


def test_default_device_is_the_best_available() -> None:
    assert raydist.init_distributed().device == accelerator_type()


@pytest.mark.usefixtures("no_warnings")
def test_torchrun_with_one_process_is_not_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    info = raydist.init_distributed(device="cpu")
    assert (info.world_size, info.distributed, info.backend) == (1, False, None)
    assert not dist.is_initialized()


def test_second_call_returns_the_same_record() -> None:
    first = raydist.init_distributed(device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # arguments of a later call are not even looked at
        second = raydist.init_distributed(device="no-such-device", backend="nccl")
    assert second is first
    assert initialize._context is first


def test_shutdown_is_harmless_without_setup() -> None:
    raydist.shutdown()
    raydist.shutdown()
    assert initialize._context is None and not dist.is_initialized()


def test_shutdown_forgets_the_record() -> None:
    first = raydist.init_distributed(device="cpu")
    raydist.shutdown()
    assert initialize._context is None
    second = raydist.init_distributed(device="cpu")
    assert second is not first and second == first


def test_get_context_without_init_in_world_one() -> None:
    assert raydist.get_context() == DistInfo()
    assert initialize._context is None  # asking does not initialise


def test_unknown_device_warns_and_is_tried() -> None:
    with pytest.warns(UserWarning, match="Device foo:1 was not known and checked for availability"):
        info = raydist.init_distributed(device="foo:1")
    assert info.device == "foo:1"  # kept: the user may know a kind raydist does not


def test_unavailable_cuda_warns_and_falls_back_to_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # "here", on any host
    with pytest.warns(UserWarning, match="Device cuda:0 was not available, falling back to CPU"):
        info = raydist.init_distributed(device="cuda:0")
    assert (info.device, info.backend, info.distributed) == ("cpu", None, False)


def test_unavailable_npu_without_torch_npu_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "npu", None, raising=False)
    monkeypatch.delattr(torch, "npu")
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.warns(UserWarning, match="Device npu was not available"):
        assert raydist.init_distributed(device="npu").device == "cpu"


# -- a multi-process job that never initialised -----------------------------------------


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "2", "RANK": "0"}, {"SLURM_NTASKS": "2", "SLURM_PROCID": "1"}])
def test_get_context_before_init_in_a_job_raises(monkeypatch: pytest.MonkeyPatch, env: Dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError, match=r"call raydist\.init_distributed\(\) first"):
        raydist.get_context()


COLLECTIVE_CALLS: Dict[str, Callable[[], Any]] = {
    "broadcast_object": lambda: raydist.broadcast_object({"a": 1}),
    "all_gather_object": lambda: raydist.all_gather_object(1),
    "gather_object": lambda: raydist.gather_object(1),
    "scatter_object": lambda: raydist.scatter_object([1, 2]),
    "barrier": lambda: raydist.barrier(),
}


@pytest.mark.parametrize("name", sorted(COLLECTIVE_CALLS))
def test_collective_before_init_in_a_job_raises(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"init_distributed\(\)"):
        COLLECTIVE_CALLS[name]()


@pytest.mark.parametrize("name", sorted(COLLECTIVE_CALLS))
def test_collective_after_group_destroyed_raises(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # A record of a 2-rank job whose process group is gone (destroyed behind raydist's back).
    monkeypatch.setattr(initialize, "_context", DistInfo(world_size=2, backend="gloo", distributed=True))
    with pytest.raises(RuntimeError, match=r"process group is not initialised: call raydist\.init_distributed"):
        COLLECTIVE_CALLS[name]()


# -- world-size-1 collectives --------------------------------------------------------------


@pytest.mark.parametrize("initialised", [False, True])
def test_world_one_collectives_need_no_process_group(initialised: bool) -> None:
    if initialised:
        raydist.init_distributed(device="cpu")
    obj = {"weights": [1.0, 2.0], "step": 3}
    assert raydist.broadcast_object(obj) is obj
    assert raydist.broadcast_object(obj, src=0) is obj
    assert raydist.all_gather_object(obj) == [obj]
    assert raydist.gather_object(obj) == [obj]
    assert raydist.gather_object(obj, dst=0) == [obj]
    assert raydist.scatter_object(["only"]) == "only"
    assert raydist.scatter_object(("only",), src=0) == "only"
    assert raydist.barrier() is None
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: raydist.broadcast_object("x", src=5), "src=5 is outside the world of size 1"),
        (lambda: raydist.broadcast_object("x", src=-1), "src=-1 is outside the world of size 1"),
        (lambda: raydist.broadcast_object("x", src=False), "src=False is outside"),  # a bool is not a rank 0
        (lambda: raydist.broadcast_object("x", src="0"), "src='0' is outside"),
        (lambda: raydist.gather_object("x", dst=1), "dst=1 is outside the world of size 1"),
        (lambda: raydist.scatter_object(["x"], src=2), "src=2 is outside the world of size 1"),
        (lambda: raydist.scatter_object(["x", "y"]), "scatter_object needs a sequence of 1 objects on rank 0"),
        (lambda: raydist.scatter_object(None), "scatter_object needs a sequence of 1 objects on rank 0"),
    ],
)
def test_world_one_bad_arguments(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


# -- an existing process group ------------------------------------------------------------


def test_existing_process_group_is_used_and_is_the_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    # The launcher says 2 ranks, but the script already made a 1-rank group itself.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.group.WORLD
    info = raydist.init_distributed(device="cpu")
    assert dist.group.WORLD is group  # not re-initialised
    assert (info.rank, info.world_size, info.local_rank) == (0, 1, 1)
    assert (info.backend, info.distributed) == ("gloo", True)
    assert raydist.all_gather_object("me") == ["me"]
    raydist.shutdown()
    assert not dist.is_initialized()


# -- horovod ---------------------------------------------------------------------------


def _horovod_installed() -> bool:
    try:
        importlib.import_module("horovod.torch")
    except ImportError:
        return False
    return True


def test_horovod_missing_says_how_to_install() -> None:
    if _horovod_installed():
        pytest.skip("horovod is installed here")
    with pytest.raises(ImportError, match="scripts/install-horovod.sh"):
        raydist.init_distributed(device="cpu", horovod=True)
    assert initialize._context is None  # a failed init leaves nothing behind


def test_horovod_hidden_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runs where horovod is installed too: None in sys.modules makes the import fail.
    monkeypatch.setitem(sys.modules, "horovod", None)
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    with pytest.raises(ImportError, match="scripts/install-horovod.sh"):
        raydist.init_distributed(device="cpu", horovod=True)
    assert initialize._context is None


class FakeHorovod(types.ModuleType):
    """``horovod.torch`` for rank ``rank`` of a job; records every call."""

    def __init__(self, rank: int, local_rank: int, size: int, local_size: int, cross_rank: int) -> None:
        super().__init__("horovod.torch")
        self.layout = dict(rank=rank, local_rank=local_rank, size=size, local_size=local_size, cross_rank=cross_rank)
        self.calls: List[tuple] = []
        self.broadcast_result: Any = None  # what the root "sent"

    def init(self) -> None:
        self.calls.append(("init",))

    def rank(self) -> int:
        return self.layout["rank"]

    def local_rank(self) -> int:
        return self.layout["local_rank"]

    def size(self) -> int:
        return self.layout["size"]

    def local_size(self) -> int:
        return self.layout["local_size"]

    def cross_rank(self) -> int:
        return self.layout["cross_rank"]

    # raydist must name horovod collectives: horovod's default name is the
    # object's type, which differs between the root and the receivers.
    def broadcast_object(self, obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
        assert name, "horovod collectives need a rank-independent name"
        self.calls.append(("broadcast_object", obj, root_rank))
        return obj if root_rank == self.layout["rank"] else self.broadcast_result

    def allgather_object(self, obj: Any, name: Optional[str] = None) -> List[Any]:
        assert name, "horovod collectives need a rank-independent name"
        self.calls.append(("allgather_object", obj))
        return [obj if r == self.layout["rank"] else f"peer{r}" for r in range(self.layout["size"])]

    def barrier(self) -> None:
        self.calls.append(("barrier",))

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))


@pytest.fixture
def fake_horovod(monkeypatch: pytest.MonkeyPatch) -> FakeHorovod:
    hvd = FakeHorovod(rank=1, local_rank=1, size=4, local_size=2, cross_rank=0)
    package = types.ModuleType("horovod")
    package.torch = hvd  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "horovod", package)
    monkeypatch.setitem(sys.modules, "horovod.torch", hvd)
    return hvd


def test_horovod_record_and_collectives(fake_horovod: FakeHorovod) -> None:
    info = raydist.init_distributed(device="cpu", horovod=True)
    assert info == DistInfo(
        rank=1,
        local_rank=1,
        world_size=4,
        local_world_size=2,
        node_rank=0,
        device="cpu",
        backend="horovod",
        distributed=True,
        horovod=True,
    )
    assert not dist.is_initialized()  # horovod, not torch.distributed

    fake_horovod.broadcast_result = {"from": 0}
    assert raydist.broadcast_object("mine", src=0) == {"from": 0}
    assert raydist.broadcast_object("mine", src=1) == "mine"
    assert raydist.all_gather_object("me") == ["peer0", "me", "peer2", "peer3"]
    # gather and scatter run on horovod's alltoall: tests/live/test_backends.py runs them on real horovod.
    raydist.barrier()
    with pytest.raises(ValueError, match="src=4 is outside the world of size 4"):
        raydist.broadcast_object("x", src=4)

    raydist.shutdown()
    names = [call[0] for call in fake_horovod.calls]
    assert names[0] == "init" and names[-1] == "shutdown"
    assert ("broadcast_object", None, 0) in fake_horovod.calls  # non-root sends nothing
    assert names.count("barrier") == 1


# -- device pinning in distributed mode (through fake horovod and a fake npu) ---------------------


def _fake_npu(monkeypatch: pytest.MonkeyPatch) -> List[Any]:
    calls: List[Any] = []
    npu = types.ModuleType("torch.npu")
    npu.is_available = lambda: True  # type: ignore[attr-defined]
    npu.set_device = calls.append  # type: ignore[attr-defined]
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    return calls


@pytest.mark.usefixtures("fake_horovod")
def test_distributed_device_is_pinned_to_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_npu(monkeypatch)
    with pytest.warns(UserWarning, match="device index removed from npu:3: using this process's device 1"):
        info = raydist.init_distributed(device="npu:3", horovod=True)
    assert info.device == "npu:1" and calls == ["npu:1"] and info.device_index == 1


@pytest.mark.usefixtures("fake_horovod", "no_warnings")
def test_raydist_device_index_wins_over_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker holding two devices per rank: rank 1's first device is 2, not 1.
    calls = _fake_npu(monkeypatch)
    monkeypatch.setenv("RAYDIST_DEVICE_INDEX", "2")
    info = raydist.init_distributed(device="npu", horovod=True)
    assert (info.device, info.device_index, info.local_rank) == ("npu:2", 2, 1)
    assert calls == ["npu:2"]


@pytest.mark.usefixtures("fake_horovod")
def test_device_index_is_kept_when_the_device_falls_back_to_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # Fake GPUs (Ray counted them, torch has no CUDA): the assignment is still reported.
    monkeypatch.setenv("RAYDIST_DEVICE_INDEX", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="falling back to CPU"):
        info = raydist.init_distributed(device="cuda", horovod=True)
    assert (info.device, info.device_index) == ("cpu", 3)


@pytest.mark.usefixtures("fake_horovod", "no_warnings")
def test_no_set_device_rank_keeps_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_npu(monkeypatch)
    info = raydist.init_distributed(device="npu:3", horovod=True, no_set_device_rank=True)
    assert info.device == "npu:3" and calls == []


@pytest.mark.usefixtures("fake_horovod", "no_warnings")
def test_distributed_kind_without_index_gets_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_npu(monkeypatch)
    assert raydist.init_distributed(device="npu", horovod=True).device == "npu:1"
    assert calls == ["npu:1"]


@pytest.mark.usefixtures("fake_horovod", "no_warnings")
def test_distributed_cpu_is_not_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: List[Optional[str]] = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    assert raydist.init_distributed(device="cpu", horovod=True).device == "cpu"
    assert calls == []
