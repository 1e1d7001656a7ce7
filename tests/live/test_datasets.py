"""Ray Data per rank: ``datasets=`` / ``get_dataset_shard`` and ``split_dataset``.

Every rank runs one all_reduce per batch, so a rank with one batch more or
less than the others hangs the call (the group's ``timeout`` then fails the
test instead). Per epoch the ranks' rows must be disjoint and cover the
dataset but for the documented drop; after each test no raydist or Ray Data
actor is left.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pandas as pd
import pytest
import ray
import torch
import torch.distributed as dist
from conftest import REPO, assert_nothing_left, exported_figures, ray_address, repeats, use_local_ray, wait_for

import raydist

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("ray_local")]

EpochRows = Tuple[int, List[int], List[int]]  # batch count, row ids, batch sizes


@pytest.fixture(autouse=True)
def quiet_ray_data() -> None:
    ray.data.DataContext.get_current().enable_progress_bars = False


@pytest.fixture(scope="module")
def group() -> Iterator[raydist.WorkerGroup]:
    """Two ranks shared by the calls whose group start and end are not under test;
    after it, the leak check of every other test."""
    use_local_ray()  # set up before the function-scoped ray_local
    with raydist.WorkerGroup(2, timeout=90, resources_per_worker={"CPU": 0.5}) as shared:
        yield shared
    assert_all_gone()


def live_data_actors() -> List[str]:
    """Ray Data's split coordinators not dead, read from the GCS (no dashboard needed)."""
    table = ray._private.state.actors()
    return [a["ActorClassName"] for a in table.values() if "SplitCoordinator" in a["ActorClassName"] and a["State"] != "DEAD"]


def assert_all_gone(files: bool = True) -> None:
    """The shared leak check, and no split coordinator left (killed asynchronously)."""
    assert_nothing_left(files=files, within=10)
    wait_for(lambda: live_data_actors() == [], 30, "the split coordinators to be gone")


def ids_of(batch: Any) -> List[int]:
    if isinstance(batch, dict):
        return [int(i) for i in batch["id"]]
    if hasattr(batch, "iloc"):
        return [int(i) for i in batch["id"]]
    return [int(i) for i in batch.column("id").to_pylist()]


def read_epochs(name: str, epochs: int, batch_size: int, drop_last: bool, buffer: int, batch_format: str) -> List[EpochRows]:
    """Each epoch's batch count, row ids and batch sizes; one all_reduce per batch."""
    shard = raydist.get_dataset_shard(name)
    result = []
    for _ in range(epochs):
        ids: List[int] = []
        sizes: List[int] = []
        options = {"local_shuffle_buffer_size": buffer} if buffer else {}
        for batch in shard.iter_batches(batch_size=batch_size, drop_last=drop_last, batch_format=batch_format, **options):
            rows = ids_of(batch)
            ids += rows
            sizes.append(len(rows))
            step = torch.ones(1)
            dist.all_reduce(step)
        result.append((len(sizes), ids, sizes))
    return result


def uneven_dataset(rows: int, rng: random.Random) -> "ray.data.Dataset":
    """``rows`` rows with an ``id`` column, in blocks of random sizes."""
    cuts = sorted(rng.sample(range(1, rows), rng.randint(1, 7)))
    bounds = [0, *cuts, rows]
    frames = [pd.DataFrame({"id": np.arange(a, b), "x": np.arange(a, b) * 0.5}) for a, b in zip(bounds, bounds[1:])]
    return ray.data.from_pandas(frames)


def check_epochs(per_rank: List[List[EpochRows]], rows: int, batch_size: int, drop_last: bool, equal: bool = True) -> None:
    world = len(per_rank)
    for epoch in range(len(per_rank[0])):
        counts = [ranks[epoch][0] for ranks in per_rank]
        assert len(set(counts)) == 1, f"epoch {epoch}: batch counts by rank {counts}"
        seen: List[int] = []
        for _count, ids, sizes in (ranks[epoch] for ranks in per_rank):
            assert all(size == batch_size for size in sizes[:-1]), sizes
            assert not sizes or (sizes[-1] == batch_size if drop_last else 0 < sizes[-1] <= batch_size)
            seen += ids
        assert len(seen) == len(set(seen)), f"epoch {epoch}: a row went to two ranks"
        assert set(seen) <= set(range(rows))
        bound = (world - 1 if equal else 0) + (world * (batch_size - 1) if drop_last else 0)
        assert rows - len(seen) <= bound, f"epoch {epoch}: {rows - len(seen)} rows dropped, documented at most {bound}"


