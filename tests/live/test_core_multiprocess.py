"""Real multi-process runs of the core on CPU/gloo: torchrun with 2 and 3 ranks,
and a fake 2-task SLURM job (SLURM variables only, as srun sets them)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from core_launch import load_results, run_fake_slurm, run_torchrun

pytestmark = pytest.mark.timeout(120)


def check_rank(result: dict, rank: int, world: int, local_rank: int, local_world: int, node_rank: int) -> None:
    """Everything one rank reported, against the layout it was launched with."""
    last = world - 1
    layout = dict(rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world, node_rank=node_rank)
    assert result["launcher"] == layout
    assert result["record"] == dict(layout, device="cpu", backend="gloo", distributed=True, horovod=False, device_index=None)
    assert result["same_record_again"] and result["context_is_record"]
    assert (result["torch_rank"], result["torch_world_size"], result["torch_backend"]) == (rank, world, "gloo")

    sent = {"squares": [i * i for i in range(world)], "nested": {"world": world}}
    assert result["broadcast_from_0"] == dict(sent, sender=0)
    assert result["broadcast_from_last"] == dict(sent, sender=last)
    assert result["all_gather"] == list(range(world))
    assert result["all_gather_dicts"] == [{"rank": r, "tag": f"r{r}"} for r in range(world)]
    assert result["gather_to_last"] == ([r * 10 for r in range(world)] if rank == last else None)
    assert result["gather_to_0"] == ([f"from{r}" for r in range(world)] if rank == 0 else None)
    assert result["scatter_from_0"] == {"to": rank, "payload": [rank] * (rank + 1)}

    assert result["src_world_error"] == f"src={world} is outside the world of size {world}"
    assert result["src_negative_error"] == f"src=-1 is outside the world of size {world}"
    assert result["gather_dst_error"] == f"dst={world + 3} is outside the world of size {world}"
    assert result["scatter_src_error"] == f"src={world} is outside the world of size {world}"
    assert result["all_gather_after_errors"] == [-r for r in range(world)]

    assert result["initialized_after_shutdown"] is False
    assert result["context_after_shutdown"] is True


@pytest.mark.parametrize("nproc", [3, pytest.param(2, marks=pytest.mark.soak)])
def test_torchrun_ranks(tmp_path: Path, nproc: int) -> None:
    run_torchrun("core_worker.py", nproc, tmp_path)
    results = load_results(tmp_path, nproc)
    for rank, result in enumerate(results):
        # One node: local rank == rank, local world == world.
        check_rank(result, rank, nproc, local_rank=rank, local_world=nproc, node_rank=0)
        # torchrun sets the torch variables itself; raydist must not change them.
        assert result["exported_env"] == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc)}


def slurm_tasks(nodes: int, tasks_per_node: int) -> List[Dict[str, str]]:
    """The variables srun gives each task of ``nodes x tasks_per_node``, block distribution."""
    world = nodes * tasks_per_node
    return [
        {
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank % tasks_per_node),
            "SLURM_NODEID": str(rank // tasks_per_node),
            "SLURM_NTASKS": str(world),
            "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})" if nodes > 1 else str(tasks_per_node),
        }
        for rank in range(world)
    ]


@pytest.mark.parametrize(
    "nodes,tasks_per_node", [pytest.param(1, 2, marks=pytest.mark.soak), (2, 1)], ids=["1node-2tasks", "2nodes-1task"]
)  # make test: two nodes, the harder
def test_fake_slurm_job(tmp_path: Path, nodes: int, tasks_per_node: int) -> None:
    tasks = slurm_tasks(nodes, tasks_per_node)
    run_fake_slurm("core_worker.py", tasks, tmp_path)
    world = len(tasks)
    results = load_results(tmp_path, world)
    for rank, result in enumerate(results):
        check_rank(
            result,
            rank,
            world,
            local_rank=rank % tasks_per_node,
            local_world=tasks_per_node,
            node_rank=rank // tasks_per_node,
        )
        # SLURM sets no torch variables: init exports them for code written for torchrun.
        assert result["exported_env"] == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % tasks_per_node),
            "WORLD_SIZE": str(world),
        }
