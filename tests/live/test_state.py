"""Training state survives a failure: a deterministic 4-rank DDP run
(``state_ddp.train``) that saves every step ends with the same weights, bit
for bit, after a rank crash (with a spare, without, fresh restarts), a node
loss, and as a ``raydist run`` script in both restart modes; the attempt
after the fault resumed from a committed step. Durable snapshots resume a
second run and skip a cut-short one; per-rank state refuses a world of
another size; the memory the copies take is bounded and freed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import ray
import torch
from conftest import REPO, assert_nothing_left, exported_figures, use_local_ray, wait_for
from marks import read_marks
from state_ddp import PER_PARAMETER_BUCKETS, train

import raydist

pytestmark = pytest.mark.timeout(600)

STEPS, CRASH_AT = 8, 5
SCRIPT = REPO / "tests" / "live" / "state_ddp.py"
RUN_TIMEOUT_S = 300


def state_actors() -> List[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("raydist-state")]


def store_bytes() -> int:
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.object_store_bytes_used)


def assert_resumed(results: List[Dict[str, Any]], reference: List[Dict[str, Any]]) -> None:
    """Every rank ran attempt 1, resumed from a step committed before the fault, and
    ended with the weights of the run without a failure."""
    assert [r["attempt"] for r in results] == [1] * 4
    # The crash comes at the start of step 5, once step 4 is committed (``raydist.wait_committed``).
    assert [r["resumed"] for r in results] == [CRASH_AT - 1] * 4
    for mine, theirs in zip(results, reference):
        if "bucket_cap_mb_list" in PER_PARAMETER_BUCKETS:
            assert torch.equal(mine["weights"], theirs["weights"]), f"rank {mine['rank']}"
        else:  # an older torch's DDP lays out its first bucket apart from the rest: its sums differ in the last bits
            assert torch.allclose(mine["weights"], theirs["weights"], rtol=1e-5, atol=1e-6), f"rank {mine['rank']}"


def check_timeline(events: List[Dict[str, Any]], crashed: int, spare: bool) -> None:
    """The run's timeline: rank ``crashed`` failed in attempt 0 with its cause, a
    new world (from a spare, if there is one) came after, and every rank of it ran the call, with its own span."""
    moments = [e for e in events if e["ph"] != "M"]
    assert all({"ts", "pid", "tid", "name", "cat"} <= set(e) for e in moments)
    # Its peers may fail with it (a connection reset in the collective): each failure is there.
    failed = next(i for i, e in enumerate(moments) if e["cat"] == "failure" and e["args"]["rank"] == crashed)
    assert moments[failed]["args"]["attempt"] == 0 and "exited with status 3" in moments[failed]["args"]["cause"], moments[failed]
    after = moments[failed + 1 :]
    assert any(e["cat"] == ("spare" if spare else "restart") for e in after), [e["name"] for e in after]
    calls = [e for e in after if e["cat"] == "call" and e["args"]["attempt"] == 1]
    assert sorted(e["args"]["rank"] for e in calls) == [0, 1, 2, 3] and all("ended" not in e["args"] for e in calls)  # the ranks' own
    assert {e["cat"] for e in moments} >= {"placement", "start", "init", "call", "controller", "failure"}


def step_dir(step: int) -> str:
    return f"step_{step:012d}"


# Session-scoped: the tier runs this module's local-Ray tests and its cluster test
# apart (pytest_collection_modifyitems), and a module fixture would run it twice.
@pytest.fixture(scope="session")
def reference_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the reference run's per-rank state (4 ranks) is written."""
    return tmp_path_factory.mktemp("reference_state")


@pytest.fixture(scope="session")
def reference(reference_dir: Path) -> List[Dict[str, Any]]:
    """The run without a failure; its state_dir also serves the world-size test
    and is the first run of the second-run test."""
    use_local_ray()
    results = raydist.run(train, args=(STEPS,), num_workers=4, state_dir=str(reference_dir))
    assert [r["resumed"] for r in results] == [None] * 4  # a first attempt finds nothing
    # The last committed step was written before the run returned; a step superseded
    # while the writer was busy is skipped, so one or two steps are kept (of state_keep=2).
    kept = sorted(p.name for p in reference_dir.iterdir())
    assert kept[-1] == step_dir(STEPS - 1) and len(kept) in (1, 2), kept
    assert_nothing_left()  # the run's keeper went with it
    return results


