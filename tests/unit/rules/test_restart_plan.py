"""The warm-restart plan (pure): who keeps their process, who is replaced and
from where, the next world size and node order; and the line each restart logs."""

from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

from raydist.config import RunConfig
from raydist.pool.records import ClusterNode, Placement, WorkerInfo
from raydist.pool.rules.layout import assign_ranks
from raydist.pool.rules.restart_plan import RestartPlan, Seat, plan_restart, restart_summary
from raydist.pool.rules.sizing import infeasibility


def world(nodes: Sequence[Tuple[str, int]]) -> List[WorkerInfo]:
    """Workers by rank: ``nodes`` is (node id, workers there); bundle i = rank i."""
    placements = []
    for node, count in nodes:
        for _ in range(count):
            index = len(placements)
            placements.append(Placement(index, node, "10.0.0.1", 100 + index, (), 0))
    return assign_ranks(placements, nodes[0][0])


def test_a_crash_is_replaced_in_its_own_bundle_and_the_rest_stay() -> None:
    workers = world([("a", 2), ("b", 2)])
    plan = plan_restart(
        workers,
        dead={1},
        stuck=(),
        leaving_nodes=(),
        spares=(),
        free_seats=[Seat(1, "a")],
        sizes=(4, 4),
    )
    assert plan == RestartPlan(kept=(0, 2, 3), spares=(), fresh=(Seat(1, "a"),), killed=(), size=4, node_order=("a", "b"))


def test_a_ready_spare_goes_before_a_fresh_process() -> None:
    workers = world([("a", 2), ("b", 2)])
    plan = plan_restart(
        workers,
        dead={1},
        stuck=(),
        leaving_nodes=(),
        spares=[Seat(4, "c")],
        free_seats=[Seat(1, "a")],
        sizes=(4, 4),
    )
    assert (plan.kept, plan.spares, plan.fresh, plan.size) == ((0, 2, 3), (0,), (), 4)


def test_no_replacement_goes_to_an_avoided_node_whose_kept_ranks_stay() -> None:
    # Rank 1 (a straggler on node a) is replaced: not by node a's spare, nor in its own bundle.
    workers = world([("a", 2), ("b", 2)])
    plan = plan_restart(
        workers,
        dead={1},
        stuck=(),
        leaving_nodes=(),
        spares=[Seat(4, "a"), Seat(5, "c")],
        free_seats=[Seat(1, "a")],
        sizes=(4, 4),
        avoid_nodes={"a"},
    )
    assert (plan.kept, plan.spares, plan.fresh, plan.size, plan.node_order) == ((0, 2, 3), (1,), (), 4, ("a", "b"))


def test_node_loss_shrinks_an_elastic_world_and_keeps_the_node_order() -> None:
    workers = world([("a", 2), ("b", 2), ("c", 2)])
    plan = plan_restart(
        workers,
        dead={2, 3},
        stuck=(),
        leaving_nodes={"b"},
        spares=(),
        free_seats=(),
        sizes=(2, 6),
    )
    assert (plan.kept, plan.fresh, plan.size, plan.node_order) == ((0, 1, 4, 5), (), 4, ("a", "c"))
    assert not plan.missing


def test_spares_on_other_nodes_keep_the_size_after_a_node_loss() -> None:
    workers = world([("a", 2), ("b", 2)])
    plan = plan_restart(
        workers,
        dead={2, 3},
        stuck=(),
        leaving_nodes={"b"},
        spares=[Seat(4, "c"), Seat(5, "c"), Seat(6, "b")],
        free_seats=(),
        sizes=(2, 4),
    )
    assert (plan.kept, plan.spares, plan.size) == ((0, 1), (0, 1), 4)  # the spare on the lost node is not offered


def test_a_stuck_survivor_is_killed_and_replaced() -> None:
    workers = world([("a", 4)])
    plan = plan_restart(
        workers,
        dead={3},
        stuck={1},
        leaving_nodes=(),
        spares=(),
        free_seats=[Seat(1, "a"), Seat(3, "a")],
        sizes=(4, 4),
    )
    assert (plan.kept, plan.killed, plan.fresh, plan.size) == ((0, 2), (1,), (Seat(1, "a"), Seat(3, "a")), 4)


def test_ranks_on_a_draining_node_are_killed_not_kept() -> None:
    workers = world([("a", 2), ("b", 2)])
    plan = plan_restart(workers, dead=(), stuck=(), leaving_nodes={"b"}, spares=(), free_seats=(), sizes=(2, 4))
    assert (plan.kept, plan.killed, plan.size) == ((0, 1), (2, 3), 2)


def test_too_few_places_says_how_many_are_missing() -> None:
    workers = world([("a", 2), ("b", 2)])
    plan = plan_restart(workers, dead={2, 3}, stuck=(), leaving_nodes={"b"}, spares=(), free_seats=(), sizes=(4, 4))
    assert plan.missing == 2 and plan.size == 0


