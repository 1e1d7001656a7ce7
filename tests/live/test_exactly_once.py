"""Every row exactly once: an epoch cut by failures resumes where the last
committed step left it, for a Ray Data shard (``DataConfig(exactly_once=True)``)
and for ``raydist.DistributedSampler``, in a world of the same size or
another, under raydist and under plain torchrun.

The failure points are drawn at random; the seed is in every assertion's
message (``EXACTLY_ONCE_SEED=<seed>`` replays one). The logs of
``exactly_once_train`` say which rows each committed step consumed.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
import ray
import torch
from conftest import assert_nothing_left, live_raydist_actors
from exactly_once_train import consumed, reference, train

import raydist

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "live" / "exactly_once_train.py"
SOURCES = ["ray-data", "sampler"]
EXACTLY_ONCE = raydist.DataConfig(exactly_once=True, shuffle=True, seed=0)


def seed() -> int:
    return int(os.environ.get("EXACTLY_ONCE_SEED", random.randrange(10**6)))


def options(source: str, rows: int) -> Dict[str, Any]:
    if source != "ray-data":
        return {}
    return {"datasets": {"train": ray.data.range(rows, override_num_blocks=7)}, "dataset_config": EXACTLY_ONCE}


def assert_each_row_once(log: Path, rows: int, epochs: int, why: str) -> None:
    counts = consumed(log)
    assert sorted(counts) == list(range(epochs)), why
    for epoch in range(epochs):
        wrong = {row: n for row, n in counts[epoch].items() if n != 1}
        missing = rows - len(counts[epoch])
        assert not wrong and not missing, (
            f"{why}: epoch {epoch}: {missing} rows never read, read more than once: {dict(list(wrong.items())[:10])}"
        )


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)  # polling files the ranks write, with a deadline


@pytest.mark.parametrize(
    "source",
    [
        "ray-data",
        # soak: split_dataset's shard takes the same positions as the Ray Data shard above; its
        # reader and blocks ending with the call run in make test (test_split_datasets_reader_...)
        pytest.param("split", marks=pytest.mark.soak),
        # soak: the sampler across a crash, with the weights, runs in make test under plain torchrun (below)
        pytest.param("sampler", marks=pytest.mark.soak),
    ],
)
def test_a_crash_mid_epoch_reads_each_row_once_and_ends_with_the_weights_of_a_run_that_never_failed(
    ray_local: None, source: str, tmp_path: Path
) -> None:
    rows, batch_size, epochs, world = 2000, 20, 2, 2
    chosen = seed()
    crash_step = random.Random(chosen).randrange(12, rows * epochs // (world * batch_size))  # either epoch, after a commit
    why = f"seed {chosen}: rank 1 crashed at step {crash_step}, a spare took its place"
    results = raydist.run(
        train,
        args=(source, rows, batch_size, epochs, str(tmp_path)),
        kwargs={"crash": (0, crash_step, 1)},
        num_workers=world,
        max_restarts=1,
        spare_workers=1,  # takes the crashed rank's place
        **options(source, rows),
    )
    assert {r["attempt"] for r in results} == {1} and None not in {r["resumed"] for r in results}, why
    assert_each_row_once(tmp_path, rows, epochs, why)
    expected = reference(source, rows, batch_size, epochs, world)
    for result in results:
        assert torch.allclose(torch.tensor(result["weights"], dtype=torch.float64), expected, rtol=0, atol=1e-9), why
    assert_nothing_left(within=30, files=False)  # split_dataset's block holder went with the call; a crashed rank's files may stay


def read_split(rows: int) -> int:
    shard = raydist.split_dataset(ray.data.range(rows, override_num_blocks=3), exactly_once=True)
    return sum(len(batch["id"]) for batch in shard.iter_batches(batch_size=8))


def test_split_datasets_reader_and_its_blocks_go_when_the_call_ends_the_group_stays(ray_local: None) -> None:
    with raydist.WorkerGroup(2, accelerator="cpu") as group:
        assert group.run(read_split, args=(50,)) == [25, 25]
        holders = lambda: [a for a in live_raydist_actors() if a["ActorClassName"].endswith("BlockHolder")]  # noqa: E731
        wait_for(lambda: holders() == [], 30, "split_dataset's BlockHolder to end with the call")
        assert group.run(read_split, args=(10,)) == [5, 5]  # a new call reads anew


def test_a_torchrun_script_resumes_its_epoch_from_the_state_dir(tmp_path: Path) -> None:
    """Plain torchrun, no Ray: the sampler's position is saved in RAYDIST_STATE_DIR."""
    rows, batch_size, epochs = 600, 10, 2
    chosen = seed()
    crash_step = random.Random(chosen).randrange(12, rows * epochs // (2 * batch_size))
    log = tmp_path / "log"
    log.mkdir()
    env = {**os.environ, "RAYDIST_STATE_DIR": str(tmp_path / "state")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]
    command += [
        str(SCRIPT),
        "--rows",
        str(rows),
        "--batch-size",
        str(batch_size),
        "--out-dir",
        str(log),
        "--crash",
        json.dumps([0, crash_step, 1]),
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    why = f"seed {chosen}: rank 1 crashed at step {crash_step}"
    assert result.returncode == 0, f"{why}\n{result.stderr[-3000:]}"
    ended = json.loads((log / "result.json").read_text())
    assert ended["attempt"] == 1 and ended["resumed"] is not None, why
    assert_each_row_once(log, rows, epochs, why)
    expected = reference("sampler", rows, batch_size, epochs, 2)
    weights = torch.tensor(json.loads((log / "result.json").read_text())["weights"], dtype=torch.float64)
    assert torch.allclose(weights, expected, rtol=0, atol=1e-9), why


SLOT_NODE = {"num_cpus": 2, "resources": {"slot": 1}}  # one rank per node, a CPU beside it for Ray Data


@pytest.mark.soak  # make test: a crash of the same world size above; the logic of resizes: tests/unit/*/test_*sampler*, test_positional_shard
@pytest.mark.timeout(600)
@pytest.mark.nodes(SLOT_NODE, SLOT_NODE, SLOT_NODE, SLOT_NODE)
@pytest.mark.parametrize("source", SOURCES)
def test_three_failures_a_shrink_and_a_growth_read_each_row_of_each_epoch_once(cluster: Any, source: str, tmp_path: Path) -> None:
    """10,000 rows, 2 epochs, 4 ranks: a rank crashes (4 ranks again), a node is
    lost (3 ranks), a node joins (4 ranks), each at a random step."""
    rows, batch_size, epochs = 10_000, 25, 2
    chosen = seed()
    draw = random.Random(chosen)
    per_epoch = rows // (4 * batch_size)
    crash_step = draw.randrange(12, per_epoch)
    lose_step = draw.randrange(crash_step + 2, crash_step + per_epoch // 2)
    grow_step = draw.randrange(lose_step + 2, lose_step + per_epoch // 2)
    why = f"seed {chosen}: crash at step {crash_step}, node lost at {lose_step}, node added at {grow_step}"
    outcome: Dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["results"] = raydist.run(
                train,
                args=(source, rows, batch_size, epochs, str(tmp_path)),
                kwargs={"crash": (0, crash_step, 1), "hold": [(1, lose_step), (2, grow_step)]},
                num_workers=(3, 4),
                resources_per_worker={"CPU": 1, "slot": 1},
                max_restarts=2,
                restart_to_grow=True,
                **options(source, rows),
            )
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    held = lambda attempt, count: lambda: len(list(tmp_path.glob(f"hold-{attempt}-*.json"))) == count or not thread.is_alive()  # noqa: E731
    wait_for(held(1, 4), 300, f"4 ranks held at step {lose_step}; {why}")
    head = ray.get_runtime_context().get_node_id()
    cluster.remove_node(next(node for node in cluster.worker_nodes if node.node_id != head))
    wait_for(held(2, 3), 300, f"3 ranks held at step {grow_step}; {why}")
    cluster.add_node(**SLOT_NODE)
    thread.join(300)
    assert not thread.is_alive(), f"the run did not end; {why}"
    assert "error" not in outcome, f"{why}: {outcome.get('error')}"
    results = outcome["results"]
    assert [r["world"] for r in results] == [4] * 4 and {r["attempt"] for r in results} == {3}, why
    assert_each_row_once(tmp_path, rows, epochs, why)
