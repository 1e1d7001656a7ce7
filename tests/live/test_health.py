"""The pre-flight health check with real workers: a node made slow for real
never hosts a rank, and the run's summary says so, with the world's
all_reduce figure.

The slow node: its raylet and every process it starts (its workers) run on
one core, beside a busy process pinned to the same core; once its worker
runs the timed probe (its process title says so), that worker drops to
the lowest priority, nice 19, and gets almost nothing of the core, while
the others (unpinned) get a quarter to a half of a core. It starts at the
normal priority, so its start (torch's import) is not starved.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any, Iterator, List, Tuple

import psutil
import pytest
import ray
import torch
import torch.distributed as dist
from conftest import assert_nothing_left

import raydist

pytestmark = pytest.mark.timeout(420)
ONE_CPU = {"num_cpus": 1}
CORE = max(os.sched_getaffinity(0))  # the slow node's core
SPIN = "import ctypes, signal; ctypes.CDLL(None).prctl(1, signal.SIGKILL)\nwhile True: pass"  # dies with the test process
TIMED = "ray::RayWorker.probe"  # a worker's process title while it runs the timed probe (not "probe_ready")


def slow_down(node: Any, stop: threading.Event) -> threading.Thread:
    """``node``'s raylet and its processes (and so every worker it starts) on
    CORE; a watcher gives each of its workers nice 19 once it runs the timed probe."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    for process in [raylet, *raylet.children(recursive=True)]:
        try:
            process.cpu_affinity([CORE])
        except psutil.NoSuchProcess:
            pass

    def watch() -> None:
        while not stop.is_set():
            for child in raylet.children(recursive=True):
                try:
                    title = " ".join(child.cmdline()).strip()
                    if title == TIMED and child.nice() != 19:
                        child.nice(19)
                except psutil.Error:
                    pass
            stop.wait(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


@pytest.fixture
def core_busy() -> Iterator[None]:
    """A spinning process at the normal priority on CORE."""
    spinner = subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=lambda: os.sched_setaffinity(0, {CORE}))
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def rank_node_and_sum() -> Tuple[str, float]:
    t = torch.ones(1)
    dist.all_reduce(t)
    return ray.get_runtime_context().get_node_id(), float(t.item())


@pytest.mark.nodes(ONE_CPU, *[ONE_CPU] * 4)
@pytest.mark.soak  # five nodes' workers started on two cores; the verdict's logic: tests/unit (test_engine_health)
@pytest.mark.usefixtures("core_busy")
def test_four_ranks_on_five_nodes_one_slow_for_real_never_start_a_rank_there(cluster: Any) -> None:
    slow = sorted(cluster.worker_nodes, key=lambda node: node.node_id)[0]
    stop = threading.Event()
    watcher = slow_down(slow, stop)
    try:
        # 4 ranks and a spare fill the 5 nodes: every node's worker is probed, and the
        # spare's place goes to the rank the slow node would have hosted.
        # Threshold 0.2: the healthy workers share this machine's two cores, so their own figures
        # spread by about 2x; the slow node's is some 40x below theirs.
        values = raydist.run(rank_node_and_sum, num_workers=4, spare_workers=1, health_check="quick", health_threshold=0.2)
        nodes: List[str] = [node for node, _ in values]
        assert [total for _, total in values] == [4.0] * 4
        assert slow.node_id not in nodes and len(set(nodes)) == 4
        line = next(line for line in str(values.summary).splitlines() if line.startswith("health check"))  # type: ignore[attr-defined]
        assert line.startswith("health check: 5 worker(s), ") and " GB/s, " in line, line  # the all_reduce's figure
        assert f"; excluded node {slow.node_id[:12]}: " in line and "below 0.2 x the median" in line, line
        # The excluded node's killed worker left its files there: no agent starts on an excluded
        # node, and the next worker start on that machine removes them (as a lost node's).
        assert_nothing_left(within=30, files=False)
    finally:
        stop.set()
        watcher.join()
        cluster.remove_node(slow)  # the next test of this shape gets a new node, at normal priority
