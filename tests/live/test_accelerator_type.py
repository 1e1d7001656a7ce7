"""Node selection by accelerator type, and torchrun's per-worker device
options, on a simulated cluster with fake GPU nodes of two types (an A100
node and two H100 nodes: Ray's ``accelerator_type:TYPE`` resource, as Ray
sets it on real GPU nodes) and a CPU-only head.

The GPUs are fake: Ray counts them and sets CUDA_VISIBLE_DEVICES, torch sees
no CUDA and the group runs on gloo, which is what the NUMA-binding test
relies on (no topology to bind by)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
import ray
import ray.cloudpickle
from conftest import live_placement_groups

import raydist
from raydist import cli

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

HEAD = {"num_cpus": 1}
GPU_NODES = [
    {"num_cpus": 2, "num_gpus": 2, "resources": {"accelerator_type:A100": 1}},
    {"num_cpus": 2, "num_gpus": 2, "resources": {"accelerator_type:H100": 1}},
    {"num_cpus": 2, "num_gpus": 2, "resources": {"accelerator_type:H100": 1}},
]

# soak: the accelerator-type matrix on its own cluster shape (which nodes match is unit-tested:
# tests/unit/rules/test_node_rules.py; GPU requests on a cluster run in make test: test_faults)
pytestmark = [pytest.mark.soak, pytest.mark.timeout(300), pytest.mark.nodes(HEAD, *GPU_NODES)]


def types_by_node() -> Dict[str, str]:
    return {
        n["NodeID"]: next((r.split(":", 1)[1] for r in n["Resources"] if r.startswith("accelerator_type:")), "")
        for n in ray.nodes()
        if n["Alive"]
    }


def seen() -> Dict[str, Any]:
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
        "visible": os.environ["CUDA_VISIBLE_DEVICES"],
        "local_rank": os.environ["LOCAL_RANK"],
        "local_world_size": os.environ["LOCAL_WORLD_SIZE"],
        "group_rank": os.environ["GROUP_RANK"],
        "device_index": os.environ.get("RAYDIST_DEVICE_INDEX"),
        "affinity": sorted(os.sched_getaffinity(0)),
    }


def test_accelerator_type_picks_the_nodes_of_that_type(cluster: Any) -> None:
    types = types_by_node()
    # One worker a node: the type picks nodes, whatever runs on them.
    ranks: List[Dict[str, Any]] = raydist.run(seen, num_nodes=2, workers_per_node=1, accelerator_type="H100")
    assert [r["group_rank"] for r in ranks] == ["0", "1"]
    assert {types[r["node_id"]] for r in ranks} == {"H100"} and len({r["node_id"] for r in ranks}) == 2
    packed = raydist.run(seen, num_workers=1, accelerator_type="A100")  # without --nnodes
    assert {types[r["node_id"]] for r in packed} == {"A100"}
    assert live_placement_groups() == []


def test_an_absent_type_fails_at_once_naming_the_types_there_are(cluster: Any) -> None:
    start = time.monotonic()
    with pytest.raises(raydist.InfeasibleResourcesError) as raised:
        raydist.run(seen, num_nodes=1, workers_per_node=1, accelerator_type="B200")
    assert time.monotonic() - start < 10
    message = str(raised.value)
    assert "no node of 4 matches accelerator_type B200" in message
    assert "accelerator type A100" in message and "accelerator type H100" in message
    with pytest.raises(raydist.InfeasibleResourcesError, match="only 1 of the 1 node.s. that match accelerator_type A100"):
        raydist.run(seen, num_nodes=2, workers_per_node=1, accelerator_type="A100")


def test_virtual_local_rank_gives_each_worker_its_own_gpu_as_index_0(cluster: Any) -> None:
    ranks = raydist.run(seen, num_nodes=1, workers_per_node=2, accelerator_type="A100", virtual_local_rank=True)
    for rank in ranks:
        assert (rank["local_rank"], rank["local_world_size"], rank["device_index"]) == ("0", "2", "0")
        assert rank["visible"] == rank["gpu_ids"][0]
    assert ranks[0]["visible"] != ranks[1]["visible"]


def test_numa_binding_without_a_topology_binds_nothing_and_says_why_once_per_node(
    cluster: Any, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    script = tmp_path / "affinity.py"
    script.write_text("import os\nprint('affinity', os.environ['RANK'], len(os.sched_getaffinity(0)), flush=True)\n")
    address = ray.get_runtime_context().gcs_address
    status = cli.main(
        ["run", "--address", address, "--nnodes", "2", "-n", "2", "--accelerator-type", "H100", "--numa-binding", "node", str(script)]
    )
    out, err = capfd.readouterr()
    assert status == 0, out + err
    line = "--numa-binding node not applied on this node: CUDA sees no GPU"
    assert (out + err).count(line) == 2, out + err  # local rank 0 of each node
    # (found anywhere in a line: Ray's forwarding can put another process's prefix on the same line)
    assert sorted(re.findall(r"\baffinity (\d+) \d+", out)) == ["0", "1", "2", "3"], out
    cpus = len(os.sched_getaffinity(0))
    assert all(line.split()[-1] == str(cpus) for line in out.splitlines() if "affinity " in line)  # nothing bound
