"""torchrun's layout on a simulated cluster of 3 nodes with 4 CPUs each:
``--nnodes N -n P`` is exactly P ranks on each of N distinct nodes (through
the API and the CLI, 20 runs each), what cannot be met fails at once naming
the nodes, node selection (labels, excluded nodes) is honoured, and an
elastic ``--nnodes MIN:MAX`` run shrinks in whole nodes after a node loss.

One cluster for the module; the node-loss test puts a node back. Runs use
the fewest workers that still tell the layout apart (2 per node where the
local ranks are checked, 1 where only the nodes are): every worker start
costs seconds of imports."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import ray
import ray.cloudpickle
from conftest import live_placement_groups, repeats
from marks import write_mark

import raydist
from raydist import cli

# Workers unpickle this module's functions by value: tests/live is not on their path.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

HEAD = {"num_cpus": 4, "labels": {"zone": "a"}}
NODES = [{"num_cpus": 4, "labels": {"zone": "a"}}, {"num_cpus": 4, "labels": {"zone": "b"}}]
pytestmark = [pytest.mark.timeout(600), pytest.mark.nodes(HEAD, *NODES)]
QUICK_FAIL_S = 10.0
ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RESTART_COUNT",
)

SCRIPT = """\
import json, os, sys
import ray
out = {k: os.environ[k] for k in %r}
out["node_id"] = ray.get_runtime_context().get_node_id()
with open(os.path.join(sys.argv[1], "rank-" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump(out, f)
""" % (ENV_KEYS,)


def seen(marker_dir: Optional[str] = None) -> Dict[str, Any]:
    """This rank's launcher variables and node; on a first attempt with
    ``marker_dir``, announce itself and wait there until the group is torn down."""
    info: Dict[str, Any] = {key: os.environ[key] for key in ENV_KEYS}
    info["node_id"] = ray.get_runtime_context().get_node_id()
    if marker_dir is not None and info["TORCHELASTIC_RESTART_COUNT"] == "0":
        write_mark(marker_dir, f"rank-{info['RANK']}.json", info)
        threading.Event().wait()  # until the node loss tears the group down
    return info


def check_layout(ranks: List[Dict[str, Any]], nodes: int, per_node: int) -> List[str]:
    """torchrun's promise, on what every rank saw; returns the node ids in node-rank order."""
    assert len(ranks) == nodes * per_node
    order: List[str] = []
    for rank, info in enumerate(ranks):
        group_rank, local_rank = divmod(rank, per_node)
        assert (int(info["RANK"]), int(info["GROUP_RANK"]), int(info["LOCAL_RANK"])) == (rank, group_rank, local_rank), info
        assert (int(info["WORLD_SIZE"]), int(info["LOCAL_WORLD_SIZE"]), int(info["GROUP_WORLD_SIZE"])) == (
            nodes * per_node,
            per_node,
            nodes,
        ), info
        if local_rank == 0:
            order.append(info["node_id"])
        assert info["node_id"] == order[group_rank], f"rank {rank} is not on node {group_rank}'s node"
    assert len(set(order)) == nodes, "two node ranks share a node"
    return order


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


def node_ids(cluster: Any) -> Dict[str, str]:
    """zone-a head, zone-a worker, zone-b worker -> node ids."""
    head = ray.get_runtime_context().get_node_id()
    labels = {n["NodeID"]: n["Labels"].get("zone") for n in ray.nodes() if n["Alive"]}
    others = [node for node in labels if node != head]
    return {"head": head, "a": next(n for n in others if labels[n] == "a"), "b": next(n for n in others if labels[n] == "b")}


# 2 per node on 4-CPU nodes: both nodes' workers would fit on one, so distinct nodes are the layout's doing.
@pytest.mark.timeout(1200)  # up to 20 groups of 4 fresh workers, each importing torch
@repeats(1, 20, every_session=6)  # quick: once through WorkerGroup (its workers' nodes checked too); soak: run() as well
def test_two_nodes_of_three_through_the_api_every_time(cluster: Any, repeat: int) -> None:
    start = time.monotonic()
    for _ in range(repeat // 2):
        check_layout(raydist.run(seen, num_nodes=2, workers_per_node=2, accelerator="cpu"), 2, 2)
    for _ in range(repeat - repeat // 2):
        with raydist.WorkerGroup(num_nodes=2, workers_per_node=2, accelerator="cpu") as group:
            ranks = group.run(seen)
            check_layout(ranks, 2, 2)
            assert [w.node_id for w in group.workers] == [r["node_id"] for r in ranks]
    print(f"{repeat} API runs of --nnodes 2 -n 2: {time.monotonic() - start:.1f} s", file=sys.stderr)
    assert live_placement_groups() == []


def run_cli(argv: List[str], capfd: pytest.CaptureFixture) -> Dict[str, Any]:
    """``raydist run ARGV`` in this process (attached to the test's cluster): status, output, seconds."""
    start = time.monotonic()
    status = cli.main(["run", "--address", ray.get_runtime_context().gcs_address, *argv])
    seconds = time.monotonic() - start
    out, err = capfd.readouterr()
    return {"status": status, "out": out, "err": err, "seconds": seconds}


@pytest.mark.timeout(1200)
@repeats(0, 20, every_session=6)  # soak only: the CLI entry point of the layout the API's test checks in make test
def test_two_nodes_of_three_through_the_cli_every_time(cluster: Any, tmp_path: Path, capfd: pytest.CaptureFixture, repeat: int) -> None:
    script = tmp_path / "layout.py"
    script.write_text(SCRIPT)
    start = time.monotonic()
    for run in range(repeat):
        out_dir = tmp_path / f"run-{run}"
        out_dir.mkdir()
        result = run_cli(["--nnodes", "2", "-n", "2", "--accelerator", "cpu", "--role", "trainer", str(script), str(out_dir)], capfd)
        assert result["status"] == 0, result
        ranks = [json.loads((out_dir / f"rank-{rank}.json").read_text()) for rank in range(4)]
        check_layout(ranks, 2, 2)
        assert {r["ROLE_NAME"] for r in ranks} == {"trainer"}
    print(f"{repeat} CLI runs of --nnodes 2 -n 2: {time.monotonic() - start:.1f} s", file=sys.stderr)


def test_more_nodes_than_can_hold_them_fails_at_once_naming_the_nodes(cluster: Any, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    script = tmp_path / "layout.py"
    script.write_text(SCRIPT)
    result = run_cli(["--nnodes", "4", "-n", "3", "--accelerator", "cpu", str(script), str(tmp_path)], capfd)
    assert result["status"] == 1 and result["seconds"] < QUICK_FAIL_S, result
    message = result["err"]
    assert "4 distinct nodes that can each hold 3" in message and "only 3 of the cluster's 3 node(s) can" in message, message
    for node_id in node_ids(cluster).values():
        assert f"node {node_id[:12]}" in message and "holds 4" in message, message
    start = time.monotonic()
    with pytest.raises(raydist.InfeasibleResourcesError, match="only 0 of the cluster's 3 node"):
        raydist.run(seen, num_nodes=1, workers_per_node=5, accelerator="cpu")
    assert time.monotonic() - start < QUICK_FAIL_S
    assert live_placement_groups() == []


@pytest.mark.soak  # make test: label matching in tests/unit/rules (sizing), a real selection by test_an_excluded_node_is_never_used
def test_a_label_selector_is_honoured(cluster: Any) -> None:
    ids = node_ids(cluster)
    ranks = raydist.run(seen, num_nodes=2, workers_per_node=1, accelerator="cpu", label_selector={"zone": "a"})
    assert set(check_layout(ranks, 2, 1)) == {ids["head"], ids["a"]}
    ranks = raydist.run(
        seen, num_nodes=2, workers_per_node=1, accelerator="cpu", label_selector="zone=in(b, a),zone2=!x", startup_timeout=60
    )
    check_layout(ranks, 2, 1)
    packed = raydist.run(seen, num_workers=2, accelerator="cpu", label_selector={"zone": "!a"})  # without --nnodes
    assert {r["node_id"] for r in packed} == {ids["b"]}


def test_an_unmatched_label_fails_at_once_saying_which_nodes_matched(cluster: Any) -> None:
    ids = node_ids(cluster)
    start = time.monotonic()
    with pytest.raises(raydist.InfeasibleResourcesError) as raised:
        raydist.run(seen, num_nodes=1, workers_per_node=1, accelerator="cpu", label_selector={"zone": "c"})
    assert time.monotonic() - start < QUICK_FAIL_S
    assert "no node of 3 matches label_selector {zone: c}" in str(raised.value), raised.value
    assert all(f"node {node[:12]}" in str(raised.value) for node in ids.values())
    with pytest.raises(raydist.InfeasibleResourcesError) as raised:
        raydist.run(seen, num_nodes=2, workers_per_node=1, accelerator="cpu", label_selector={"zone": "b"})
    assert f"only 1 of the 1 node(s) that match label_selector {{zone: b}} can: node {ids['b'][:12]}" in str(raised.value)
    with pytest.raises(raydist.InfeasibleResourcesError, match="no node of 3 matches label_selector {zone: c}"):
        raydist.run(seen, num_workers=1, accelerator="cpu", label_selector={"zone": "c"})  # without --nnodes too
    assert time.monotonic() - start < 3 * QUICK_FAIL_S
    assert live_placement_groups() == []


def test_an_excluded_node_is_never_used(cluster: Any, capfd: pytest.CaptureFixture, tmp_path: Path) -> None:
    ids = node_ids(cluster)
    ranks = raydist.run(seen, num_nodes=2, workers_per_node=1, accelerator="cpu", exclude_nodes=(ids["head"],))
    assert set(check_layout(ranks, 2, 1)) == {ids["a"], ids["b"]}
    packed = raydist.run(seen, num_workers=2, accelerator="cpu", exclude_nodes=f"{ids['a'][:8]},{ids['b']}")
    assert {r["node_id"] for r in packed} == {ids["head"]}
    # The simulated nodes share one IP: excluding it leaves none, and the message says so.
    script = tmp_path / "layout.py"
    script.write_text(SCRIPT)
    ip = ray.nodes()[0]["NodeManagerAddress"]
    result = run_cli(["--nnodes", "1", "--accelerator", "cpu", "--exclude-nodes", ip, str(script), str(tmp_path)], capfd)
    assert result["status"] == 1 and result["seconds"] < QUICK_FAIL_S, result
    assert f"only 0 of the 0 node(s) that match exclude_nodes {ip} can" in result["err"], result["err"]


def test_no_python_runs_a_program_and_its_status_comes_back(cluster: Any, capfd: pytest.CaptureFixture, tmp_path: Path) -> None:
    # Rank 1 fails only once rank 0 has printed and ended: a failure stops the
    # other ranks (as torchrun does), so a rank 0 still starting would never print.
    done = tmp_path / "rank-0-done"
    program = (
        f'echo "program rank $RANK"; if [ "$RANK" = 0 ]; then touch {done}; exit 0; fi; while [ ! -e {done} ]; do sleep 0.05; done; exit 3'
    )
    result = run_cli(["-n", "2", "--accelerator", "cpu", "--no-python", "sh", "-c", program], capfd)
    assert result["status"] == 3, result
    assert "program rank 0" in result["out"] and "program rank 1" in result["out"], result


@pytest.mark.soak  # a node loss under the layout (node losses run in make test: test_elastic, test_state)
def test_losing_a_node_shrinks_by_whole_nodes(cluster: Any, tmp_path: Path) -> None:
    wait_until_idle()
    outcome: Dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["ranks"] = raydist.run(
                seen,
                args=(str(tmp_path),),
                num_nodes=(2, 3),
                workers_per_node=2,
                accelerator="cpu",
                max_restarts=1,
            )
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("rank-*.json"))) < 6:
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.1)  # polling the files the ranks write, with a deadline
    first = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(6)]
    order = check_layout(first, 3, 2)
    victim = next(node for node in cluster.list_all_nodes() if node.node_id == order[-1])
    zone = next(n["Labels"]["zone"] for n in ray.nodes() if n["NodeID"] == victim.node_id)
    cluster.remove_node(victim)
    try:
        thread.join(180)
        assert not thread.is_alive(), "the run did not finish"
        assert "error" not in outcome, outcome.get("error")
        # 2 nodes with 8 free CPUs: packing would start 6 (the max); whole nodes give 2 x 2.
        assert check_layout(outcome["ranks"], 2, 2) == order[:2]
        assert {r["TORCHELASTIC_RESTART_COUNT"] for r in outcome["ranks"]} == {"1"}
    finally:
        cluster.add_node(num_cpus=4, labels={"zone": zone})  # the module's 3 nodes again
        cluster.wait_for_nodes()


def crash_on_rank_1_first(marker_dir: str) -> Dict[str, Any]:
    """What every rank saw, with its pid; rank 1 of the first attempt exits hard."""
    info = seen()
    info["pid"] = os.getpid()
    if info["TORCHELASTIC_RESTART_COUNT"] == "0":
        Path(marker_dir, f"pid-{os.getpid()}").touch()
        deadline = time.monotonic() + 60
        while info["RANK"] == "1" and len(list(Path(marker_dir).glob("pid-*"))) < int(info["WORLD_SIZE"]) and time.monotonic() < deadline:
            time.sleep(0.05)  # every rank of the first attempt has noted its pid
        if info["RANK"] == "1":
            os._exit(3)
    return info


@pytest.mark.soak  # the rule (node layout: fresh): tests/unit/rules/test_rules.py; a fresh restart on Ray: test_faults::test_restart_after_crash_reruns_on_a_new_group (make test)
def test_a_crash_under_the_node_layout_restarts_whole_in_fresh_processes(cluster: Any, tmp_path: Path) -> None:
    """A node's workers share one bundle, so a warm restart (the API's default)
    cannot seat one replacement: the group restarts whole, the layout intact.
    (One node of 2 workers: the bundle is what matters, not the node count.)"""
    wait_until_idle()
    ranks = raydist.run(crash_on_rank_1_first, args=(str(tmp_path),), num_nodes=1, workers_per_node=2, accelerator="cpu", max_restarts=1)
    check_layout(ranks, 1, 2)
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in ranks} == {"1"}
    first_pids = {int(p.name.split("-")[1]) for p in tmp_path.glob("pid-*")}
    assert len(first_pids) == 2 and not first_pids & {r["pid"] for r in ranks}
    assert live_placement_groups() == []
