"""Warm restarts on a real Ray: survivors keep their processes, spares take a
dead rank's place, a stuck survivor is replaced after the bound, repeated
restarts leave nothing behind, scripts restart in place only when asked,
and a node loss keeps every surviving rank in its process."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import ray
import ray.cloudpickle
import torch
import torch.distributed as dist
from conftest import REPO, assert_nothing_left, ray_address, wait_for
from marks import read_marks, write_mark

import raydist
from raydist.pool.driver.spares import REFILL_DELAY_S
from raydist.pool.records import GroupPhase

pytestmark = pytest.mark.timeout(300)
# The workers need not import this module (tests/live may not be on their path): ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def attempt() -> int:
    return int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def crash_rank(rank: int, marker: Optional[str] = None) -> Dict[str, Any]:
    """Attempt 0: ``rank`` dies (os._exit) while the others all-reduce; later
    attempts: each rank says who and where it is."""
    me = dist.get_rank()
    if marker is not None and attempt() == 0:
        write_mark(marker, f"rank-{me}.json", {"pid": os.getpid()})
    if attempt() == 0:
        dist.barrier()
        if me == rank:
            os._exit(7)
        while True:
            dist.all_reduce(torch.ones(1))
    dist.all_reduce(torch.ones(1))
    return {
        "rank": me,
        "pid": os.getpid(),
        "world": dist.get_world_size(),
        "attempt": attempt(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "master_port": os.environ["MASTER_PORT"],
        "env_rank": os.environ["RANK"],
    }


class Stoppable:
    def __init__(self) -> None:
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()


@pytest.mark.soak  # a spare takes a crashed rank's place in make test: test_state::test_a_crashed_rank_resumes_bit_identical[warm-spare]
@pytest.mark.usefixtures("ray_local")
def test_a_crash_with_a_spare_is_replaced_by_the_spares_process(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="raydist")
    with raydist.WorkerGroup(2, max_restarts=1, spare_workers=1) as group:
        before = [w.pid for w in group.workers]
        spares = [s.pid for s in group.spares]
        assert len(spares) == 1 and spares[0] not in before
        attached = Stoppable()
        group.attach("probe", attached)  # a per-attempt thing ends with its world
        with pytest.raises(raydist.WorkerGroupError, match="rank 1") as caught:
            group.run(crash_rank, args=(1,))
        assert caught.value.restarted_in_place and "the group restarted in place: attempt 1" in str(caught.value)
        assert attached.stopped.is_set()
        after = [w.pid for w in group.workers]
        assert group.restart_count == 1 and len(after) == 2
        assert set(after) == {before[0], spares[0]}  # the survivor kept, the spare joined
        results = group.run(crash_rank, args=(1,))
        assert [r["pid"] for r in results] == after
        assert {(r["world"], r["attempt"]) for r in results} == {(2, 1)}
        assert [r["env_rank"] for r in results] == ["0", "1"]
        # A new spare, in a new process, appears in the background, once the new world had its first seconds.
        wait_for(lambda: len(group.spares) == 1, 120, "a new spare")
        assert group.spares[0].pid not in before + spares
        restarted = next(r.created for r in caplog.records if "warm restart:" in r.getMessage())
        row = next(a for a in ray._private.state.actors().values() if a["Pid"] == group.spares[0].pid)
        assert row["StartTime"] / 1000 - restarted >= REFILL_DELAY_S - 1.5, (row["StartTime"], restarted)
    assert "1 from a spare, 0 fresh" in caplog.text and "1 rank(s) kept their process" in caplog.text
    assert_nothing_left(within=30)


def stuck_survivor(spins: int = 2) -> int:
    """Attempt 0: rank 1 dies, rank ``spins`` spins in Python (never in a collective)."""
    if attempt() == 0:
        dist.barrier()
        if dist.get_rank() == 1:
            os._exit(3)
        if dist.get_rank() == spins:
            while True:
                pass
        dist.all_reduce(torch.ones(1))  # fails: rank 1 died
    dist.all_reduce(torch.ones(1))
    return os.getpid()


@pytest.mark.soak  # the engine's logic, on the fake cluster in the unit tier: test_engine_faults settling-hang rows (a survivor past survivor_timeout is replaced)
@pytest.mark.usefixtures("ray_local")
def test_a_survivor_stuck_past_the_bound_is_replaced_and_a_call_sent_meanwhile_runs_in_the_new_world(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="raydist")
    with raydist.WorkerGroup(3, max_restarts=1, survivor_timeout=2.0) as group:
        before = [w.pid for w in group.workers]
        failed = group.submit(stuck_survivor)
        ended: List[BaseException] = []

        def wait_failed() -> None:
            try:
                failed.result()
            except BaseException as error:  # noqa: BLE001 - the test reads it
                ended.append(error)

        restarting = threading.Thread(target=wait_failed)
        restarting.start()
        wait_for(lambda: group.phase is GroupPhase.RESTARTING, 60, "the warm restart to begin")
        # Sent during the restart: runs once the new world is up. The same call as the failed
        # one: the replaced ranks get its bytes (they kept no earlier call).
        pids = group.run(stuck_survivor)
        restarting.join(60)
        assert ended and isinstance(ended[0], raydist.WorkerGroupError), ended  # the failed call raised
        assert pids == [w.pid for w in group.workers] and group.restart_count == 1, "the call ran in the new world"
        assert pids[0] == before[0] and before[1] not in pids and before[2] not in pids, "the stuck survivor was replaced"
    line = next(line for line in caplog.text.splitlines() if "warm restart" in line)
    assert "1 rank(s) kept their process, 2 replaced (0 from a spare, 2 fresh)" in line
    assert "rank 2 killed and replaced: rank 2 (node" in line and f"pid {before[2]}" in line
    assert "had not returned 2 s after the failure" in line
    assert_nothing_left(within=30)  # a restart tears the old world down in the background


@pytest.mark.soak  # the engine's logic, on the fake cluster in the unit tier: test_engine_group::test_a_shutdown_during_a_warm_restart_ends_it_and_raises_the_failure
@pytest.mark.usefixtures("ray_local")
def test_shutdown_from_another_thread_never_waits_on_a_restart() -> None:
    group = raydist.WorkerGroup(2, max_restarts=1, survivor_timeout=30.0)
    ended: List[BaseException] = []

    def call() -> None:
        try:
            group.run(stuck_survivor, args=(0,))  # rank 1 dies, rank 0 spins: the restart waits on it
        except BaseException as error:  # noqa: BLE001 - the test reads it
            ended.append(error)

    caller = threading.Thread(target=call)
    caller.start()
    wait_for(lambda: group.phase is GroupPhase.RESTARTING, 60, "the warm restart to begin")
    started = time.monotonic()
    group.shutdown()
    took = time.monotonic() - started
    caller.join(60)
    assert not caller.is_alive()
    assert took < 6, took
    assert ended and isinstance(ended[0], raydist.WorkerGroupError), ended
    assert_nothing_left(within=30)  # a restart tears the old world down in the background


def raise_on_rank_1() -> None:
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 1:
        raise ValueError("again")


def footprint() -> Dict[str, Any]:
    """This process's memory, threads and sockets (the process group's store included)."""
    import psutil

    process = psutil.Process()
    connections = process.net_connections(kind="tcp")
    native = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            native.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return {
        "pid": process.pid,
        "rss": process.memory_info().rss,
        "threads": len(native),
        # what an attempt starts: Python threads (raydist's, the user's) and the process group's own
        "group_threads": threading.active_count() + sum(1 for name in native if name.startswith(("pt_", "gloo"))),
        "listening": sum(1 for c in connections if c.status == psutil.CONN_LISTEN),
        "sockets": len(connections),
        "port": os.environ["MASTER_PORT"],
    }


@pytest.mark.soak  # a repetition: make test leak-checks each warm restart it makes (test_state, test_stragglers)
@pytest.mark.usefixtures("ray_local")
def test_twenty_restarts_in_place_leave_no_memory_port_or_thread_behind() -> None:
    with raydist.WorkerGroup(2, max_restarts=20, retry_on_exception=True) as group:
        pids = [w.pid for w in group.workers]
        samples: List[List[Dict[str, Any]]] = []
        for number in range(20):
            with pytest.raises(raydist.WorkerGroupError, match="again"):
                group.run(raise_on_rank_1)
            assert group.restart_count == number + 1
            samples.append(group.run(footprint))
        assert [s["pid"] for s in samples[-1]] == pids  # every restart kept both processes
        assert len({s[0]["port"] for s in samples}) == 20  # a new MASTER_PORT each attempt
        first, last = samples[1], samples[-1]  # after the first restart has warmed everything up
        for rank in (0, 1):
            assert last[rank]["rss"] - first[rank]["rss"] < 50 * 2**20, (first[rank], last[rank])
            # 18 attempts apart: a thread per attempt would show; one started lazily once may
            assert last[rank]["group_threads"] - first[rank]["group_threads"] <= 1, (first[rank], last[rank])
            # gRPC's pools (Ray's) grow under load, by a few over a whole run, never once per attempt
            assert last[rank]["threads"] - first[rank]["threads"] < 9, (first[rank], last[rank])
            assert last[rank]["listening"] <= first[rank]["listening"], (first[rank], last[rank])
            # a connection leaked per attempt would show 18 times; Ray's gRPC opens some of its own under load
            assert last[rank]["sockets"] - first[rank]["sockets"] < 9, (first[rank], last[rank])
    assert_nothing_left(within=30)  # a restart tears the old world down in the background


SCRIPT = """
import json, os, sys, torch.distributed as dist
dist.init_process_group("gloo")
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("pid", json.dumps({"rank": dist.get_rank(), "attempt": attempt, "pid": os.getpid()}), flush=True)
if attempt == 0 and dist.get_rank() == 1:
    sys.exit(3)
