"""The pure rules of torchrun's layout and of node selection: which nodes
qualify, what each can hold, the messages that name them, the options'
checks, and the layout check on assigned ranks. No Ray."""

from __future__ import annotations

from typing import Dict, List, Optional

import pytest

from raydist.config import RunConfig
from raydist.core.accelerators import BY_NAME, CPU
from raydist.pool.records import ClusterNode, Placement, WorkerInfo
from raydist.pool.rules.layout import assign_ranks, node_layout_broken, worker_env
from raydist.pool.rules.sizing import (
    NodeSelection,
    label_matches,
    node_capacity,
    node_layout_infeasibility,
    placement_request,
    selection_text,
    worker_bundle,
)

A, B, C, D = ("a" * 56, "b" * 56, "c" * 56, "d" * 56)


def node(node_id: str, cpus: float, ip: str = "10.0.0.1", gpus: float = 0, accel: Optional[str] = None, **labels: str) -> ClusterNode:
    resources: Dict[str, float] = {"CPU": cpus}
    if gpus:
        resources["GPU"] = gpus
    if accel:
        resources[f"accelerator_type:{accel}"] = 1.0
    return ClusterNode(node_id, ip, resources, {"ray.io/node-id": node_id, **labels})


THREE = [node(A, 4, zone="a"), node(B, 4, "10.0.0.2", zone="a"), node(C, 4, "10.0.0.3", zone="b")]


@pytest.mark.parametrize(
    "value, condition, matches",
    [
        ("a", "a", True),
        ("b", "a", False),
        (None, "a", False),
        ("a", "!a", False),
        ("b", "!a", True),
        (None, "!a", True),
        ("b", "in(a,b)", True),
        ("c", "in(a,b)", False),
        (None, "in(a,b)", False),
        ("b", "!in(a,b)", False),
        ("c", "!in(a,b)", True),
        (None, "!in(a,b)", True),
    ],
)
def test_label_conditions_follow_rays_forms(value: Optional[str], condition: str, matches: bool) -> None:
    assert label_matches(value, condition) is matches


def test_a_selection_matches_labels_types_and_leaves_out_excluded_nodes() -> None:
    gpus = [node(A, 8, gpus=2, accel="A100"), node(B, 8, "10.0.0.2", gpus=2, accel="H100"), node(C, 8, "10.0.0.3", gpus=2, accel="H100")]
    assert NodeSelection(accelerator_type="H100").matching(gpus) == gpus[1:]
    assert NodeSelection({"zone": "a"}).matching(THREE) == THREE[:2]
    assert NodeSelection({"zone": "!in(a,c)"}).matching(THREE) == THREE[2:]
    assert NodeSelection(exclude=("10.0.0.2", C[:8])).matching(THREE) == THREE[:1]  # an IP and an id's first characters
    assert NodeSelection().matching(THREE) == THREE and not NodeSelection().active


def test_rays_selector_carries_the_labels_and_the_excluded_ids() -> None:
    assert NodeSelection({"zone": "a"}).ray_selector(THREE) == {"zone": "a"}
    assert NodeSelection(exclude=(B[:10],)).ray_selector(THREE) == {"ray.io/node-id": f"!{B}"}
    assert NodeSelection(exclude=("10.0.0.1", "10.0.0.3")).ray_selector(THREE) == {"ray.io/node-id": f"!in({A},{C})"}
    assert NodeSelection(accelerator_type="H100").ray_selector(THREE) == {}  # a resource in the bundle instead


def test_accelerator_type_is_a_sliver_of_rays_resource_in_every_bundle() -> None:
    assert worker_bundle(BY_NAME["gpu"], {}, "H100") == {"CPU": 1.0, "GPU": 1.0, "accelerator_type:H100": 0.001}
    assert worker_bundle(CPU, {"CPU": 2}) == {"CPU": 2.0}


def test_capacity_per_node() -> None:
    assert node_capacity({"CPU": 1}, {"CPU": 4}) == 4
    assert node_capacity({"CPU": 1, "GPU": 1}, {"CPU": 16, "GPU": 2}) == 2
    assert node_capacity({"CPU": 3}, {"CPU": 4}) == 1


