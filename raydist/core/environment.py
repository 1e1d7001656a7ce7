"""Launcher environment: who-am-I from torchrun/SLURM/MPI, and the inverse.

Reading: ``read_world_info()`` understands torchrun, SLURM, MPI (PMI, MPICH,
OpenMPI) variables, in that order of precedence.
Writing: ``torchrun_env(...)`` builds the exact variables torchrun gives each
process, so code written for torchrun runs unchanged under raydist.
"""

from __future__ import annotations

import os
import threading
import uuid
from dataclasses import dataclass
from typing import Dict, FrozenSet, Mapping, Optional, Sequence

# raydist sets this on each worker that holds a device: the position of its
# first device in the node's visible-devices list (the worker pool's layout rule).
DEVICE_INDEX_VAR = "RAYDIST_DEVICE_INDEX"

# First variable present wins, as in open_clip's helpers.
LOCAL_RANK_VARS = ("LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
RANK_VARS = ("RANK", "PMI_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
WORLD_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
LOCAL_WORLD_SIZE_VARS = (
    "LOCAL_WORLD_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_TASKS_PER_NODE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)
NODE_RANK_VARS = ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID")

# torchrun's defaults that keep a value the user set; every other variable
# ``torchrun_env`` sets is the launcher's own (``TORCHRUN_ENV_VARS``).
USER_DEFAULT_VARS = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS")


@dataclass(frozen=True)
class WorldInfo:
    """What the launcher told this process about its place in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0


def _int_var(name: str, value: str, minimum: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
    if number < minimum:
        raise ValueError(f"environment variable {name}={value!r} must be >= {minimum}")
    return number


def _slurm_tasks_on_node(tasks_per_node: str, node_id: str) -> str:
    """This node's entry of SLURM's compressed list: "2(x3),1" is 2, 2, 2, 1."""
    counts = []
    for part in tasks_per_node.split(","):
        count, _, repeat = part.partition("(x")
        counts += [count] * (int(repeat.rstrip(")")) if repeat.rstrip(")").isdigit() else 1)
    index = int(node_id) if node_id.isdigit() else 0
    return counts[index] if index < len(counts) else counts[-1]


def _first_int(names: Sequence[str], default: int, minimum: int, env: Mapping[str, str]) -> int:
    for name in names:
        if name in env:
            value = env[name]
            if name == "SLURM_TASKS_PER_NODE":
                value = _slurm_tasks_on_node(value, env.get("SLURM_NODEID", "0"))
            return _int_var(name, value, minimum)
    return default


def read_world_info(env: Optional[Mapping[str, str]] = None) -> WorldInfo:
    """Read rank, local rank, world size, local world size and node rank.

    Raises ValueError naming the variable when a value is negative or not an
    integer (a world size must be at least 1).
    """
    env = os.environ if env is None else env
    info = WorldInfo(
        rank=_first_int(RANK_VARS, 0, 0, env),
        local_rank=_first_int(LOCAL_RANK_VARS, 0, 0, env),
        world_size=_first_int(WORLD_SIZE_VARS, 1, 1, env),
        local_world_size=_first_int(LOCAL_WORLD_SIZE_VARS, 1, 1, env),
        node_rank=_first_int(NODE_RANK_VARS, 0, 0, env),
    )
    if info.rank >= info.world_size:
        raise ValueError(f"rank {info.rank} is outside a world of size {info.world_size}")
    return info


def world_info_from_env() -> tuple[int, int, int]:
    """``(local_rank, global_rank, world_size)``, as open_clip's helper returns them."""
    info = read_world_info()
    return info.local_rank, info.rank, info.world_size


def is_using_distributed(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when a launcher started more than one process (WORLD_SIZE or SLURM_NTASKS > 1)."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" in env:
        return _int_var("WORLD_SIZE", env["WORLD_SIZE"], 1) > 1
    if "SLURM_NTASKS" in env:
        return _int_var("SLURM_NTASKS", env["SLURM_NTASKS"], 1) > 1
    return False


def has_rendezvous(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when a launcher (torchrun, raydist) set where the process group
    meets: MASTER_ADDR, MASTER_PORT and WORLD_SIZE, whatever the world size."""
    env = os.environ if env is None else env
    return all(name in env for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"))


def is_using_horovod(env: Optional[Mapping[str, str]] = None) -> bool:
    """True under horovodrun/mpirun (OMPI_* or PMI_* rank and size) or raydist's horovod mode.

    Under SLURM, PMI variables are set for plain DDP too, so callers that can
    tell (an explicit ``horovod=`` flag) should prefer it.
    """
    env = os.environ if env is None else env
    groups = (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("HOROVOD_RANK", "HOROVOD_SIZE"),
    )
    return any(all(name in env for name in group) for group in groups)


def torchrun_env(
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    node_rank: int,
    num_nodes: int,
    master_addr: str,
    master_port: int,
    run_id: Optional[str] = None,
    restart_count: int = 0,
    max_restarts: int = 0,
    role_name: str = "default",
    omp_num_threads: Optional[int] = None,
    base_env: Optional[Mapping[str, str]] = None,
) -> Dict[str, str]:
    """The environment torchrun gives one process of a job with this layout.

    TORCH_NCCL_ASYNC_ERROR_HANDLING and OMP_NUM_THREADS keep the value from
    ``base_env`` (default: ``os.environ``) when the user set one; torchrun's
    defaults are 1 and 1 (or ``omp_num_threads`` when given).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of size {world_size}")
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank {local_rank} is outside a node of size {local_world_size}")
    if not 0 <= node_rank < num_nodes:
        raise ValueError(f"node_rank {node_rank} is outside {num_nodes} nodes")
    base = os.environ if base_env is None else base_env
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(num_nodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": role_name,
        "NODE_RANK": str(node_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id or uuid.uuid4().hex,
        USER_DEFAULT_VARS[0]: base.get(USER_DEFAULT_VARS[0], "1"),
        USER_DEFAULT_VARS[1]: base.get(USER_DEFAULT_VARS[1], str(omp_num_threads or 1)),
    }


# Read off the function itself, so the names ``env=`` may not set cannot drift from what it sets.
TORCHRUN_ENV_VARS: FrozenSet[str] = frozenset(
    torchrun_env(
        rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1, master_addr="", master_port=0, base_env={}
    )
) - frozenset(USER_DEFAULT_VARS)


_ahead_of_rank = threading.local()  # per thread: a function run ahead of its process's rank (run_ahead)


def run_ahead_of_rank(ahead: bool) -> None:
    """Whether the calling thread runs a function before its process has a rank
    (raydist's ``run_ahead``, up to the function's first ``load_state``)."""
    _ahead_of_rank.on = ahead


def check_rank_known(what: str) -> None:
    """Raise where the calling thread runs ahead of its rank: ``what`` would read
    a rank that is not there yet (a world of one), not fail."""
    if getattr(_ahead_of_rank, "on", False):
        raise RuntimeError(
            f"{what} before load_state: this function runs ahead of its rank (run_ahead), which it has once load_state returns"
        )
