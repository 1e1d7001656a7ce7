"""The pre-flight health check (``health_check``), on the fake cluster: every
new worker's probe is judged against the median before any rank runs; an
unhealthy worker's node hosts no rank for the rest of the run, a spare takes
its place, an elastic world shrinks, and with too few healthy workers the
run fails before any user code, naming the node, the figure and the median."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from raydist.config import RunConfig
from raydist.errors import InfeasibleResourcesError, WorkerGroupError
from raydist.pool.driver.calls import prepare_call
from raydist.pool.driver.controller import RunController, run_call
from raydist.pool.driver.group import WorkerGroup
from raydist.testing.fake import FakeCluster, Fault
from raydist.testing.workers import current_attempt, current_rank

FIVE_NODES = {f"node-{name}": {"CPU": 1} for name in "abcde"}
SLOW = {"node-c": 10.0}  # GFLOP/s; the others measure 100


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="raydist")


def group_on(cluster: FakeCluster, **options: Any) -> WorkerGroup:
    return WorkerGroup(config=RunConfig(**{"num_workers": 4, "health_check": "quick", **options}), cluster=cluster)


def test_four_ranks_on_five_nodes_one_slow_never_start_a_rank_on_the_slow_node() -> None:
    cluster = FakeCluster(FIVE_NODES, speeds=SLOW)
    with group_on(cluster, spare_workers=1) as group:
        assert "node-c" not in {w.node_id for w in group.workers} and len(group.workers) == 4
        assert group.spares == []  # the spare's place went to the slow node's rank
        assert group.run(current_rank) == [0, 1, 2, 3]
        line = str(group.summary()).splitlines()[-1]
    assert line.startswith("health check: 5 worker(s), 100 GFLOP/s median (lowest 10), ")
    assert line.endswith("; excluded node node-c: 10 GFLOP/s, below 0.5 x the median 100 GFLOP/s")
    assert cluster.leftovers() == []


def test_without_a_spare_the_workers_are_placed_again_without_the_slow_node() -> None:
    cluster = FakeCluster(FIVE_NODES, speeds=SLOW)
    with group_on(cluster) as group:
        assert sorted(w.node_id for w in group.workers) == ["node-a", "node-b", "node-d", "node-e"]
        assert group.run(current_rank) == [0, 1, 2, 3]
        checks = [line for line in str(group.summary()).splitlines() if line.startswith("health check")]
    assert len(checks) == 2 and "excluded node node-c" in checks[0] and "excluded" not in checks[1]
    assert len(cluster.processes.workers) == 8  # the first placement's 4, then 4 without node-c
    assert cluster.leftovers() == []


def test_without_a_replacement_the_run_fails_before_any_user_code_naming_node_figure_and_median() -> None:
    cluster = FakeCluster({f"node-{name}": {"CPU": 1} for name in "abcd"}, speeds=SLOW)
    with pytest.raises(InfeasibleResourcesError) as failed:
        group_on(cluster)
    assert str(failed.value).endswith(
        "(health check: 3 healthy worker(s) left, 4 needed: node node-c: 10 GFLOP/s, below 0.5 x the median 100 GFLOP/s)"
    ), str(failed.value)
    assert not [w for w in cluster.processes.workers if w.rank is not None]  # no rank was ever set up
    assert cluster.leftovers() == []


def test_an_elastic_world_shrinks_past_an_unhealthy_node() -> None:
    cluster = FakeCluster({f"node-{name}": {"CPU": 1} for name in "abcd"}, speeds=SLOW)
    with group_on(cluster, num_workers=(2, 4)) as group:
        assert sorted(w.node_id for w in group.workers) == ["node-a", "node-b", "node-d"]
    assert cluster.leftovers() == []


def test_a_probe_that_fails_is_unhealthy_whatever_the_others_measure() -> None:
    cluster = FakeCluster(FIVE_NODES, speeds={"node-b": 0.0})
    with group_on(cluster, spare_workers=1) as group:
        assert "node-b" not in {w.node_id for w in group.workers}
        assert "excluded node node-b: its probe failed: RuntimeError: the device did not answer" in str(group.summary())
    assert cluster.leftovers() == []


def test_a_threshold_below_the_slow_figure_keeps_the_node() -> None:
    cluster = FakeCluster(FIVE_NODES, speeds=SLOW)
    with group_on(cluster, spare_workers=1, health_threshold=0.05) as group:
        assert "node-c" in {w.node_id for w in group.workers} | {s.node_id for s in group.spares}
    assert cluster.leftovers() == []


def test_on_cpu_workers_auto_probes_nothing() -> None:
    # "auto" (the default) is off on CPUs: ranks sharing cores say nothing of their node.
    cluster = FakeCluster({f"node-{name}": {"CPU": 1} for name in "abcd"}, speeds=SLOW)
    with WorkerGroup(config=RunConfig(num_workers=4), cluster=cluster) as group:
        assert "node-c" in {w.node_id for w in group.workers}
        assert "health check" not in str(group.summary())
    assert cluster.leftovers() == []


GPU_NODES = {f"node-{name}": {"CPU": 1, "GPU": 1} for name in "abcde"}


def test_on_gpu_workers_auto_is_the_quick_check() -> None:
    cluster = FakeCluster(GPU_NODES, speeds=SLOW)
    with WorkerGroup(config=RunConfig(num_workers=4, spare_workers=1, accelerator="gpu"), cluster=cluster) as group:
        assert "node-c" not in {w.node_id for w in group.workers}
        assert "excluded node node-c" in str(group.summary())
    assert cluster.leftovers() == []


@pytest.mark.parametrize("option", ["auto", "quick"])
def test_gpus_torch_cannot_see_are_judged_only_when_the_check_was_asked_for(option: str) -> None:
    # Ray only counts the GPUs (as on a test cluster): every worker falls back to its
    # CPU, where "auto" is off; an explicit "quick" still compares the CPU figures.
    cluster = FakeCluster(GPU_NODES, speeds=SLOW)
    cluster.processes.hide_devices()
    with WorkerGroup(config=RunConfig(num_workers=4, spare_workers=1, accelerator="gpu", health_check=option), cluster=cluster) as group:
        nodes = {w.node_id for w in group.workers} | {s.node_id for s in group.spares}
        summary = str(group.summary())
    if option == "auto":
        assert "node-c" in nodes and "health check" not in summary
    else:
        assert "node-c" not in nodes and "excluded node node-c" in summary
    assert cluster.leftovers() == []


def test_a_spare_started_later_on_a_node_gone_slow_is_dropped_and_its_node_excluded() -> None:
    # Rank 1 dies; the spare takes its place, and the used spare's replacement starts in
    # rank 1's freed bundle on node-b, which has gone slow meanwhile: held to the first
    # check's median, it never becomes a spare.
    cluster = FakeCluster(FIVE_NODES, [Fault("execute", "die", who=1)])
    with group_on(cluster, spare_workers=1, max_restarts=1) as group:
        assert [s.node_id for s in group.spares] == ["node-e"]
        cluster.processes.set_speed("node-b", 10.0)
        with pytest.raises(WorkerGroupError):
            group.run(current_rank)
        cluster.sleep(10)  # the refill starts after REFILL_DELAY_S
        assert group.spares == [] and group.run(current_rank) == [0, 1, 2, 3]
        assert "excluded node node-b: 10 GFLOP/s, below 0.5 x the median 100 GFLOP/s" in str(group.summary())
    assert cluster.leftovers() == []


def test_a_replacement_on_a_node_gone_slow_sends_the_run_to_a_placement_without_it() -> None:
    # No spare: the warm restart starts rank 1's replacement in its bundle on node-b, gone
    # slow; it fails its check, and raydist.run starts afresh on the four other nodes.
    cluster = FakeCluster(FIVE_NODES, [Fault("execute", "die", who=1)])
    run = RunController(cluster, RunConfig(num_workers=4, max_restarts=1, health_check="quick"), fresh_restarts=True)
    cluster.processes.set_speed("node-b", 10.0)
    values = run_call(run, prepare_call(cluster, lambda: (current_rank(), current_attempt())))
    assert values == [(rank, 1) for rank in range(4)]
    assert "node-b" not in {w.node_id for w in run.attempt.workers}  # type: ignore[union-attr]
    assert cluster.leftovers() == []