def test_the_layout_fits_when_enough_nodes_can_each_hold_it() -> None:
    assert node_layout_infeasibility({"CPU": 1}, 3, 2, THREE, NodeSelection()) is None
    assert node_layout_infeasibility({"CPU": 1}, 4, 3, THREE, NodeSelection()) is None


def test_too_few_nodes_names_how_many_qualify_and_what_each_holds() -> None:
    reason = node_layout_infeasibility({"CPU": 1}, 3, 4, THREE, NodeSelection())
    assert reason is not None
    assert "4 distinct nodes that can each hold 3 ({CPU: 3} per node), but only 3 of the cluster's 3 node(s) can" in reason
    for each in THREE:
        assert f"node {each.node_id[:12]} ({each.ip}) holds 4" in reason
    uneven = [node(A, 4), node(B, 2, "10.0.0.2"), node(C, 8, "10.0.0.3")]
    reason = node_layout_infeasibility({"CPU": 1}, 4, 3, uneven, NodeSelection())
    assert reason is not None and "only 2 of the cluster's 3 node(s) can" in reason and f"node {B[:12]} (10.0.0.2) holds 2" in reason


def test_a_selection_counts_only_matching_nodes_and_says_which() -> None:
    reason = node_layout_infeasibility({"CPU": 1}, 3, 2, THREE, NodeSelection({"zone": "b"}))
    assert reason is not None
    assert f"only 1 of the 1 node(s) that match label_selector {{zone: b}} can: node {C[:12]} (10.0.0.3) holds 4" in reason
    assert "1 of 3 node(s) match label_selector {zone: b}" in reason
    none = selection_text(NodeSelection({"zone": "c"}), THREE)
    assert none.startswith("no node of 3 matches label_selector {zone: c}; the nodes:")
    assert f"node {A[:12]} (10.0.0.1) labels {{zone: a}}" in none  # Ray's node-id label is not repeated


def test_the_request_under_num_nodes_is_one_strict_spread_bundle_per_node() -> None:
    config = RunConfig(num_nodes=(2, 3), workers_per_node=3, label_selector={"zone": "a"})
    request = placement_request(config, {"CPU": 1.0}, (6, 9))
    assert (request.node_layout, request.per_bundle, request.sizes, request.strategy) == (True, 3, (2, 3), "STRICT_SPREAD")
    assert request.bundle == {"CPU": 3.0}
    assert request.infeasibility(THREE) is None
    assert "only 2 of the 2 node(s) that match" in (
        placement_request(config.replace(num_nodes=3), {"CPU": 1.0}, (9, 9)).infeasibility(THREE) or ""
    )
    free = {A: {"CPU": 4.0}, B: {"CPU": 2.0}, C: {"CPU": 4.0}}
    assert request.room(free, THREE) == 1  # B has room for 2 only; C does not match
    assert request.room(free, THREE, taken=[A]) == 0  # never a second bundle on a node the group holds


def test_without_num_nodes_the_request_packs_as_before() -> None:
    request = placement_request(RunConfig(num_workers=5), {"CPU": 1.0}, (5, 5))
    assert (request.node_layout, request.per_bundle, request.strategy) == (False, 1, "PACK")
    assert request.infeasibility(THREE) is None
    reason = placement_request(RunConfig(num_workers=5, label_selector="zone=b"), {"CPU": 1.0}, (5, 5)).infeasibility(THREE)  # type: ignore[arg-type]
    assert reason is not None and "at most 4 such workers fit" in reason and "1 of 3 node(s) match label_selector {zone: b}" in reason


def placements(nodes: Dict[str, int]) -> List[Placement]:
    found: List[Placement] = []
    for node_id, count in nodes.items():
        for _ in range(count):
            found.append(Placement(len(found), node_id, "10.0.0.1", 100 + len(found), (), 29500))
    return found


