"""Node-aware ranks and device visibility on a simulated 3-node cluster.

The nodes' GPUs/NPUs are fake (Ray only counts them), so torch falls back to
CPU/gloo: the tests check layout and environment, and that the group still
initialises.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator

import pytest
import ray
import torch.distributed as dist
from conftest import start_cluster

import raydist

pytestmark = pytest.mark.timeout(240)

NODES = 3
PER_NODE = 2


def where_am_i(resource: str, visible_var: str) -> Dict[str, Any]:
    context = ray.get_runtime_context()
    return {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "backend": dist.get_backend(),
        "env": {k: os.environ[k] for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_WORLD_SIZE")},
        "visible": os.environ[visible_var].split(","),
        "own_ids": [str(i) for i in context.get_accelerator_ids()[resource]],
        "node_id": context.get_node_id(),
    }


@pytest.fixture(scope="module", params=[("GPU", "CUDA_VISIBLE_DEVICES"), ("NPU", "ASCEND_RT_VISIBLE_DEVICES")])
def accelerator_cluster(request: pytest.FixtureRequest) -> Iterator[tuple]:
    resource, variable = request.param
    node = {"num_cpus": PER_NODE, "num_gpus": PER_NODE} if resource == "GPU" else {"num_cpus": PER_NODE, "resources": {"NPU": PER_NODE}}
    start_cluster([node] * NODES)
    yield resource, variable


def test_ranks_follow_nodes_and_local_rank_indexes_own_device(accelerator_cluster: tuple) -> None:
    resource, variable = accelerator_cluster
    driver_node = ray.get_runtime_context().get_node_id()
    with raydist.WorkerGroup(None, env={}) as group:  # None: one worker per accelerator
        results = group.run(where_am_i, args=(resource, variable))
        workers = group.workers
    assert len(results) == NODES * PER_NODE
    assert [r["rank"] for r in results] == list(range(NODES * PER_NODE))
    assert {r["backend"] for r in results} == {"gloo"}  # fake devices: CPU fallback
    assert results[0]["node_id"] == driver_node  # the driver's node comes first
    by_node: Dict[str, list] = {}
    for result, worker in zip(results, workers):
        assert result["node_id"] == worker.node_id
        by_node.setdefault(result["node_id"], []).append(result)
    assert len(by_node) == NODES
    for node_rank, (node_id, members) in enumerate(by_node.items()):
        union = sorted((i for m in members for i in m["own_ids"]), key=int)
        for local_rank, member in enumerate(members):
            assert member["env"] == {
                "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(PER_NODE),
                "NODE_RANK": str(node_rank),
                "GROUP_WORLD_SIZE": str(NODES),
            }
            # Every worker on the node sees the node's devices, ordered so that
            # its local rank points at the device Ray gave it.
            assert member["visible"] == union
            assert member["visible"][local_rank] == member["own_ids"][0]
        # Ranks are contiguous per node and ordered by lowest device id.
        assert [m["own_ids"][0] for m in members] == sorted((m["own_ids"][0] for m in members), key=int)