@pytest.mark.parametrize(
    "options",
    [
        # make test: a spare takes the crashed rank's place; without one and fresh restarts, the bookkeeping is the
        # engine's (test_engine_faults rows)
        pytest.param({"spare_workers": 1, "resources_per_worker": {"CPU": 0.5}}, id="warm-spare"),
        pytest.param({"spare_workers": 1, "resources_per_worker": {"CPU": 0.5}, "run_ahead": True}, id="warm-spare-run-ahead"),
        pytest.param({}, id="warm", marks=pytest.mark.soak),
        pytest.param({"restart_mode": "fresh"}, id="fresh", marks=pytest.mark.soak),
    ],
)
def test_a_crashed_rank_resumes_bit_identical(reference: List[Dict[str, Any]], options: Dict[str, Any], tmp_path: Path) -> None:
    timeline, builds = tmp_path / "timeline.json", tmp_path / "builds"
    builds.mkdir()
    args = (STEPS, CRASH_AT, 2)
    results = raydist.run(
        train, args=args, kwargs={"builds": str(builds)}, num_workers=4, max_restarts=1, timeline=str(timeline), **options
    )
    assert_resumed(results, reference)
    ahead = sorted(b["pid"] for b in read_marks(builds, "build-*.json") if b["rank"] is None)
    if options.get("run_ahead"):  # every rank of attempt 1 went on from a model built ahead, before it had a rank
        assert ahead == sorted(r["pid"] for r in results), ahead
        spans = [e for e in json.loads(timeline.read_text()) if e.get("cat") == "ahead"]
        assert sorted(e["args"]["rank"] for e in spans if e["args"]["attempt"] == 1) == [0, 1, 2, 3], spans
    else:
        assert ahead == []
    check_timeline(json.loads(timeline.read_text()), crashed=2, spare="spare_workers" in options)
    if options.get("restart_mode") != "fresh":  # ranks 0, 1, 3 kept their process and loaded from memory
        assert len({r["pid"] for r in results}) == 4
    assert_nothing_left(within=30, files=False)  # the run's keeper went with it (a crashed rank's files may stay)


# soak: the CLI entry point of save_state (make test: test_a_crashed_rank_resumes_bit_identical through the API,
# whose ranks run the same state store; a script restarting in place: test_warm_restarts)
@pytest.mark.soak
@pytest.mark.parametrize("mode", ["warm", "fresh"])
def test_a_raydist_run_script_resumes_bit_identical(reference: List[Dict[str, Any]], mode: str, tmp_path: Path) -> None:
    out = tmp_path / "rank0.pt"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "raydist",
            "run",
            "--address",
            ray.get_runtime_context().gcs_address,
            "-n",
            "4",
            "--max-restarts",
            "1",
            "--restart-mode",
            mode,
            str(SCRIPT),
            "--steps",
            str(STEPS),
            "--crash-at",
            str(CRASH_AT),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rank0 = torch.load(out, weights_only=False)
    assert rank0["attempt"] == 1 and rank0["resumed"] == CRASH_AT - 1, result.stderr[-3000:]
    assert torch.equal(rank0["weights"], reference[0]["weights"])
    if mode == "warm":  # the survivors left the script's own process group at once: none waited out survivor_timeout
        assert "3 rank(s) kept their process" in result.stderr, result.stderr[-3000:]


