"""The pre-flight health check with real workers: a node made slow for real
(its raylet and every process it starts at the lowest CPU priority, while
busy processes keep both cores taken) never hosts a rank, and the run's
summary says so, with the world's all_reduce figure."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, Iterator, List, Tuple

import psutil
import pytest
import ray
import torch
import torch.distributed as dist
from conftest import assert_nothing_left

import raydist

pytestmark = pytest.mark.timeout(300)
ONE_CPU = {"num_cpus": 1}


def slow_down(node: Any) -> None:
    """Give ``node``'s raylet and its processes (and so every worker it starts) the lowest priority."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    for process in [raylet, *raylet.children(recursive=True)]:
        try:
            process.nice(19)
        except psutil.NoSuchProcess:
            pass


@pytest.fixture
def both_cores_busy() -> Iterator[None]:
    """Two spinning processes at normal priority: a process at the lowest one then hardly runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def rank_node_and_sum() -> Tuple[str, float]:
    t = torch.ones(1)
    dist.all_reduce(t)
    return ray.get_runtime_context().get_node_id(), float(t.item())


@pytest.mark.nodes(ONE_CPU, *[ONE_CPU] * 4)
@pytest.mark.usefixtures("both_cores_busy")
def test_four_ranks_on_five_nodes_one_slow_for_real_never_start_a_rank_there(cluster: Any) -> None:
    slow = sorted(cluster.worker_nodes, key=lambda node: node.node_id)[0]
    slow_down(slow)
    try:
        # 4 ranks and a spare fill the 5 nodes: every node's worker is probed, and the
        # spare's place goes to the rank the slow node would have hosted.
        values = raydist.run(rank_node_and_sum, num_workers=4, spare_workers=1, health_check="quick", health_threshold=0.2)
        nodes: List[str] = [node for node, _ in values]
        assert [total for _, total in values] == [4.0] * 4
        assert slow.node_id not in nodes and len(set(nodes)) == 4
        line = next(line for line in str(values.summary).splitlines() if line.startswith("health check"))  # type: ignore[attr-defined]
        assert line.startswith("health check: 5 worker(s), ") and " GB/s, " in line, line  # the all_reduce's figure
        assert f"; excluded node {slow.node_id[:12]}: " in line and "below 0.2 x the median" in line, line
        assert_nothing_left(within=30)
    finally:
        cluster.remove_node(slow)  # the next test of this shape gets a new node, at normal priority
