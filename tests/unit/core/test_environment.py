"""Launcher environment: reading torchrun/SLURM/MPI/OMPI variables, and
building torchrun's table. Most tests pass an ``env=`` mapping; those that read
os.environ clear every launcher variable first so the real one cannot leak in."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Dict, Sequence

import pytest

from raydist.core.environment import (
    LOCAL_RANK_VARS,
    LOCAL_WORLD_SIZE_VARS,
    NODE_RANK_VARS,
    RANK_VARS,
    WORLD_SIZE_VARS,
    WorldInfo,
    is_using_distributed,
    is_using_horovod,
    read_world_info,
    torchrun_env,
    world_info_from_env,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from core_launch import clear_launcher_vars

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_launcher_vars(monkeypatch)


# -- read_world_info: each launcher ------------------------------------------------


def test_defaults_with_nothing_set() -> None:
    assert read_world_info({}) == WorldInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0)


def test_torchrun_variables() -> None:
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}
    assert read_world_info(env) == WorldInfo(rank=5, local_rank=1, world_size=8, local_world_size=4, node_rank=1)


def test_node_rank_variable() -> None:
    assert read_world_info({"NODE_RANK": "3"}).node_rank == 3


# SLURM_NODEID is 2: the third entry of the compressed list applies.
@pytest.mark.parametrize("per_node,expected", [("2(x3)", 2), ("4", 4), ("3,2,1", 1), ("2(x2),1", 1), ("1,3(x2)", 3)])
def test_slurm_variables(per_node: str, expected: int) -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "6",
        "SLURM_NODEID": "2",
        "SLURM_TASKS_PER_NODE": per_node,
    }
    info = read_world_info(env)
    assert info == WorldInfo(rank=5, local_rank=1, world_size=6, local_world_size=expected, node_rank=2)


def test_pmi_mpich_variables() -> None:
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert read_world_info(env) == WorldInfo(rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=0)


def test_openmpi_variables() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "6",
        "OMPI_COMM_WORLD_SIZE": "12",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    assert read_world_info(env) == WorldInfo(rank=6, local_rank=2, world_size=12, local_world_size=4, node_rank=0)


def test_whitespace_around_numbers_is_accepted() -> None:
    assert read_world_info({"RANK": " 1 ", "WORLD_SIZE": "2\n"}) == WorldInfo(rank=1, world_size=2)


# -- precedence --------------------------------------------------------------------


def _check_precedence(names: Sequence[str], field: str, base: int, extra: Dict[str, str]) -> None:
    """With every name set to a distinct value, the first one present wins."""
    for start in range(len(names)):
        env = dict(extra, **{name: str(base + i) for i, name in enumerate(names) if i >= start})
        assert getattr(read_world_info(env), field) == base + start, f"{names[start]} should win"


def test_rank_precedence_torchrun_pmi_slurm_ompi() -> None:
    assert RANK_VARS == ("RANK", "PMI_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
    _check_precedence(RANK_VARS, "rank", 1, {"WORLD_SIZE": "100"})


def test_world_size_precedence() -> None:
    assert WORLD_SIZE_VARS == ("WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
    _check_precedence(WORLD_SIZE_VARS, "world_size", 10, {})


def test_local_rank_precedence() -> None:
    assert LOCAL_RANK_VARS == ("LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
    _check_precedence(LOCAL_RANK_VARS, "local_rank", 1, {})


def test_local_world_size_precedence() -> None:
    _check_precedence(LOCAL_WORLD_SIZE_VARS, "local_world_size", 2, {})


def test_node_rank_precedence() -> None:
    _check_precedence(NODE_RANK_VARS, "node_rank", 1, {})


def test_torchrun_inside_slurm_uses_torchrun_values() -> None:
    # torchrun started by srun: the job's SLURM values describe the srun task, not the rank.
    env = {
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
    }
    assert read_world_info(env) == WorldInfo(rank=5, local_rank=1, world_size=8, local_world_size=4, node_rank=1)


# -- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,value",
    [
        ("RANK", "-1"),
        ("RANK", "one"),
        ("RANK", "1.0"),
        ("RANK", ""),
        ("LOCAL_RANK", "-2"),
        ("WORLD_SIZE", "-4"),
        ("WORLD_SIZE", "2.5"),
        ("WORLD_SIZE", "0"),
        ("LOCAL_WORLD_SIZE", "0"),
        ("PMI_SIZE", "four"),
        ("SLURM_PROCID", "x"),
        ("SLURM_NTASKS", "0"),
        ("SLURM_TASKS_PER_NODE", "x(x2)"),
        ("OMPI_COMM_WORLD_RANK", "-3"),
        ("GROUP_RANK", "-1"),
    ],
)
def test_bad_value_names_variable_and_value(name: str, value: str) -> None:
    env = {name: value}
    if "SIZE" not in name and "NTASKS" not in name:
        env["WORLD_SIZE"] = "8"  # so only the bad variable can be blamed
    with pytest.raises(ValueError, match=re.escape(name)) as caught:
        read_world_info(env)
    shown = value.split("(", 1)[0] if name == "SLURM_TASKS_PER_NODE" else value
    assert repr(shown) in str(caught.value)


@pytest.mark.parametrize(
    "env",
    [
        {"RANK": "2", "WORLD_SIZE": "2"},
        {"RANK": "9", "WORLD_SIZE": "4"},
        {"RANK": "1"},  # world size defaults to 1
        {"SLURM_PROCID": "4", "SLURM_NTASKS": "4"},
        {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "3"},
    ],
)
def test_rank_outside_world_raises(env: Dict[str, str]) -> None:
    rank = next(v for k, v in env.items() if k in RANK_VARS)
    with pytest.raises(ValueError, match=rf"rank {rank} is outside a world of size"):
        read_world_info(env)


# -- os.environ path ------------------------------------------------------------------


@pytest.mark.usefixtures("clean_environ")
def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert read_world_info() == WorldInfo()
    assert world_info_from_env() == (0, 0, 1)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert read_world_info() == WorldInfo(rank=3, local_rank=1, world_size=4)
    assert world_info_from_env() == (1, 3, 4)  # open_clip's order: local, global, world
    assert read_world_info({}) == WorldInfo()  # an explicit mapping ignores os.environ


# -- is_using_distributed / is_using_horovod --------------------------------------------


@pytest.mark.parametrize(
    "env,expected",
    [
        ({}, False),
        ({"WORLD_SIZE": "1"}, False),
        ({"WORLD_SIZE": "2"}, True),
        ({"SLURM_NTASKS": "1"}, False),
        ({"SLURM_NTASKS": "4"}, True),
        ({"WORLD_SIZE": "1", "SLURM_NTASKS": "4"}, False),  # torchrun --nproc 1 inside a SLURM job
        ({"WORLD_SIZE": "2", "SLURM_NTASKS": "1"}, True),
        ({"PMI_SIZE": "4"}, False),  # MPI alone means horovod (the seed's rule), not DDP
        ({"OMPI_COMM_WORLD_SIZE": "4"}, False),
    ],
)
def test_is_using_distributed(env: Dict[str, str], expected: bool) -> None:
    assert is_using_distributed(env) is expected


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "two"}, {"WORLD_SIZE": "0"}, {"SLURM_NTASKS": "-1"}])
def test_is_using_distributed_bad_value(env: Dict[str, str]) -> None:
    (name,) = env
    with pytest.raises(ValueError, match=name):
        is_using_distributed(env)


@pytest.mark.usefixtures("clean_environ")
def test_is_using_distributed_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_using_distributed() is False
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert is_using_distributed() is True


@pytest.mark.parametrize(
    "env,expected",
    [
        ({}, False),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, True),
        ({"PMI_RANK": "0", "PMI_SIZE": "2"}, True),
        ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, True),
        ({"OMPI_COMM_WORLD_RANK": "0"}, False),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, False),
        ({"PMI_RANK": "0"}, False),
        ({"PMI_SIZE": "2"}, False),
        ({"HOROVOD_RANK": "0"}, False),
        ({"HOROVOD_SIZE": "2"}, False),
        ({"OMPI_COMM_WORLD_RANK": "0", "PMI_SIZE": "2"}, False),  # halves of different pairs
        ({"RANK": "0", "WORLD_SIZE": "2"}, False),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, False),
    ],
)
def test_is_using_horovod(env: Dict[str, str], expected: bool) -> None:
    assert is_using_horovod(env) is expected


@pytest.mark.usefixtures("clean_environ")
def test_is_using_horovod_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_using_horovod() is False
    monkeypatch.setenv("PMI_RANK", "1")
    assert is_using_horovod() is False
    monkeypatch.setenv("PMI_SIZE", "2")
    assert is_using_horovod() is True


# -- torchrun_env ------------------------------------------------------------------------

LAYOUT = dict(
    rank=5,
    local_rank=1,
    world_size=8,
    local_world_size=4,
    node_rank=1,
    num_nodes=2,
    master_addr="10.1.2.3",
    master_port=29511,
)


def test_torchrun_env_full_table() -> None:
    env = torchrun_env(**LAYOUT, run_id="job-7", restart_count=2, max_restarts=3, role_name="trainer", base_env={})
    assert env == {
        "RANK": str(LAYOUT["rank"]),
        "LOCAL_RANK": str(LAYOUT["local_rank"]),
        "WORLD_SIZE": str(LAYOUT["world_size"]),
        "LOCAL_WORLD_SIZE": str(LAYOUT["local_world_size"]),
        "GROUP_RANK": str(LAYOUT["node_rank"]),
        "GROUP_WORLD_SIZE": str(LAYOUT["num_nodes"]),
        "ROLE_RANK": str(LAYOUT["rank"]),
        "ROLE_WORLD_SIZE": str(LAYOUT["world_size"]),
        "ROLE_NAME": "trainer",
        "NODE_RANK": str(LAYOUT["node_rank"]),
        "MASTER_ADDR": LAYOUT["master_addr"],
        "MASTER_PORT": str(LAYOUT["master_port"]),
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "job-7",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
    }
    assert all(isinstance(v, str) for v in env.values())  # os.environ only takes strings


def test_torchrun_env_defaults() -> None:
    env = torchrun_env(**LAYOUT, base_env={})
    assert (env["ROLE_NAME"], env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == (
        "default",
        "0",
        "0",
    )
    # A fresh run id each call, 32 hex digits.
    other = torchrun_env(**LAYOUT, base_env={})
    assert re.fullmatch(r"[0-9a-f]{32}", env["TORCHELASTIC_RUN_ID"])
    assert env["TORCHELASTIC_RUN_ID"] != other["TORCHELASTIC_RUN_ID"]


def test_torchrun_env_round_trips_through_read_world_info() -> None:
    env = torchrun_env(**LAYOUT, base_env={})
    assert read_world_info(env) == WorldInfo(
        rank=LAYOUT["rank"],
        local_rank=LAYOUT["local_rank"],
        world_size=LAYOUT["world_size"],
        local_world_size=LAYOUT["local_world_size"],
        node_rank=LAYOUT["node_rank"],
    )
    assert is_using_distributed(env) and not is_using_horovod(env)


def test_torchrun_env_keeps_user_values_from_base_env() -> None:
    base = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "OMP_NUM_THREADS": "16"}
    env = torchrun_env(**LAYOUT, omp_num_threads=4, base_env=base)
    assert (env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], env["OMP_NUM_THREADS"]) == ("0", "16")


def test_torchrun_env_omp_num_threads_default_when_user_set_none() -> None:
    env = torchrun_env(**LAYOUT, omp_num_threads=4, base_env={"UNRELATED": "x"})
    assert (env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], env["OMP_NUM_THREADS"]) == ("1", "4")
    assert "UNRELATED" not in env  # only torchrun's variables, not a copy of the base


@pytest.mark.usefixtures("clean_environ")
def test_torchrun_env_base_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    env = torchrun_env(**LAYOUT)
    assert (env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], env["OMP_NUM_THREADS"]) == ("1", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    env = torchrun_env(**LAYOUT)
    assert (env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], env["OMP_NUM_THREADS"]) == ("2", "3")
    assert os.environ["OMP_NUM_THREADS"] == "3"  # read, never written


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(rank=-1), "rank -1 is outside a world of size 8"),
        (dict(rank=8), "rank 8 is outside a world of size 8"),
        (dict(world_size=0, rank=0), "rank 0 is outside a world of size 0"),
        (dict(local_rank=4), "local_rank 4 is outside a node of size 4"),
        (dict(local_rank=-1), "local_rank -1 is outside a node of size 4"),
        (dict(node_rank=2), "node_rank 2 is outside 2 nodes"),
        (dict(node_rank=-1), "node_rank -1 is outside 2 nodes"),
        (dict(num_nodes=0, node_rank=0), "node_rank 0 is outside 0 nodes"),
    ],
)
def test_torchrun_env_invalid_layout(change: Dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        torchrun_env(**dict(LAYOUT, **change), base_env={})
