"""Elastic worker groups on a simulated cluster (head + 2 nodes, 2 CPUs each):
min:max sizes, surviving node loss, growing back, acting on a node drain.

The ranks of a first attempt write a file when they run, so the test acts on
the cluster (removes, adds or drains a node) only once the run is under way.
Each worker asks for a node's 2 CPUs (``WHOLE_NODE``): one rank per node, so
a run starts half the processes and the cluster still fits fewer than the max.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import ray
import torch
import torch.distributed as dist
from conftest import drain_node, live_placement_groups
from marks import read_marks, write_mark

import raydist
from raydist import cli

NODE = {"num_cpus": 2}
pytestmark = [pytest.mark.timeout(240), pytest.mark.nodes(NODE, NODE, NODE)]
# One worker per node: every worker start costs seconds of imports, and the
# sizing, ordering and restarts under test work per worker whatever it asks for.
WHOLE_NODE = {"CPU": 2}


# -- on a live cluster ------------------------------------------------------------


def node_ids_in_order(cluster: Any) -> List[str]:
    head = ray.get_runtime_context().get_node_id()
    return [head] + [node.node_id for node in cluster.list_all_nodes() if node.node_id != head]


def where(marker_dir: Optional[str] = None) -> Dict[str, Any]:
    """This rank's view of the world; on a first attempt with ``marker_dir``,
    announce the run and keep all-reducing until the group is torn down."""
    info: Dict[str, Any] = {
        "rank": dist.get_rank(),
        "world": int(os.environ["WORLD_SIZE"]),
        "restart_count": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_rank": int(os.environ["GROUP_RANK"]),
        "preemption_file": os.environ.get("RAYDIST_PREEMPTION_FILE"),
    }
    if marker_dir is not None and info["restart_count"] == 0:
        write_mark(marker_dir, f"rank-{info['rank']}.json", info)
        while True:
            dist.all_reduce(torch.ones(1))
    return info


def wait_for_files(directory: Path, count: int, timeout: float = 120) -> List[Dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while len(list(directory.glob("rank-*.json"))) < count:
        assert time.monotonic() < deadline, f"only {len(list(directory.glob('rank-*.json')))} of {count} ranks started"
        time.sleep(0.1)  # polling files the ranks write, with a deadline
    return read_marks(directory)


def wait_until_idle(timeout: float = 30) -> None:
    """Until every alive node's CPUs show as free (Ray frees a torn-down group's a moment later)."""
    from raydist.pool.ray_private import available_resources_per_node

    deadline = time.monotonic() + timeout
    while True:
        totals = {n["NodeID"]: n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]}
        free = available_resources_per_node()
        if all(free.get(node, {}).get("CPU", 0) >= cpus for node, cpus in totals.items()):
            return
        assert time.monotonic() < deadline, f"cluster not idle: free {free}"
        time.sleep(0.1)  # polling Ray's view, with a deadline


def run_in_thread(idle_first: bool = True, **options: Any) -> Dict[str, Any]:
    if idle_first:
        wait_until_idle()
    outcome: Dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["results"] = raydist.run(where, **options)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    outcome["thread"] = threading.Thread(target=target)
    outcome["thread"].start()
    return outcome


def finish(outcome: Dict[str, Any], timeout: float = 180) -> List[Dict[str, Any]]:
    outcome["thread"].join(timeout)
    assert not outcome["thread"].is_alive(), "the run did not finish"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["results"]


@pytest.mark.soak  # the engine's logic, on the fake cluster in the unit tier: test_engine_faults elastic rows; a real elastic start: test_losing_a_node_restarts_with_the_workers_that_fit
def test_min_max_starts_as_many_as_fit(cluster: Any) -> None:
    wait_until_idle()
    results = raydist.run(where, num_workers=(2, 6), resources_per_worker=WHOLE_NODE)
    assert [r["world"] for r in results] == [3] * 3  # as many as fit, below the max
    assert len({r["node_id"] for r in results}) == 3


def test_min_that_can_never_fit_fails_at_once(cluster: Any) -> None:
    start = time.monotonic()
    with pytest.raises(raydist.InfeasibleResourcesError, match="7 workers"):
        raydist.run(where, num_workers=(7, 9))
    assert time.monotonic() - start < 10


@pytest.mark.soak  # a wait on a cluster that grows (the min/max start runs in make test)
def test_min_that_fits_only_later_waits_with_progress_then_starts(cluster: Any, capfd: pytest.CaptureFixture) -> None:
    wait_until_idle()
    # Another job holds two nodes (a placement group: no processes to start), leaving room for 1.
    blocker = ray.util.placement_group([WHOLE_NODE, WHOLE_NODE], strategy="STRICT_SPREAD")
    ray.get(blocker.ready(), timeout=60)
    outcome = run_in_thread(idle_first=False, num_workers=(2, 3), resources_per_worker=WHOLE_NODE, startup_timeout=120)
    deadline = time.monotonic() + 60
    seen = ""
    while "raydist: workers placed" not in seen:  # the progress bar appears after a few seconds
        assert time.monotonic() < deadline, "no progress shown while waiting"
        seen += capfd.readouterr().err
        time.sleep(0.2)  # polling the captured output, with a deadline
    assert outcome["thread"].is_alive()  # still waiting for room for 2
    ray.util.remove_placement_group(blocker)
    results = finish(outcome)
    assert len(results) >= 2 and {r["world"] for r in results} == {len(results)}


def test_losing_a_node_restarts_with_the_workers_that_fit(cluster: Any, tmp_path: Path) -> None:
    order = node_ids_in_order(cluster)
    outcome = run_in_thread(num_workers=(2, 6), args=(str(tmp_path),), max_restarts=1, resources_per_worker=WHOLE_NODE)
    first = wait_for_files(tmp_path, 3)
    first_order = [r["node_id"] for r in sorted(first, key=lambda r: r["rank"])]
    middle = list(dict.fromkeys(first_order))[1]  # a node with survivors after it
    victim = next(node for node in cluster.list_all_nodes() if node.node_id == middle)
    cluster.remove_node(victim)
    results = finish(outcome)
    assert [r["world"] for r in results] == [2] * 2
    assert {r["restart_count"] for r in results} == {1}
    survivors = [node for node in dict.fromkeys(first_order) if node != middle]
    assert list(dict.fromkeys(r["node_id"] for r in results)) == survivors  # same order, the gap closed
    assert order[0] == survivors[0]  # the driver's node stays first


@pytest.mark.soak  # a cluster that grows (a node loss's restart runs in make test)
def test_a_node_that_joins_is_used_after_a_restart_to_grow(cluster: Any, tmp_path: Path) -> None:
    # Start from two nodes, whichever test ran on this cluster before.
    extra = len([n for n in ray.nodes() if n["Alive"]]) - 2
    for node in list(cluster.worker_nodes)[:extra]:
        cluster.remove_node(node)
    cluster.wait_for_nodes()
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    outcome = run_in_thread(num_workers=(2, 6), args=(str(tmp_path),), restart_to_grow=True, resources_per_worker=WHOLE_NODE)
    wait_for_files(tmp_path, 2)
    cluster.add_node(**NODE)
    results = finish(outcome)
    assert [r["world"] for r in results] == [3] * 3
    assert {r["restart_count"] for r in results} == {1}


def preemptible(marker_dir: str) -> Dict[str, Any]:
    """Like ``where``, but a first-attempt rank that gets SIGTERM records what
    raydist.preemption_requested() said, as a checkpointing handler would."""
    if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) == 0:

        def on_sigterm(signum: int, frame: Any) -> None:
            Path(marker_dir, f"preempted-{dist.get_rank()}.json").write_text(
                json.dumps({"deadline": raydist.preemption_requested(), "at": time.time()})
            )
            sys.exit(1)

        signal.signal(signal.SIGTERM, on_sigterm)
    return where(marker_dir)


def test_a_drained_node_warns_its_ranks_and_the_restart_is_not_counted(cluster: Any, tmp_path: Path) -> None:
    outcome: Dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["results"] = raydist.run(
                preemptible, args=(str(tmp_path),), num_workers=(2, 6), max_restarts=0, resources_per_worker=WHOLE_NODE
            )
        except BaseException as error:  # noqa: BLE001
            outcome["error"] = error

    wait_until_idle()
    outcome["thread"] = threading.Thread(target=target)
    outcome["thread"].start()
    first = wait_for_files(tmp_path, 3)
    head = ray.get_runtime_context().get_node_id()
    drained = next(r["node_id"] for r in first if r["node_id"] != head)
    ranks_there = sorted(r["rank"] for r in first if r["node_id"] == drained)
    drained_at = time.time()
    drain_node(cluster.address, drained, deadline_s=20)
    results = finish(outcome)
    # The note each rank read its deadline from went with its process (nothing is left behind).
    assert not any(Path(rank["preemption_file"]).exists() for rank in first)
    # Ranks there got SIGTERM, no others: a handler read the deadline (preemption_requested())
    # before the node went. (A rank blocked in a collective with a peer that already left may
    # be torn down before its handler runs.)
    warned = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in tmp_path.glob("preempted-*.json")}
    assert warned and set(warned) <= set(ranks_there)
    for note in warned.values():
        assert 15 <= note["deadline"] - drained_at <= 25
        assert note["at"] < drained_at + 20
    assert [r["world"] for r in results] == [2] * 2 and {r["restart_count"] for r in results} == {1}
    assert drained not in {r["node_id"] for r in results}
    assert live_placement_groups() == []


@pytest.mark.soak  # the CLI's --nnodes MIN:MAX; the API's min/max runs in make test
def test_cli_nnodes_min_max(cluster: Any, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    # In this process, attached to the cluster: a subprocess would only add its imports.
    script = tmp_path / "world.py"
    script.write_text(
        "import os, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print(f\"rank {dist.get_rank()} world {dist.get_world_size()} restart {os.environ['TORCHELASTIC_RESTART_COUNT']}\", flush=True)\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    alive = sum(1 for n in ray.nodes() if n["Alive"] and n["NodeID"] not in _draining())
    # -n 1 on 2-CPU nodes: whole nodes of one rank each (packing would start 2 a node).
    for nnodes, expected in (("1:3", alive), ("2", 2)):
        wait_until_idle()
        capfd.readouterr()
        status = cli.main(["run", "--address", cluster.address, "--nnodes", nnodes, "-n", "1", "--accelerator", "cpu", str(script)])
        out, err = capfd.readouterr()
        assert status == 0, f"--nnodes {nnodes}: {out}{err}"
        assert out.count(f"world {expected} restart 0") == expected, f"--nnodes {nnodes}: {out}{err}"


def _draining() -> Dict[str, float]:
    from raydist.pool.ray_private import draining_nodes

    return draining_nodes()


@pytest.mark.soak  # a second drain case (a drained node's warning runs in make test)
def test_draining_the_drivers_node_fails_at_once_instead_of_restarting(cluster: Any, tmp_path: Path) -> None:
    # Last in this module: it leaves the head draining. Ray starts no new
    # actors anywhere while the driver's node drains, so a restart could only hang.
    outcome = run_in_thread(num_workers=(2, 6), args=(str(tmp_path),), startup_timeout=120, resources_per_worker=WHOLE_NODE)
    wait_for_files(tmp_path, sum(1 for n in ray.nodes() if n["Alive"]))
    head = ray.get_runtime_context().get_node_id()
    started = time.monotonic()
    drain_node(cluster.address, head, deadline_s=60)
    outcome["thread"].join(60)
    assert not outcome["thread"].is_alive(), "the run hung instead of failing"
    assert isinstance(outcome.get("error"), raydist.WorkerGroupError), outcome
    assert head in outcome["error"].preempted_nodes
    assert time.monotonic() - started < 45
