"""raydist.compat keeps open_clip's distributed helpers: the same
names and signatures, driven through an argparse.Namespace as open_clip's main does."""

from __future__ import annotations

import argparse
import inspect
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import torch

import raydist
from raydist import compat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from compat_worker import CLI_ARGS, build_parser
from core_launch import clear_launcher_vars, load_results, run_torchrun

pytestmark = pytest.mark.timeout(120)

REQUIRED = object()  # marks a parameter without default

# open_clip's public distributed helpers and their parameters (name, default).
SEED_SIGNATURES: Dict[str, List[Tuple[str, Any]]] = {
    "is_global_master": [("args", REQUIRED)],
    "is_local_master": [("args", REQUIRED)],
    "is_master": [("args", REQUIRED), ("local", False)],
    "is_device_available": [("device", REQUIRED)],
    "set_device": [("device", REQUIRED)],
    "is_using_horovod": [],
    "is_using_distributed": [],
    "world_info_from_env": [],
    "init_distributed_device": [("args", REQUIRED)],
    "init_distributed_device_so": [
        ("device", "cuda"),
        ("dist_backend", None),
        ("dist_url", None),
        ("horovod", False),
        ("no_set_device_rank", False),
    ],
    "broadcast_object": [("args", REQUIRED), ("obj", REQUIRED), ("src", 0)],
    "all_gather_object": [("args", REQUIRED), ("obj", REQUIRED), ("dst", 0)],
}


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No launcher variables and no raydist state, before and after."""
    clear_launcher_vars(monkeypatch)
    raydist.shutdown()
    yield
    raydist.shutdown()


# -- names and signatures ---------------------------------------------------


@pytest.mark.parametrize("name", sorted(SEED_SIGNATURES))
def test_compat_has_seed_function_with_compatible_signature(name: str) -> None:
    assert name in compat.__all__
    function = getattr(compat, name)
    assert callable(function)
    params = list(inspect.signature(function).parameters.values())
    seed_params = SEED_SIGNATURES[name]
    # Every seed call still binds: same positions, same names, same defaults.
    assert len(params) >= len(seed_params), f"{name} lost parameters"
    for param, (seed_name, seed_default) in zip(params, seed_params):
        assert param.name == seed_name
        assert param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        if seed_default is not REQUIRED:
            assert param.default == seed_default, f"{name}({seed_name}=...) default changed"
    # Additions are fine only when a seed-style call need not pass them.
    for extra in params[len(seed_params) :]:
        assert extra.default is not inspect.Parameter.empty or extra.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ), f"{name} added a required parameter {extra.name}"


# -- single process ------------------------------------------------------------


@pytest.mark.usefixtures("clean")
def test_single_process_through_namespace() -> None:
    args = build_parser().parse_args(CLI_ARGS)
    device = compat.init_distributed_device(args)
    assert device == torch.device("cpu")
    assert (args.device, args.rank, args.world_size, args.local_rank, args.distributed) == ("cpu", 0, 1, 0, False)
    assert compat.is_master(args) and compat.is_master(args, local=True)
    assert compat.is_global_master(args) and compat.is_local_master(args)
    obj = {"epoch": 1, "tensor": [1.0, 2.0]}
    assert compat.broadcast_object(args, obj) is obj
    assert compat.all_gather_object(args, obj) == [obj]
    assert compat.all_gather_object(args, 7, dst=0) == [7]
    assert not torch.distributed.is_initialized()


@pytest.mark.usefixtures("clean")
def test_init_distributed_device_so_returns_the_seed_dict() -> None:
    result = compat.init_distributed_device_so(device="cpu")
    assert result == dict(device="cpu", global_rank=0, local_rank=0, world_size=1, distributed=False)


@pytest.mark.usefixtures("clean")
def test_namespace_without_attributes_defaults_to_cuda_then_falls_back() -> None:
    if torch.cuda.is_available():
        pytest.skip("cuda is available: no fallback to observe")
    args = argparse.Namespace()  # the seed reads every option with getattr(..., default)
    with pytest.warns(UserWarning, match="not available, falling back to CPU"):
        device = compat.init_distributed_device(args)
    assert device == torch.device("cpu")
    assert (args.device, args.rank, args.world_size, args.local_rank, args.distributed) == ("cpu", 0, 1, 0, False)


def test_namespace_gets_every_field_of_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    # A layout where rank, local rank and world size all differ, without launching it.
    record = raydist.DistInfo(
        rank=5, local_rank=1, world_size=8, local_world_size=4, node_rank=1, device="cpu", backend="gloo", distributed=True
    )
    seen: Dict[str, Any] = {}

    def fake_init(**kwargs: Any) -> raydist.DistInfo:
        seen.update(kwargs)
        return record

    monkeypatch.setattr(compat, "init_distributed", fake_init)
    args = build_parser().parse_args(["--device", "cpu", "--dist-backend", "gloo", "--no-set-device-rank"])
    assert compat.init_distributed_device(args) == torch.device("cpu")
    assert (args.device, args.rank, args.world_size, args.local_rank, args.distributed) == ("cpu", 5, 8, 1, True)
    assert seen == dict(device="cpu", backend="gloo", dist_url=None, horovod=False, no_set_device_rank=True)
    assert not compat.is_master(args) and not compat.is_master(args, local=True)


def test_rank_checks_read_the_namespace() -> None:
    worker = argparse.Namespace(rank=5, local_rank=0)
    assert not compat.is_global_master(worker) and compat.is_local_master(worker)
    assert not compat.is_master(worker) and compat.is_master(worker, local=True)
    other = argparse.Namespace(rank=0, local_rank=2)
    assert compat.is_master(other) and not compat.is_master(other, local=True)


@pytest.mark.usefixtures("clean")
def test_environment_helpers_read_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    assert compat.world_info_from_env() == (0, 0, 1)
    assert not compat.is_using_distributed() and not compat.is_using_horovod()
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert compat.world_info_from_env() == (1, 3, 4)  # (local, global, world), the seed's order
    assert compat.is_using_distributed()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert compat.is_using_horovod()


def test_device_helpers() -> None:
    assert compat.is_device_available("cpu") == (True, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.set_device("cpu") is None  # a no-op, as in the seed


# -- two ranks under torchrun ----------------------------------------------------


def test_torchrun_two_ranks_through_namespace(tmp_path: Path) -> None:
    world = 2
    run_torchrun("compat_worker.py", world, tmp_path)
    results = load_results(tmp_path, world)
    for rank, result in enumerate(results):
        assert result["returned_device"] == "cpu" and result["returned_is_torch_device"]
        assert result["args"] == dict(device="cpu", rank=rank, world_size=world, local_rank=rank, distributed=True)
        assert result["is_master"] is (rank == 0)
        assert result["is_global_master"] is (rank == 0)
        assert result["is_local_master"] is (rank == 0)  # one node: local rank == rank
        assert result["is_using_distributed"] is True
        assert result["world_info_from_env"] == [rank, rank, world]
        assert result["backend"] == "gloo"
        assert result["broadcast"] == {"epoch": 3, "from_master": True, "world": world}
        assert result["all_gather"] == [{"rank": r} for r in range(world)]
        assert result["all_gather_dst_ignored"] == list(range(world))