def read_cases(name: str, cases: List[Tuple[int, bool, int, str]]) -> List[List[EpochRows]]:
    """Two epochs of each (batch size, drop_last, shuffle buffer, format) in turn, over one shard."""
    return [read_epochs(name, 2, size, drop_last, buffer, fmt) for size, drop_last, buffer, fmt in cases]


def no_shard() -> None:
    raydist.get_dataset_shard("train")


def test_bad_datasets_fail_before_anything_starts() -> None:
    with pytest.raises(TypeError, match=r"datasets\['train'\] must be a ray.data.Dataset"):
        raydist.run(no_shard, num_workers=2, datasets={"train": [1, 2, 3]})
    with pytest.raises(ValueError, match="'eval', not given in datasets="):
        raydist.run(no_shard, num_workers=2, datasets={"train": ray.data.range(4)}, dataset_config=raydist.DataConfig(["eval"]))
    with pytest.raises(raydist.WorkerGroupError, match="no dataset 'train' was given to this call"):
        raydist.run(no_shard, num_workers=1)
    assert_all_gone()


def dies_in_epoch_zero(batch_size: int) -> List[EpochRows]:
    """Rank 1 dies after 3 batches of epoch 0, on the first attempt only."""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    shard = raydist.get_dataset_shard("train")
    if attempt == 0:
        for step, _ in enumerate(shard.iter_batches(batch_size=batch_size)):
            dist.all_reduce(torch.ones(1))
            if step == 2 and dist.get_rank() == 1:
                os.kill(os.getpid(), signal.SIGKILL)
    return read_epochs("train", 2, batch_size, False, 0, "numpy")


@pytest.mark.soak  # make test: splits on Ray (test_random_layouts_give_equal_batches_disjoint_full_epochs) and a restart's retry (test_faults::test_restart_after_crash_reruns_on_a_new_group)
def test_a_reader_killed_mid_epoch_restarts_on_a_fresh_split() -> None:
    # The group's timeout would fail the run if a survivor waited in the split's barrier for the dead reader.
    per_rank = raydist.run(
        dies_in_epoch_zero,
        args=(10,),
        num_workers=2,
        max_restarts=1,
        timeout=120,
        datasets={"train": ray.data.range(300, override_num_blocks=6)},
    )
    check_epochs(per_rank, 300, 10, False)
    assert sum(len(epochs[0][1]) for epochs in per_rank) == 300  # the next attempt reads full epochs
    assert_all_gone(files=False)  # a SIGKILLed rank's files go at the next start


SCRIPT = """
import json, os, sys
import ray, torch, torch.distributed as dist
import raydist

ray.data.DataContext.get_current().enable_progress_bars = False
dist.init_process_group("gloo")  # as any torchrun script does
shard = raydist.split_dataset(ray.data.range(203, override_num_blocks=5))
ids, count = [], 0
for batch in shard.iter_batches(batch_size=16, local_shuffle_buffer_size=20):
    ids += [int(i) for i in batch["id"]]
    count += 1
    dist.all_reduce(torch.ones(1))
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as file:
    json.dump({"count": count, "ids": ids}, file)
dist.destroy_process_group()
"""


@pytest.mark.soak  # the CLI entry point of datasets
def test_split_dataset_in_a_raydist_run_script(tmp_path: Path) -> None:
    script = tmp_path / "split.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "raydist", "run", "-n", "2", "--address", ray_address(), str(script), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert ranks[0]["count"] == ranks[1]["count"] == 7  # 101 rows each: 6 full batches and one of 5
    ids = ranks[0]["ids"] + ranks[1]["ids"]
    assert len(ids) == len(set(ids)) == 202  # disjoint; one row dropped for a row-equal split
    assert_all_gone()


def ignores_the_shard() -> int:
    return dist.get_rank()