# soak: a second entry point (save_state under plain torchrun, RAYDIST_STATE_DIR): the directory store's resume and
# skip are tests/unit/rules/test_state_rules.py; make test: raydist's state_dir in test_a_second_run_resumes_...
@pytest.mark.soak
def test_torchrun_with_a_state_dir_saves_and_resumes(reference: List[Dict[str, Any]], tmp_path: Path) -> None:
    """The same script under plain torchrun: RAYDIST_STATE_DIR is its store."""
    out = tmp_path / "rank0.pt"
    env = {**os.environ, "RAYDIST_STATE_DIR": str(tmp_path / "state")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            "--max-restarts",
            "1",
            str(SCRIPT),
            "--steps",
            str(STEPS),
            "--crash-at",
            str(CRASH_AT),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rank0 = torch.load(out, weights_only=False)
    assert rank0["attempt"] == 1 and rank0["resumed"] is not None and rank0["resumed"] < CRASH_AT
    assert torch.equal(rank0["weights"], reference[0]["weights"])
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [step_dir(s) for s in (STEPS - 2, STEPS - 1)]


def test_a_second_run_resumes_from_the_state_dir_and_skips_a_cut_short_step(
    reference: List[Dict[str, Any]], reference_dir: Path, tmp_path: Path
) -> None:
    # The reference run is the first run (its fixture checks what it kept); the second
    # runs on a copy of its directory. Training on after a load from disk is the torchrun
    # test's (fresh processes, bit-identical at the end).
    state_dir = tmp_path / "state"
    shutil.copytree(reference_dir, state_dir)
    newest = state_dir / step_dir(STEPS - 1)
    cut = state_dir / step_dir(STEPS + 3)  # a newer snapshot whose writer died: no marker
    cut.mkdir()
    (cut / "meta.json").write_text((newest / "meta.json").read_text().replace(f'"step": {STEPS - 1}', f'"step": {STEPS + 3}'))
    shutil.copy(newest / "rank_00000.pt", cut / "rank_00000.pt")
    # The same directory as a file:// URI (as any pyarrow / fsspec URI is given).
    second = raydist.run(train, args=(STEPS,), num_workers=4, state_dir=state_dir.as_uri())
    assert [r["resumed"] for r in second] == [STEPS - 1] * 4
    for mine, theirs in zip(second, reference):  # the weights are the loaded ones
        assert torch.equal(mine["weights"], theirs["weights"]), f"rank {mine['rank']}"
    assert not state_actors()


@pytest.mark.soak  # the rule: tests/unit/core/test_state_world.py; make test: the shared state's load below
def test_per_rank_state_refuses_another_world_size(reference: List[Dict[str, Any]], reference_dir: Path) -> None:
    # The reference run's per-rank state: 4 ranks.
    with pytest.raises(raydist.WorkerGroupError, match="saved by 4 ranks with per-rank state.*this world has 1 ranks"):
        raydist.run(train, args=(STEPS + 1,), num_workers=1, state_dir=str(reference_dir))


def test_shared_state_loads_into_another_world_size(ray_local: None, tmp_path: Path) -> None:
    raydist.run(train, args=(3,), kwargs={"shared": True}, num_workers=1, state_dir=str(tmp_path))
    results = raydist.run(train, args=(4,), kwargs={"shared": True}, num_workers=2, state_dir=str(tmp_path))
    assert [r["resumed"] for r in results] == [2, 2]


def save_big(saves: int, megabytes: int) -> Dict[str, int]:
    """``saves`` saves of ``megabytes`` of state over the world (per rank: its share);
    rank 0 reads what the holders keep after each."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tensor = torch.zeros(megabytes * 2**20 // 4 // world)
    most = 0
    assert raydist.load_state(weights={"t": tensor}) is None  # a first attempt: nothing yet
    # load_state started the keeper (a loop's first steps overlap its start): it is there before any save.
    keeper = ray.get_actor(json.loads(os.environ["RAYDIST_STATE"])["name"], namespace="raydist-state")
    for step in range(saves):
        tensor += 1
        raydist.save_state(step, weights={"t": tensor})
        if rank == 0 and step > 0:
            holders = ray.get(keeper.holders.remote())
            most = max(most, sum(ray.get([h.held_bytes.remote() for _, h in holders])))
    return {"most": most}


@pytest.mark.soak  # a repetition; make test: test_an_optimizer_step_waits_for_the_copy_and_a_change_outside_it_drops_the_step saves and is leak-checked
def test_fifty_saves_of_100_mb_stay_bounded_and_leave_nothing(ray_local: None) -> None:
    before = store_bytes()  # the shared Ray may hold other tests' objects
    results = raydist.run(save_big, args=(50, 100), num_workers=2)
    state = 100 * 2**20
    # Two places, at most two steps (the committed one and the one being sent: every rank sends the same steps).
    assert 0 < results[0]["most"] <= 2 * 2 * state * 1.01
    assert_nothing_left(within=30)  # the keeper and its holders too
    wait_for(lambda: store_bytes() <= before, 30, "the object store to hold no more than before the run")


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    tensors = [*model.state_dict().values(), *(t for kept in optimizer.state.values() for t in kept.values())]
    return hashlib.sha1(b"".join(t.numpy().tobytes() for t in tensors)).hexdigest()


def changed_while_copied(megabytes: int) -> Dict[str, Any]:
    """Saves of a model and its Adam (about ``megabytes``), each right before the next
    step's optimizer.step() (which waits for the copy made in the background); after
    step 1's save rank 1 changes its weights in place outside the optimizer."""
    rank = int(os.environ["RANK"])
    width = int((megabytes * 2**20 / 3 / 4) ** 0.5)
    torch.manual_seed(rank)
    model = torch.nn.Linear(width, width, bias=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    saved: Dict[int, str] = {}
    assert raydist.load_state(model=model, optimizer=optimizer) is None
    for step in range(4):
        model(torch.randn(4, width)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        saved[step] = digest(model, optimizer)
        raydist.save_state(step, model=model, optimizer=optimizer)
        if step == 0:  # step 1 is then sent for sure (a step saved while another is on its way out is not)
            raydist.wait_committed()
        if step == 1 and rank == 1:
            with torch.no_grad():
                model.weight.add_(1.0)  # not the optimizer's step: nothing waits for the copy
    assert raydist.wait_committed() == 3  # the last step saved (step 1 was dropped on every rank)
    resumed = raydist.load_state(model=model, optimizer=optimizer)  # the newest committed step, from this rank's memory
    return {"resumed": resumed, "same": resumed is not None and digest(model, optimizer) == saved[resumed]}


def test_an_optimizer_step_waits_for_the_copy_and_a_change_outside_it_drops_the_step(ray_local: None, capfd: pytest.CaptureFixture) -> None:
    # The optimizer's tensors are copied after save_state returns; the next optimizer.step()
    # waits for that copy, so steps 0, 2 and 3 keep their values. Rank 1's in-place change
    # comes before its next optimizer step, which sees it: step 1 is dropped on every rank
    # (none waits for it), and rank 1 copies before returning from then on.
    # (state_overhead=None: every step the ranks can send, which is what this test is about, not their pace)
    results = raydist.run(changed_while_copied, args=(48,), num_workers=2, state_overhead=None)
    err = capfd.readouterr().err
    assert [r["same"] for r in results] == [True, True], results
    assert [r["resumed"] for r in results] == [3, 3], results
    assert "rank 1 could not keep step 1: 1 of its optimizer's tensors changed in place" in err, err[-3000:]
    assert "could not keep step 0" not in err and "could not keep step 2" not in err, err[-3000:]


def saves_ahead_of_a_peer(steps: int, megabytes: float, change_after: bool, shared: bool = False) -> Dict[str, Any]:
    """Step 0 committed (the keeper answers from then on); then rank 0 saves steps 1
    to ``steps`` before rank 1 saves any (a barrier between): step 1 waits for rank 1's
    copy, as a step waits while a peer's copies are on their way. ``change_after``:
    rank 0 changes its weights in place after its last save. ``shared``: the weights
    are shared state, and each rank's own part a plain value (no tensor to watch)."""
    rank = int(os.environ["RANK"])
    weights = torch.zeros(int(megabytes * 2**20) // 4)

    def save(step: int) -> None:
        if shared:
            raydist.save_state(step, shared=["weights"], weights={"t": weights}, note=f"rank {rank} step {step}")
        else:
            raydist.save_state(step, weights={"t": weights})

    save(0)
    assert raydist.wait_committed() == 0
    if rank == 1:
        torch.distributed.barrier()
    for step in range(1, steps + 1):
        weights += 1
        save(step)
    ahead = None
    if rank == 0:
        ahead = raydist.wait_committed(timeout=0)  # does not wait: step 1 is not committed yet
        if change_after:
            weights += 100
        torch.distributed.barrier()
    committed = raydist.wait_committed()
    loaded: Dict[str, Any] = {"t": None}  # a plain value: filled in place
    resumed = raydist.load_state(weights=loaded)
    return {"ahead": ahead, "committed": committed, "resumed": resumed, "t": loaded["t"][0].item()}


@pytest.mark.parametrize(
    "megabytes, change_after, shared, last",
    [
        pytest.param(0.01, False, False, 10, id="small: copied"),  # a copy costs less than asking the keeper first
        pytest.param(16, False, False, 10, id="big: not copied, read when asked for"),
        pytest.param(16, True, False, 1, id="big, changed after its save"),
        # Rank 0's own part has no tensor to watch: it copies its steps as rank 1 does, and both ask again.
        pytest.param(16, False, True, 10, id="big shared, plain own parts"),
    ],
)
def test_a_save_never_waits_for_the_step_before_and_the_newest_step_is_committed_when_every_rank_asks(
    ray_local: None, capfd: pytest.CaptureFixture, megabytes: float, change_after: bool, shared: bool, last: int
) -> None:
    # Rank 0's saves all return while its step 1 waits for rank 1's copy; the steps saved meanwhile
    # are not sent (by either rank: rank 0 decided), and the newest, which every rank asks for again
    # (wait_committed), is committed in the end: unless rank 0 changed it in place after its save,
    # when it is not kept and step 1 stays the committed one.
    args = (10, megabytes, change_after, shared)
    results = raydist.run(saves_ahead_of_a_peer, args=args, num_workers=2, state_overhead=None)  # (not the pace: every step it can)
    assert results[0]["ahead"] == 0
    assert [r["committed"] for r in results] == [last, last] and [r["resumed"] for r in results] == [last, last]
    assert [r["t"] for r in results] == [float(last), float(last)]  # the state of that step, loaded
    said = "rank 0 could not keep step 10: 1 of its tensors changed in place after save_state" in capfd.readouterr().err
    assert said == change_after
    assert_nothing_left(within=30)


def small_saves_every_step(steps: int) -> Optional[int]:
    """A 1 KB state saved every step of 10 ms under the run's default pace, after a
    first commit (the keeper and holders up); the step committed after the last
    save, read without waiting (the call's end then commits the newest too)."""
    weights = torch.zeros(256)
    raydist.save_state(0, weights={"t": weights})
    assert raydist.wait_committed() == 0
    for step in range(1, steps + 1):
        time.sleep(0.01)  # the step's work
        weights += 1
        raydist.save_state(step, weights={"t": weights})
    return raydist.wait_committed(timeout=0)


def test_a_paced_loop_that_saves_a_small_state_every_step_keeps_committing(ray_local: None) -> None:
    # A step that costs the loop nothing to send goes out as soon as the last is
    # committed: each rank's pace sees the loop's own steps between its sends (a
    # small step not sent is copied and let go, and must not read as a send).
    results = raydist.run(small_saves_every_step, args=(200,), num_workers=2)
    assert all(committed is not None and committed > 100 for committed in results), results


def saves_then_rank_one_dies(steps: int) -> int:
    """``steps`` saves of a small state; in attempt 0, rank 1 then dies."""
    state = torch.zeros(4)
    for step in range(steps):
        state += 1
        raydist.save_state(step, weights={"t": state})
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
        os._exit(3)
    return os.getpid()


def test_the_runs_figures_reach_rays_metrics(ray_local: None) -> None:
    """The restart and its recovery (the driver's), save_state's blocking time and the
    committed step (each rank's), among what Ray exports for Prometheus. Ray sends a
    process's figures every few seconds: the group stays up until they are there."""
    before = exported_figures()  # this Ray's earlier runs' figures: ours add to their counts

    def lines(figures: Dict[str, str], name: str, label: str) -> List[str]:
        return [line for line in figures[name].splitlines() if label in line]

    def ours_arrived() -> bool:
        figures = exported_figures()
        added = [
            lines(figures, "raydist_restarts", 'kind="warm"') != lines(before, "raydist_restarts", 'kind="warm"'),
            lines(figures, "raydist_recovery_seconds", "") != lines(before, "raydist_recovery_seconds", ""),
            lines(figures, "raydist_save_state_blocking_seconds", 'rank="1"')
            != lines(before, "raydist_save_state_blocking_seconds", 'rank="1"'),
        ]
        return all(added) and bool(lines(figures, "raydist_committed_step", 'rank="1"'))

    with raydist.WorkerGroup(2, max_restarts=1, resources_per_worker={"CPU": 0.5}) as group:
        with pytest.raises(raydist.WorkerGroupError, match="rank 1"):
            group.run(saves_then_rank_one_dies, args=(3,))
        group.run(saves_then_rank_one_dies, args=(3,))  # attempt 1, in place
        wait_for(ours_arrived, 90, f"this run's figures among those Ray exports (before it: {before})")


# -- a simulated 2-node cluster (ordered after the local Ray's tests) ----------------


@pytest.mark.nodes({"num_cpus": 2}, {"num_cpus": 2}, {"num_cpus": 2})  # the elastic tests' shape: a warm cluster
def test_a_node_loss_resumes_bit_identical(reference: List[Dict[str, Any]], cluster: Any, tmp_path: Path) -> None:
    outcome: Dict[str, Any] = {}
    lost = next(iter(cluster.worker_nodes))  # SPREAD puts a rank on every node

    def target() -> None:
        try:
            outcome["results"] = raydist.run(
                train,
                args=(STEPS, CRASH_AT),
                kwargs={"lose_node": lost.node_id, "marks": str(tmp_path)},
                num_workers=4,
                max_restarts=1,
                placement_strategy="SPREAD",
            )
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    wait_for(lambda: len(list(tmp_path.glob("rank-*.json"))) == 4, 240, "4 ranks at the fault's step")
    marked = read_marks(tmp_path)
    assert lost.node_id in {mark["node"] for mark in marked}
    cluster.remove_node(lost)
    thread.join(RUN_TIMEOUT_S)
    assert "error" not in outcome, outcome.get("error")
    assert_resumed(outcome["results"], reference)
    survivors = {mark["pid"] for mark in marked if mark["node"] != lost.node_id}
    assert survivors <= {r["pid"] for r in outcome["results"]}  # kept their process, loaded from memory
    assert_nothing_left(within=30, files=False)  # the lost node's workers left their files
