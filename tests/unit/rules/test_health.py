"""The pre-flight check's verdict (pure): which workers may host a rank."""

from __future__ import annotations

from raydist.core.accelerators import BY_NAME, CPU
from raydist.pool.rules.health import Probed, Unhealthy, Verdict, health_mode, judge, judged, split_healthy


def probed(*figures: float, node_of: str = "abcdefgh") -> list:
    return [
        Probed(i, f"node-{node_of[i]}", figure if figure > 0 else None, "" if figure > 0 else "OOM") for i, figure in enumerate(figures)
    ]


def test_a_worker_below_the_threshold_of_the_other_nodes_median_is_unhealthy() -> None:
    verdict = judge(probed(100, 98, 40, 102), threshold=0.5)
    assert verdict == Verdict(99.0, (Unhealthy(2, "node-c", "40 GFLOP/s, below 0.5 x the median 100 GFLOP/s"),))
    assert judge(probed(100, 98, 60, 102), threshold=0.5).unhealthy == ()


def test_a_failed_probe_is_unhealthy_and_not_in_the_median() -> None:
    verdict = judge(probed(100, 0, 90), threshold=0.5)
    assert verdict.median == 95.0 and verdict.unhealthy == (Unhealthy(1, "node-b", "its probe failed: OOM"),)


def test_a_reference_median_judges_a_lone_worker() -> None:
    # A spare started later: one figure has no median of its own.
    assert judge(probed(30), threshold=0.5, reference=100.0).nodes == ["node-a"]
    assert judge(probed(30), threshold=0.5).unhealthy == ()


def test_the_unit_excluded_is_the_node_and_spares_fill_in() -> None:
    # Workers 0-1 on node a, 2-3 on node b (slow), 4-5 on node c: a world of 4 with 2 spares.
    figures = probed(100, 100, 10, 100, 100, 100, node_of="aabbcc")
    verdict = judge(figures, threshold=0.5)
    assert verdict.nodes == ["node-b"] and verdict.text().startswith("node node-b: 10 GFLOP/s")
    assert split_healthy(figures, verdict, world=4, minimum=4) == ([0, 1, 4, 5], 0, None)
    kept, spares, why = split_healthy(figures, verdict, world=5, minimum=5)
    assert (kept, spares) == (
        [0, 1, 4, 5],
        0,
    ) and why == "4 healthy worker(s) left, 5 needed: node node-b: 10 GFLOP/s, below 0.5 x the median 100 GFLOP/s"
    assert split_healthy(figures, verdict, world=5, minimum=3)[2] is None  # an elastic world shrinks to 4


def test_auto_probes_accelerators_and_not_cpus() -> None:
    assert health_mode("auto", CPU) is None and health_mode("auto", BY_NAME["gpu"]) == "quick"
    assert health_mode("off", BY_NAME["gpu"]) is None and health_mode("thorough", CPU) == "thorough"


def test_auto_judges_nothing_where_torch_sees_none_of_the_accelerators() -> None:
    gpu = BY_NAME["gpu"]
    assert not judged("auto", gpu, ["cpu", "cpu"])  # GPUs only counted: the CPU case
    assert judged("auto", gpu, ["cuda:0", "cpu"])  # one fell back beside others: far below them, judged
    assert judged("quick", gpu, ["cpu", "cpu"]) and judged("auto", CPU, ["cpu"])  # asked for / "auto" never probes CPUs anyway


def test_a_node_is_compared_with_the_others_never_with_itself() -> None:
    # Workers sharing one node's cores slow each other: one node alone has nothing to compare with.
    assert judge(probed(100, 30, 60, 20, node_of="aaaa"), threshold=0.5).unhealthy == ()
    # Two nodes, one at half speed or less: only it; half the workers slow no longer drag the median down.
    verdict = judge(probed(100, 100, 10, 10, node_of="aabb"), threshold=0.5)
    assert verdict.nodes == ["node-b"] and verdict.unhealthy[0].why == "10 GFLOP/s, below 0.5 x the median 100 GFLOP/s"
    assert judge(probed(100, 0, node_of="aa"), threshold=0.5).nodes == ["node-a"]  # a failed probe counts anywhere


def test_the_median_of_the_other_nodes_is_exact() -> None:
    # Nodes of 1 to 3 workers, figures with repeats: each node's reference is the median of the rest.
    import statistics

    figures = [50, 60, 60, 70, 80, 80, 80, 90, 20]
    nodes = "aabcccdde"
    verdict = judge(probed(*figures, node_of=nodes), threshold=0.9)
    for bad in verdict.unhealthy:
        rest = [f for f, n in zip(figures, nodes) if f"node-{n}" != bad.node_id]
        assert bad.why.endswith(f"the median {statistics.median(rest):.3g} GFLOP/s")
    assert {bad.node_id for bad in verdict.unhealthy} == {"node-a", "node-b", "node-e"}
