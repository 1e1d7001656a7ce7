"""Node-aware ranks and the right device for every resource shape, on a
simulated cluster of two nodes of different sizes.

The nodes' GPUs/NPUs are fake (Ray only counts them and sets the visible
devices variables), so torch falls back to CPU/gloo: the tests check layout,
environment and ``device_index`` on every rank, and that the group still
initialises and communicates.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import pytest
import ray
import torch
import torch.distributed as dist

import raydist
from raydist.core.accelerators import BY_NAME

HEAD = {"num_cpus": 4, "num_gpus": 4, "resources": {"NPU": 4}}
SMALL = {"num_cpus": 2, "num_gpus": 2, "resources": {"NPU": 2}}

# soak: the device matrix on its own cluster shape (the devices a rank picks are unit-tested)
pytestmark = [pytest.mark.soak, pytest.mark.timeout(240), pytest.mark.nodes(HEAD, SMALL), pytest.mark.usefixtures("cluster")]


def where_am_i(kind: str) -> Dict[str, Any]:
    row = BY_NAME[kind]
    context = ray.get_runtime_context()
    total = torch.ones(1)
    dist.all_reduce(total)
    return {
        "rank": dist.get_rank(),
        "world": int(total.item()),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
        "visible": os.environ[row.visible_devices_var].split(","),
        "own_ids": sorted((str(i) for i in context.get_accelerator_ids()[row.ray_resource]), key=int),
        "node_id": context.get_node_id(),
        "device_index": raydist.get_context().device_index,
        "device_index_var": os.environ.get("RAYDIST_DEVICE_INDEX"),
    }


def check_every_rank(results: List[Dict[str, Any]], workers: List[Any], num_workers: int) -> Dict[str, List[Dict[str, Any]]]:
    """The layout rules, checked on what each rank saw; returns ranks by node."""
    assert [r["rank"] for r in results] == list(range(num_workers))
    assert {r["world"] for r in results} == {num_workers}
    driver = ray.get_runtime_context().get_node_id()
    if any(r["node_id"] == driver for r in results):
        assert results[0]["node_id"] == driver  # the driver's node comes first when it has workers
    by_node: Dict[str, List[Dict[str, Any]]] = {}
    for result, worker in zip(results, workers):
        assert result["node_id"] == worker.node_id
        assert result["device_index"] == worker.device_index
        assert result["device_index_var"] == str(worker.device_index)
        by_node.setdefault(result["node_id"], []).append(result)
    for members in by_node.values():
        union = sorted({i for m in members for i in m["own_ids"]}, key=int)
        assert [m["local_rank"] for m in members] == list(range(len(members)))
        for member in members:
            assert member["local_world_size"] == len(members)
            assert member["visible"] == union  # the group's devices on this node, once each, in id order
            assert member["visible"][member["device_index"]] == member["own_ids"][0]  # its own device
    return by_node


def test_one_gpu_per_worker_over_both_nodes_device_index_is_local_rank() -> None:
    with raydist.WorkerGroup(None) as group:  # None: one worker per GPU (4 + 2)
        results = group.run(where_am_i, args=("gpu",))
        workers = group.workers
    by_node = check_every_rank(results, workers, 6)
    assert sorted(len(m) for m in by_node.values()) == [2, 4]
    assert all(r["device_index"] == r["local_rank"] for r in results)  # torchrun's cuda:LOCAL_RANK holds


def test_two_gpus_per_worker_each_rank_uses_its_own_first_gpu() -> None:
    with raydist.WorkerGroup(3, resources_per_worker={"GPU": 2}) as group:
        results = group.run(where_am_i, args=("gpu",))
        workers = group.workers
    check_every_rank(results, workers, 3)
    assert all(len(r["own_ids"]) == 2 for r in results)
    # The second worker of a node starts two devices in, not at its local rank.
    assert [r["device_index"] for r in results if r["local_rank"] == 1] == [2]


def test_half_a_gpu_per_worker_sharing_workers_get_the_same_device() -> None:
    with raydist.WorkerGroup(2, resources_per_worker={"GPU": 0.5, "CPU": 0.5}, placement_strategy="STRICT_PACK") as group:
        results = group.run(where_am_i, args=("gpu",))
        workers = group.workers
    check_every_rank(results, workers, 2)
    devices = [r["own_ids"][0] for r in results]
    assert len(set(devices)) < len(devices)  # some GPU is shared
    for result in results:
        assert len(result["visible"]) == len(set(result["visible"]))  # listed once


def test_two_npus_per_worker_set_ascend_visible_devices() -> None:
    with raydist.WorkerGroup(2, accelerator="npu", resources_per_worker={"NPU": 2}) as group:
        results = group.run(where_am_i, args=("npu",))
        workers = group.workers
        contexts = group.contexts
    check_every_rank(results, workers, 2)
    assert all(r["device_index"] == 2 * r["local_rank"] for r in results)  # two devices per local rank
    assert {c.backend for c in contexts if c is not None} == {"gloo"}  # fake NPUs: CPU fallback


def device_index_or_none() -> Optional[int]:
    return raydist.get_context().device_index


def test_cpu_workers_have_no_device_index() -> None:
    assert raydist.run(device_index_or_none, num_workers=1, accelerator="cpu") == [None]


def abort_on_the_second_node() -> None:
    if os.environ["GROUP_RANK"] == "1" and os.environ["LOCAL_RANK"] == "0":
        import sys

        print("last words on the other node", file=sys.stderr, flush=True)
        os.abort()
    dist.barrier()


def test_a_rank_that_dies_on_another_node_is_explained_from_that_node() -> None:
    with pytest.raises(raydist.WorkerGroupError) as caught:
        # One rank a node: the smallest group with a rank on the other node.
        raydist.run(abort_on_the_second_node, num_nodes=2, workers_per_node=1, accelerator="cpu")
    root = caught.value.root_cause
    assert root.node_id != ray.get_runtime_context().get_node_id()
    assert root.died == "killed by SIGABRT (aborted)", str(caught.value)
    assert "last words on the other node" in (root.output or "")