@pytest.mark.soak  # the rule: tests/unit/rules/test_batches.py (no_cpus_for_data); make test: test_data_room's cluster whose CPUs the workers hold
def test_datasets_on_a_ray_with_no_cpu_left_warn_at_submit(caplog: pytest.LogCaptureFixture) -> None:
    """Every CPU of the shared Ray held by the workers: Ray Data could never run a task."""
    cpus = ray.cluster_resources()["CPU"]
    two_workers = raydist.WorkerGroup(2, timeout=60, resources_per_worker={"CPU": cpus / 2})
    with caplog.at_level(logging.WARNING, logger="raydist"), two_workers as group:
        assert group.run(ignores_the_shard, datasets={"train": ray.data.range(8)}) == [0, 1]
    warnings = [r.getMessage() for r in caplog.records if "Ray Data's tasks" in r.getMessage()]
    assert len(warnings) == 1 and f"{cpus:g} held by this group's 2 worker(s)" in warnings[0], warnings
    assert "resources_per_worker" in warnings[0]
    assert_all_gone()


# -- calls on one group of the module (last: its workers hold CPUs until the module ends) --


@repeats(1, 5)
def test_random_layouts_give_equal_batches_disjoint_full_epochs(group: raydist.WorkerGroup, repeat: int) -> None:
    """``repeat`` block layouts x 4 (batch size, buffer, drop_last, format), 2 epochs each:
    4 combinations in make test, 20 in make soak."""
    rng = random.Random(26)
    for layout in range(repeat):
        rows = rng.randint(30, 400)
        cases = [
            (rng.choice([1, 3, 7, 8, 16, 50]), rng.random() < 0.5, rng.choice([0, 5, 40]), rng.choice(["numpy", "pandas", "pyarrow"]))
            for _ in range(4)
        ]
        per_rank = group.run(read_cases, args=("train", cases), datasets={"train": uneven_dataset(rows, rng)})
        for index, (size, drop_last, buffer, fmt) in enumerate(cases):
            try:
                check_epochs([ranks[index] for ranks in per_rank], rows, size, drop_last)
            except AssertionError as error:
                raise AssertionError(
                    f"layout {layout}: {rows} rows, batch {size}, buffer {buffer}, drop_last {drop_last}, {fmt}"
                ) from error
    assert live_data_actors() == []  # each call's split went with it


def read_two(batch_size: int) -> Dict[str, List[int]]:
    return {
        name: [i for batch in raydist.get_dataset_shard(name).iter_batches(batch_size=batch_size) for i in ids_of(batch)]
        for name in ("train", "eval")
    }


def test_every_row_split_and_a_dataset_given_whole(group: raydist.WorkerGroup) -> None:
    config = raydist.DataConfig(datasets_to_split=["train"], equal=False)
    results = group.run(
        read_two,
        args=(8,),
        datasets={"train": ray.data.range(101, override_num_blocks=4), "eval": ray.data.range(20)},
        dataset_config=config,
    )
    train = [i for result in results for i in result["train"]]
    assert sorted(train) == list(range(101))  # every row, each once
    assert all(sorted(result["eval"]) == list(range(20)) for result in results)  # whole on every rank
    assert live_data_actors() == []  # the call's split went with it


def tensors(batch_size: int) -> Tuple[int, str, List[int]]:
    batches = list(raydist.get_dataset_shard("train").iter_torch_batches(batch_size=batch_size, dtypes=torch.float64))
    return len(batches), str(batches[0]["id"].dtype), [int(i) for b in batches for i in b["id"]]


def test_torch_batches_are_tensors_of_equal_count(group: raydist.WorkerGroup) -> None:
    results = group.run(tensors, args=(16,), datasets={"train": ray.data.range(75, override_num_blocks=3)})
    assert results[0][0] == results[1][0] == 3 and results[0][1] == "torch.float64"
    assert len(set(results[0][2]) | set(results[1][2])) == 74  # one row dropped to make the split row-equal
    # Each rank's waits for its batches are in the group's summary, and in Ray's metrics (sent every few seconds).
    ranks = group.summary().attempts[-1].ranks
    assert all(ranks[rank].waits["data"] > 0 for rank in (0, 1)), group.summary()
    wait_for(lambda: 'rank="1"' in exported_figures()["raydist_data_wait_seconds"], 90, "the data waits exported by Ray")
