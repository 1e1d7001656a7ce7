"""raydist.run and WorkerGroup on a local Ray (CPU, gloo)."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List

import pytest
import torch
import torch.distributed as dist
from conftest import assert_nothing_left

import raydist
from raydist.core.environment import torchrun_env

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("ray_local")]

TORCHRUN_VARS = list(
    torchrun_env(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr="x",
        master_port=1,
    )
)


def rank_sum_and_objects() -> Dict[str, Any]:
    info = raydist.get_context()
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    return {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "sum": total.item(),
        "broadcast": raydist.broadcast_object({"from": info.rank} if info.rank == 1 else None, src=1),
        "all_gather": raydist.all_gather_object(info.rank * 10),
        "context": info,
    }


@pytest.mark.parametrize(
    "num_workers", [2, pytest.param(3, marks=pytest.mark.soak)]
)  # even and odd (a 4-rank world: test_default_num_workers_is_one_per_cpu_slot)
def test_run_returns_rank_ordered_results_and_collectives_work(num_workers: int) -> None:
    results = raydist.run(rank_sum_and_objects, num_workers=num_workers)
    expected_sum = num_workers * (num_workers + 1) / 2
    assert [r["rank"] for r in results] == list(range(num_workers))
    for rank, result in enumerate(results):
        assert result["world"] == num_workers
        assert result["sum"] == expected_sum
        assert result["broadcast"] == {"from": 1}
        assert result["all_gather"] == [r * 10 for r in range(num_workers)]
        context = result["context"]
        assert (context.rank, context.world_size, context.backend, context.distributed) == (rank, num_workers, "gloo", True)
        assert context.device == "cpu"


def launcher_env() -> Dict[str, str]:
    return {name: os.environ[name] for name in TORCHRUN_VARS if name in os.environ}


def test_every_torchrun_variable_on_every_rank() -> None:
    with raydist.WorkerGroup(2, env={"OMP_NUM_THREADS": "2", "MY_SETTING": "on"}) as group:
        envs = group.run(launcher_env)
        extra = group.run(lambda: os.environ.get("MY_SETTING"))
        workers = group.workers
    master_port = envs[0]["MASTER_PORT"]
    run_id = envs[0]["TORCHELASTIC_RUN_ID"]
    assert master_port.isdigit() and run_id
    for rank, env in enumerate(envs):
        assert env == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": "2",
            "ROLE_NAME": "default",
            "NODE_RANK": "0",
            "MASTER_ADDR": workers[0].node_ip,
            "MASTER_PORT": master_port,
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            "OMP_NUM_THREADS": "2",  # the user's value wins over torchrun's default
        }
    assert extra == ["on"] * 2


def add(x: int, y: int = 0) -> int:
    return dist.get_rank() * 100 + x + y


def append_one(items: List[int]) -> int:
    items.append(1)
    return len(items)


def test_worker_group_reuses_one_process_group_across_calls() -> None:
    with raydist.WorkerGroup(2) as group:
        pids = [w.pid for w in group.workers]
        assert [w.rank for w in group.workers] == [0, 1]
        assert group.run(os.getpid) == pids
        for call in range(20):
            assert group.run(add, args=(call,), kwargs={"y": 1}) == [call + 1, 100 + call + 1]
        for _ in range(3):  # the same call again (its bytes not sent again): its arguments are fresh each time
            assert group.run(append_one, args=([],)) == [1, 1]
        future = group.submit(add, args=(5,))
        assert future.result(timeout=60) == [5, 105]
        assert future.done()
        assert not future.cancel()  # already finished: nothing to cancel
    assert_nothing_left()


def file_growth_by_print() -> List[int]:
    """How much the file behind fd 1 grew after a print without its newline, then after the newline."""
    before = os.fstat(1).st_size
    print("half a line", end="")
    half = os.fstat(1).st_size
    print(" and its end")
    return [half - before, os.fstat(1).st_size - half]


def test_a_workers_printed_line_is_written_whole() -> None:
    """Ray's worker streams write each piece of a print at once (which its log monitor
    may forward as lines of their own); a worker writes a line whole at its newline
    (tests/unit/worker/test_whole_lines.py)."""
    assert raydist.run(file_growth_by_print, num_workers=2) == [[0, len("half a line and its end\n")]] * 2


def wait_done(future: "raydist.WorkerFuture", timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not future.done():
        assert time.monotonic() < deadline, "the call did not finish"
        time.sleep(0.05)  # polling, with a deadline


@pytest.mark.soak  # the engine's logic, on the fake cluster in the unit tier: test_engine_calls::test_a_finished_calls_values_survive_the_cancel_of_a_later_call
def test_a_finished_calls_values_survive_the_cancel_of_a_later_call() -> None:
    group = raydist.WorkerGroup(2)
    try:
        first = group.submit(add, args=(1,))
        wait_done(first)
        later = group.submit(time.sleep, (60,))
        assert later.cancel()
        assert first.result(timeout=30) == [1, 101]
        with pytest.raises(raydist.WorkerCallCancelled):
            later.result(timeout=30)
    finally:
        group.shutdown()
    assert_nothing_left()


def test_results_of_any_picklable_kind_come_back_and_a_successful_run_leaves_nothing_behind() -> None:
    results = raydist.run(lambda: {"tensor": torch.ones(2) * dist.get_rank(), "none": None}, num_workers=2)
    assert torch.equal(results[1]["tensor"], torch.ones(2))
    assert results[0]["none"] is None
    assert_nothing_left()


def raise_on_rank_one() -> None:
    if dist.get_rank() == 1:
        raise ValueError("bad batch on rank one")
    dist.barrier()  # the peer blocks here; it must be killed, not waited for


def test_failed_run_names_rank_and_node_and_leaves_nothing_behind() -> None:
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(raise_on_rank_one, num_workers=2, timeout=120)
    error = caught.value
    assert error.failed_ranks == [1]
    assert error.root_cause.rank == 1
    assert "ValueError: bad batch on rank one" in str(error)
    assert "rank 1" in str(error) and error.root_cause.node_id[:12] in str(error)
    assert not error.restarted_in_place and "restarted in place" not in str(error)
    assert_nothing_left()


@pytest.mark.soak  # make test: the rule in tests/unit/rules (sizing); a real cluster's slots: test_cli's -n cpu
def test_default_num_workers_is_one_per_cpu_slot() -> None:
    import ray

    results: List[int] = raydist.run(dist.get_world_size)
    assert results == [int(ray.cluster_resources()["CPU"])] * len(results)


@pytest.mark.parametrize("internal", ["restart_count", "logs", "node_order", "restarts_used"])
def test_the_public_constructor_takes_only_public_options(internal: str) -> None:
    with pytest.raises(TypeError, match=f"unexpected option.*'{internal}'"):
        raydist.WorkerGroup(2, **{internal: 1})  # refused before Ray is touched