def test_the_replaced_ranks_own_bundles_come_first() -> None:
    workers = world([("a", 2), ("b", 2)])
    free = [Seat(7, "a"), Seat(3, "b"), Seat(6, "c")]
    plan = plan_restart(workers, dead={3}, stuck=(), leaving_nodes=(), spares=(), free_seats=free, sizes=(4, 4))
    assert plan.fresh == (Seat(3, "b"),)


def test_the_summary_says_what_was_kept_replaced_and_killed() -> None:
    workers = world([("a", 4)])
    plan = RestartPlan(kept=(0, 2), spares=(0,), fresh=(Seat(3, "a"),), killed=(1,), size=4, node_order=("a",))
    line = restart_summary(plan, workers, 4, 4, 0.84, 10.0)
    assert line.startswith(
        "raydist: warm restart: world size 4 (was 4): 2 rank(s) kept their process, 2 replaced (1 from a spare, 1 fresh)"
    )
    assert "rank 1 killed and replaced: rank 1 (node a, pid 101) had not returned 10 s after the failure" in line
    assert line.endswith("every rank initialised 0.84 s after the failure")
    assert "fresh processes" in restart_summary(None, [], 4, 4, 6.5, 10.0)


def test_spares_are_named_in_infeasibility_messages() -> None:
    nodes = [ClusterNode("a", "10.0.0.1", {"CPU": 4.0})]
    reason = infeasibility({"CPU": 1.0}, 5, "PACK", nodes, spares=1)
    assert reason is not None and reason.startswith("5 workers (4 + 1 spare) of {CPU: 1} each")


def test_a_request_counts_its_spares_and_names_them() -> None:
    from raydist.pool.rules.sizing import placement_request

    request = placement_request(RunConfig(num_workers=4, spare_workers=1), {"CPU": 1.0}, (4, 4), spares=1)
    assert request.sizes == (5, 5) and request.per_bundle == 1
    reason = request.infeasibility([ClusterNode("a", "10.0.0.1", {"CPU": 3.0})])
    assert reason is not None and reason.startswith("5 workers (4 + 1 spare) of {CPU: 1} each")
    assert placement_request(RunConfig(num_workers=4), {"CPU": 1.0}, (4, 4)).sizes == (4, 4)


def test_restart_options_are_checked() -> None:
    assert RunConfig().restart_mode == "warm" and RunConfig().survivor_timeout == 10.0
    for bad, message in (
        ({"restart_mode": "hot"}, "unknown restart_mode"),
        ({"spare_workers": -1}, "spare_workers must be >= 0"),
        ({"spare_workers": 1, "restart_mode": "fresh"}, "need restart_mode='warm'"),
        ({"survivor_timeout": 0}, "survivor_timeout must be a positive"),
        ({"spare_workers": 1, "num_nodes": 2, "workers_per_node": 2}, "a spare would have to be a whole node"),
    ):
        try:
            RunConfig(**bad)
        except (TypeError, ValueError) as error:
            assert message in str(error)
        else:
            raise AssertionError(f"{bad} accepted")


def test_a_spares_devices_count_in_its_nodes_visible_list() -> None:
    from raydist.core.accelerators import BY_NAME
    from raydist.pool.rules.layout import standby_env

    ranked = [Placement(i, "a", "10.0.0.1", 100 + i, (str(i),), 0) for i in range(2)]
    spare = Placement(2, "a", "10.0.0.1", 102, ("2",), 0)
    workers = assign_ranks(ranked, "a", standby=[spare])
    assert [w.visible_device_ids for w in workers] == [("0", "1", "2")] * 2
    assert [w.device_index for w in workers] == [0, 1]  # LOCAL_RANK still names the device
    env = standby_env(spare, [spare], ranked, BY_NAME["gpu"])
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1,2", "RAYDIST_DEVICE_INDEX": "2"}


class CountedRank(int):
    """A rank that counts how often it is compared with another (a lookup in a
    tuple compares with every element before it; one in a set, with one)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedRank.compared += 1
        return int(self) == other

    __hash__ = int.__hash__


def test_planning_a_restart_compares_each_rank_a_bounded_number_of_times() -> None:
    # A rank looked up in the tuple of kept ones made the plan quadratic: 80 ms at 4,096 ranks.
    size = 2000
    workers = [dataclasses.replace(w, rank=CountedRank(w.rank)) for w in world([(f"n{i}", 8) for i in range(size // 8)])]
    CountedRank.compared = 0
    plan = plan_restart(
        workers, dead={1}, stuck=[7], leaving_nodes=["n3"], spares=[Seat(size, "x")], free_seats=[Seat(1, "n0")], sizes=(1, size)
    )
    assert len(plan.kept) == size - 10 and plan.killed == (7, 24, 25, 26, 27, 28, 29, 30, 31)
    assert CountedRank.compared <= 4 * size
