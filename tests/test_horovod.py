"""Horovod on the raydist worker group (horovod built by scripts/install-horovod.sh)."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any, Dict

import pytest
import torch
from conftest import REPO, live_placement_groups, live_raydist_actors, start_cluster

import raydist

hvd = pytest.importorskip("horovod.torch", reason="horovod is installed by `make test`")
pytestmark = pytest.mark.timeout(240)


def horovod_view() -> Dict[str, Any]:
    info = raydist.get_context()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return {
        "hvd": (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()),
        "info": info,
        "sum": total.item(),
        "broadcast": raydist.broadcast_object({"root": info.rank} if info.rank == 1 else None, src=1),
        "all_gather": raydist.all_gather_object(info.rank * 2),
    }


def rendezvous_threads() -> int:
    return sum(1 for t in threading.enumerate() if "serve_forever" in repr(getattr(t, "_target", "")))


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("num_workers", [2, 3])
def test_horovod_ranks_allreduce_and_object_collectives(num_workers: int) -> None:
    results = raydist.run(horovod_view, num_workers=num_workers, backend="horovod")
    for rank, result in enumerate(results):
        assert result["hvd"] == (rank, num_workers, rank, num_workers, 0, 1)
        assert result["info"].horovod and result["info"].backend == "horovod"
        assert result["sum"] == num_workers * (num_workers + 1) / 2
        assert result["broadcast"] == {"root": 1}
        assert result["all_gather"] == [r * 2 for r in range(num_workers)]


def collectives_use_horovod() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() and raydist.get_context().horovod


@pytest.mark.usefixtures("ray_local")
def test_one_group_runs_several_horovod_calls_and_shuts_down_cleanly() -> None:
    before = rendezvous_threads()
    with raydist.WorkerGroup(2, backend="horovod") as group:
        assert rendezvous_threads() == before + 1
        for call in range(3):
            sums = group.run(lambda c: hvd.allreduce(torch.tensor([float(c)]), op=hvd.Sum).item(), args=(call,))
            assert sums == [2.0 * call] * 2
        # No torch process group: the object collectives can only have gone through horovod.
        assert group.run(collectives_use_horovod) == [True, True]
    assert rendezvous_threads() == before
    assert live_raydist_actors() == []
    assert live_placement_groups() == []


def test_horovod_example_trains() -> None:
    completed = subprocess.run(
        [sys.executable, "examples/horovod_raydist.py", "--num-workers", "2", "--steps", "10"],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "final loss" in completed.stdout


def test_two_node_layout_matches_horovod_local_and_cross_ranks() -> None:
    start_cluster([{"num_cpus": 2}, {"num_cpus": 2}])
    results = raydist.run(horovod_view, num_workers=4, backend="horovod", placement_strategy="SPREAD")
    node_of = {}
    for rank, result in enumerate(results):
        info = result["info"]
        assert result["hvd"] == (rank, 4, info.local_rank, 2, info.node_rank, 2)
        node_of[rank] = info.node_rank
    assert sorted(node_of.values()) == [0, 0, 1, 1]
    assert results[0]["sum"] == 10.0
