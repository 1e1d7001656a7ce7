"""The pure rank and device assignment, for every resource shape a worker can
have: one whole device, several, a share of one, NPUs, none, and nodes of
different sizes. No Ray: placements are written out as Ray would report them."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import pytest

from raydist.config import RunConfig
from raydist.core.accelerators import BY_NAME, CPU
from raydist.pool.records import Placement, WorkerInfo
from raydist.pool.rules.layout import assign_ranks, backend_for_devices, shared_devices, worker_env

DRIVER = "node-a"


def placed(*workers: Tuple[str, Sequence[str]]) -> List[Placement]:
    """Placements in actor order: (node id, device ids Ray gave the worker)."""
    return [
        Placement(
            index=i, node_id=node, node_ip=f"10.0.0.{ord(node[-1]) - 96}", pid=100 + i, accelerator_ids=tuple(ids), free_port=20000 + i
        )
        for i, (node, ids) in enumerate(workers)
    ]


def table(workers: List[WorkerInfo]) -> List[Tuple[int, str, int, Tuple[str, ...], Tuple[str, ...], object]]:
    return [(w.rank, w.node_id, w.local_rank, w.device_ids, w.visible_device_ids, w.device_index) for w in workers]


def test_one_whole_gpu_each_device_index_is_the_local_rank() -> None:
    workers = assign_ranks(placed(("node-a", ["3"]), ("node-a", ["1"]), ("node-a", ["0"]), ("node-a", ["2"])), DRIVER)
    assert table(workers) == [
        (0, "node-a", 0, ("0",), ("0", "1", "2", "3"), 0),
        (1, "node-a", 1, ("1",), ("0", "1", "2", "3"), 1),
        (2, "node-a", 2, ("2",), ("0", "1", "2", "3"), 2),
        (3, "node-a", 3, ("3",), ("0", "1", "2", "3"), 3),
    ]
    assert all(w.device_index == w.local_rank for w in workers)  # torchrun's cuda:LOCAL_RANK holds


def test_two_gpus_each_points_at_own_first_device_not_the_local_rank() -> None:
    # Ray gave rank 1 GPUs 2 and 3: device 1 would be rank 0's second GPU.
    workers = assign_ranks(placed(("node-a", ["2", "3"]), ("node-a", ["0", "1"])), DRIVER)
    assert table(workers) == [
        (0, "node-a", 0, ("0", "1"), ("0", "1", "2", "3"), 0),
        (1, "node-a", 1, ("2", "3"), ("0", "1", "2", "3"), 2),
    ]


def test_half_a_gpu_each_two_workers_share_one_device_listed_once() -> None:
    workers = assign_ranks(placed(("node-a", ["0"]), ("node-a", ["0"]), ("node-a", ["1"])), DRIVER)
    assert table(workers) == [
        (0, "node-a", 0, ("0",), ("0", "1"), 0),
        (1, "node-a", 1, ("0",), ("0", "1"), 0),
        (2, "node-a", 2, ("1",), ("0", "1"), 1),
    ]


def test_npus_two_per_worker_with_gaps_in_the_ids() -> None:
    # Another group holds NPUs 2-3: this group's list leaves them out.
    workers = assign_ranks(placed(("node-a", ["4", "5"]), ("node-a", ["0", "1"])), DRIVER)
    assert [(w.visible_device_ids, w.device_index) for w in workers] == [
        (("0", "1", "4", "5"), 0),
        (("0", "1", "4", "5"), 2),
    ]


def test_ids_sort_as_numbers() -> None:
    workers = assign_ranks(placed(("node-a", ["10"]), ("node-a", ["9"])), DRIVER)
    assert [w.device_ids for w in workers] == [("9",), ("10",)]
    assert workers[0].visible_device_ids == ("9", "10")


def test_cpu_only_workers_have_no_device() -> None:
    workers = assign_ranks(placed(("node-a", []), ("node-a", []), ("node-a", [])), DRIVER)
    assert [(w.rank, w.local_rank, w.visible_device_ids, w.device_index) for w in workers] == [
        (0, 0, (), None),
        (1, 1, (), None),
        (2, 2, (), None),
    ]
    assert [w.actor_index for w in workers] == [0, 1, 2]  # stable: actor order


def test_two_nodes_of_different_sizes_driver_node_first() -> None:
    # node-b has 2 GPUs per worker and 3 workers; the driver's node-a has 1 worker of 1 GPU.
    workers = assign_ranks(
        placed(("node-b", ["4", "5"]), ("node-b", ["0", "1"]), ("node-a", ["7"]), ("node-b", ["2", "3"])),
        DRIVER,
    )
    by_rank: Dict[int, WorkerInfo] = {w.rank: w for w in workers}
    assert [(w.node_id, w.node_rank, w.local_rank, w.local_world_size, w.num_nodes) for w in workers] == [
        ("node-a", 0, 0, 1, 2),
        ("node-b", 1, 0, 3, 2),
        ("node-b", 1, 1, 3, 2),
        ("node-b", 1, 2, 3, 2),
    ]
    assert by_rank[0].visible_device_ids == ("7",) and by_rank[0].device_index == 0
    assert [by_rank[r].device_index for r in (1, 2, 3)] == [0, 2, 4]
    assert {by_rank[r].visible_device_ids for r in (1, 2, 3)} == {("0", "1", "2", "3", "4", "5")}


@pytest.mark.parametrize("driver", [DRIVER, None, "node-elsewhere"])
def test_every_worker_device_index_points_at_its_own_first_device(driver: object) -> None:
    workers = assign_ranks(
        placed(("node-b", ["1"]), ("node-a", ["0", "1"]), ("node-b", ["0"]), ("node-a", ["2", "3"]), ("node-b", ["1"])),
        driver,  # type: ignore[arg-type]
    )
    assert [w.rank for w in workers] == list(range(5))
    for worker in workers:
        assert worker.visible_device_ids[worker.device_index] == worker.device_ids[0]  # type: ignore[index]
        mates = [w for w in workers if w.node_id == worker.node_id]
        union = sorted({i for w in mates for i in w.device_ids}, key=int)
        assert list(worker.visible_device_ids) == union


def test_a_restart_keeps_the_surviving_nodes_in_their_order() -> None:
    # The last attempt ran on a (driver), b, c; b left and d joined.
    workers = assign_ranks(
        placed(("node-d", []), ("node-c", []), ("node-a", []), ("node-c", [])),
        DRIVER,
        node_order=["node-a", "node-b", "node-c"],
    )
    assert [(w.node_id, w.node_rank) for w in workers] == [
        ("node-a", 0),
        ("node-c", 1),
        ("node-c", 1),
        ("node-d", 2),
    ]


def test_a_ranks_environment_costs_the_same_however_large_the_drivers_environment(
    count_calls: Callable[[Callable[[], Any]], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Built once per rank: a copy of the driver's environment each time cost 0.2 ms a rank (0.7 s at 4,096 ranks).
    worker = assign_ranks(placed(("node-a", []), ("node-a", [])), DRIVER)[1]
    config = RunConfig(num_workers=2, env={"MY_FLAG": "1"})
    env = lambda: worker_env(  # noqa: E731
        worker, master_addr="h", master_port=1, run_id="r", restart_count=0, config=config, accelerator=CPU, cpus=1, extra={}
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # a user's value is still kept
    before = count_calls(env)
    for i in range(500):
        monkeypatch.setenv(f"SOME_DRIVER_VARIABLE_{i}", "x")
    assert count_calls(env) == before
    assert env()["OMP_NUM_THREADS"] == "3" and env()["MY_FLAG"] == "1" and "SOME_DRIVER_VARIABLE_0" not in env()


# -- ranks that share a device (fractional amounts) ------------------------------


def test_only_devices_held_by_two_ranks_count_as_shared() -> None:
    workers = assign_ranks(placed(("node-a", ["0"]), ("node-a", ["0"]), ("node-a", ["1"]), ("node-b", ["0"])), DRIVER)
    assert shared_devices(workers) == {("node-a", "0"): [0, 1]}  # node-b's GPU 0 is another device


def test_nccl_by_default_becomes_gloo_where_ranks_share_a_gpu() -> None:
    shared = assign_ranks(placed(("node-a", ["0"]), ("node-a", ["0"])), DRIVER)
    whole = assign_ranks(placed(("node-a", ["0"]), ("node-a", ["1"])), DRIVER)
    assert backend_for_devices(None, BY_NAME["gpu"], shared) == "gloo"
    assert backend_for_devices(None, BY_NAME["gpu"], whole) is None  # each worker picks nccl itself
    assert backend_for_devices("gloo", BY_NAME["gpu"], shared) == "gloo"
    assert backend_for_devices(None, BY_NAME["npu"], shared) is None  # hccl: not known to refuse it


@pytest.mark.parametrize("asked", ["nccl", "NCCL", "cpu:gloo,cuda:nccl"])
def test_nccl_asked_for_on_a_shared_gpu_is_refused_before_anything_starts(asked: str) -> None:
    workers = assign_ranks(placed(("node-a", ["0"]), ("node-a", ["1"]), ("node-a", ["1"])), DRIVER)
    with pytest.raises(ValueError, match=r"takes one rank per device, but ranks 1, 2 share GPU 1 on node node-a.*backend='gloo'"):
        backend_for_devices(asked, BY_NAME["gpu"], workers)
    assert backend_for_devices(asked, BY_NAME["gpu"], workers[:2]) == asked  # whole devices: nccl as asked