def test_assigned_ranks_keep_the_layout_and_a_broken_one_is_named() -> None:
    workers = assign_ranks(placements({A: 3, B: 3}), driver_node_id=None)
    assert node_layout_broken(workers, 3) is None
    assert [(w.node_rank, w.local_rank, w.local_world_size) for w in workers] == [(r // 3, r % 3, 3) for r in range(6)]
    lopsided = assign_ranks(placements({A: 4, B: 2}), driver_node_id=None)
    assert "rank 0 is local rank 0 of 4 on node 0 (aaaaaaaaaaaa); expected local rank 0 of 3" in (node_layout_broken(lopsided, 3) or "")


def worker(device_ids: tuple, visible: tuple, local_rank: int) -> WorkerInfo:
    return WorkerInfo(
        rank=local_rank,
        world_size=2,
        local_rank=local_rank,
        local_world_size=2,
        node_rank=0,
        num_nodes=1,
        node_id=A,
        node_ip="10.0.0.1",
        pid=1,
        device_ids=device_ids,
        visible_device_ids=visible,
        device_index=visible.index(device_ids[0]),
        actor_index=local_rank,
    )


def env_of(info: WorkerInfo, config: RunConfig) -> Dict[str, str]:
    return worker_env(
        info, master_addr="h", master_port=1, run_id="r", restart_count=0, config=config, accelerator=BY_NAME["gpu"], cpus=1, extra={}
    )


def test_virtual_local_rank_shows_each_worker_only_its_own_device() -> None:
    second = worker(("5",), ("2", "5"), 1)
    plain = env_of(second, RunConfig())
    assert (plain["LOCAL_RANK"], plain["CUDA_VISIBLE_DEVICES"], plain["RAYDIST_DEVICE_INDEX"]) == ("1", "2,5", "1")
    virtual = env_of(second, RunConfig(virtual_local_rank=True, role="trainer"))
    assert (virtual["LOCAL_RANK"], virtual["CUDA_VISIBLE_DEVICES"], virtual["RAYDIST_DEVICE_INDEX"]) == ("0", "5", "0")
    assert (virtual["LOCAL_WORLD_SIZE"], virtual["RANK"], virtual["ROLE_NAME"]) == ("2", "1", "trainer")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"num_nodes": 2}, "num_nodes needs workers_per_node"),
        ({"workers_per_node": 2}, "workers_per_node needs num_nodes"),
        ({"num_nodes": 2, "workers_per_node": 2, "num_workers": 4}, "exclude each other"),
        ({"num_nodes": (3, 2), "workers_per_node": 1}, "min <= max"),
        ({"num_nodes": 0, "workers_per_node": 1}, "num_nodes must be >= 1"),
        ({"num_nodes": 2, "workers_per_node": 1, "placement_strategy": "SPREAD"}, "does not apply with num_nodes"),
        ({"label_selector": {"zone": "in()"}}, "Ray's forms"),
        ({"label_selector": {"bad key!": "a"}}, "not a Ray label key"),
        ({"exclude_nodes": ["node-7"]}, "neither a Ray node id"),
        ({"exclude_nodes": ["10.0.0.5"], "label_selector": {"ray.io/node-id": "x"}}, "use one of them"),
        ({"numa_binding": "rack"}, "unknown numa_binding"),
        ({"role": ""}, "role must be"),
        ({"monitor_interval": 0}, "monitor_interval must be a positive"),
    ],
)
def test_bad_layout_and_selection_options_are_named(options: Dict[str, object], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)")):
        RunConfig(**options)  # type: ignore[arg-type]


def test_layout_options_normalise() -> None:
    config = RunConfig(
        num_nodes=(2, 2),
        workers_per_node=3,
        label_selector="zone=in( a , b ),pool=!spot",  # type: ignore[arg-type]
        exclude_nodes="10.0.0.5, ABCDEF0123",
        numa_binding="Core-Complex",
    )  # type: ignore[arg-type]
    assert (config.num_nodes, config.worker_range, config.elastic) == (2, (6, 6), False)
    assert config.label_selector == {"zone": "in(a,b)", "pool": "!spot"}
    assert config.exclude_nodes == ("10.0.0.5", "abcdef0123")
    assert config.numa_binding == "core-complex"
    elastic = RunConfig(num_nodes=(1, 3), workers_per_node=2, restart_to_grow=True)
    assert (elastic.worker_range, elastic.node_range, elastic.elastic) == ((2, 6), (1, 3), True)