dist.barrier()
dist.destroy_process_group()
"""


def script_pids(tmp_path: Path, *flags: str) -> Tuple[Dict[int, Dict[int, int]], str]:
    """Run SCRIPT on 2 ranks with one restart; attempt -> rank -> pid, and what it printed on stderr."""
    script = tmp_path / "restart_me.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "raydist",
            "run",
            "--address",
            ray_address(),
            "-n",
            "2",
            "--accelerator",
            "cpu",
            "--max-restarts",
            "1",
            *flags,
            str(script),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen: Dict[int, Dict[int, int]] = {}
    for line in result.stdout.splitlines():
        if "pid {" in line:
            note = json.loads(line.split("pid ", 1)[1])
            seen.setdefault(note["attempt"], {})[note["rank"]] = note["pid"]
    assert set(seen) == {0, 1} and all(len(ranks) == 2 for ranks in seen.values()), result.stdout + result.stderr
    return seen, result.stderr


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("mode", ["warm", pytest.param("fresh", marks=pytest.mark.soak)])  # fresh: test_cli's script restarts
def test_a_script_restarts_in_place_only_in_the_opt_in_mode(tmp_path: Path, mode: str) -> None:
    timeline = tmp_path / "timeline.json"
    pids, stderr = script_pids(tmp_path, "--timeline", str(timeline), *(["--restart-mode", "warm"] if mode == "warm" else []))
    # The run's timeline and its end summary: rank 1 failed in attempt 0, a new world, both ranks ran the script again.
    moments = [e for e in json.loads(timeline.read_text()) if e["ph"] != "M"]
    failed = next(i for i, e in enumerate(moments) if e["cat"] == "failure")
    assert moments[failed]["args"]["rank"] == 1 and moments[failed]["args"]["cause"] == "exited with status 3", moments[failed]
    assert any(e["cat"] == "restart" for e in moments[failed:])
    assert sorted(e["args"]["rank"] for e in moments[failed:] if e["cat"] == "call" and e["args"]["attempt"] == 1) == [0, 1]
    summary = stderr[stderr.index("raydist run summary: 2 attempt(s)") :]
    assert "exited with status 3" in summary and "succeeded" in summary, summary
    if mode == "warm":
        assert pids[1] == pids[0]  # rank 1 exited with a status: its process lives, and both are kept
    else:
        assert not set(pids[1].values()) & set(pids[0].values())  # torchrun's semantics: new processes
    assert_nothing_left(within=30)  # a restart tears the old world down in the background


def horovod_rank_raises() -> Dict[str, Any]:
    import horovod.torch as hvd

    if attempt() == 0 and hvd.rank() == 1:
        raise ValueError("first attempt")
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name=f"sum-{attempt()}")
    return {"rank": hvd.rank(), "size": hvd.size(), "pid": os.getpid(), "sum": float(total.item())}


@pytest.mark.usefixtures("ray_local")
def test_horovod_shuts_down_and_initialises_again_in_the_same_processes() -> None:
    pytest.importorskip("horovod.torch")
    with raydist.WorkerGroup(2, backend="horovod", max_restarts=1, retry_on_exception=True) as group:
        pids = [w.pid for w in group.workers]
        with pytest.raises(raydist.WorkerGroupError, match="first attempt"):
            group.run(horovod_rank_raises)
        results = group.run(horovod_rank_raises)
    assert [r["pid"] for r in results] == pids
    assert [(r["rank"], r["size"], r["sum"]) for r in results] == [(0, 2, 2.0), (1, 2, 2.0)]


# -- a simulated cluster ----------------------------------------------------------------


@pytest.mark.soak  # test_state's node loss checks the survivors' processes in make test
@pytest.mark.nodes(*[{"num_cpus": 2}] * 3)
def test_after_a_node_loss_every_surviving_rank_runs_in_its_old_process(cluster: Any, tmp_path: Path) -> None:
    outcome: Dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["results"] = raydist.run(crash_rank, args=(-1, str(tmp_path)), num_workers=(2, 6), max_restarts=1)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    wait_for(lambda: len(list(tmp_path.glob("rank-*.json"))) == 6, 180, "6 ranks running")
    head = ray.get_runtime_context().get_node_id()
    first = {mark["pid"] for mark in read_marks(tmp_path)}
    victim = next(node for node in cluster.worker_nodes if node.node_id != head)
    cluster.remove_node(victim)
    thread.join(180)
    assert not thread.is_alive(), "the run did not finish"
    if "error" in outcome:
        raise outcome["error"]
    results = outcome["results"]
    assert [r["world"] for r in results] == [4] * 4 and {r["attempt"] for r in results} == {1}
    assert victim.node_id not in {r["node_id"] for r in results}
    assert {r["pid"] for r in results} <= first  # the same processes, none new
    assert results[0]["node_id"] == head  # the driver's node stays first
    # The lost node's files stay on that machine until a worker next starts there (they are older than 30 s by then).
    assert_nothing_left(within=30, files=False)  # a restart tears the old world down in the background
