"""Ray Data beside workers that hold every CPU of the machine or cluster.

Ray Data's read and transform tasks need a CPU each beside the workers'.
A private Ray that raydist starts has a logical CPU beyond the machine's
for them, so a group sized to the machine still reads its splits to the
end; on a cluster whose CPUs the workers hold (and which cannot grow), both
``datasets=`` and ``raydist.split_dataset`` fail within seconds with an
error that names the fix, instead of waiting forever for the first batch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
import ray
from conftest import REPO, assert_nothing_left, wait_for

import raydist

pytestmark = pytest.mark.timeout(240)

NODE = {"num_cpus": 2}  # the warm shape of the elastic tests
WHOLE_NODE = {"CPU": 2}
FIX = "Give each worker a fraction of a CPU (resources_per_worker={'CPU': 0.5}"
ERROR_BOUND_S = 30.0

# Both paths in one script: datasets= (read through get_dataset_shard) when
# run by raydist.run, split_dataset when run by `raydist run`.
SPLIT_SCRIPT = """
import json, os, sys
import ray, torch, torch.distributed as dist
import raydist

ray.data.DataContext.get_current().enable_progress_bars = False
dist.init_process_group("gloo")
shard = raydist.split_dataset(ray.data.range(200, override_num_blocks=4).map_batches(lambda batch: batch))
rows = [int(i) for batch in shard.iter_batches(batch_size=10) for i in batch["id"]]
dist.all_reduce(torch.ones(1))
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as file:
    json.dump(rows, file)
dist.destroy_process_group()
"""

# The group first: building a dataset before Ray is up would start a default Ray (Ray Data's own ray.init).
DATASETS_DRIVER = """
import json, sys
import ray, raydist

def read_shard():
    shard = raydist.get_dataset_shard("train")
    return [int(i) for batch in shard.iter_batches(batch_size=10) for i in batch["id"]]

with raydist.WorkerGroup(2, resources_per_worker={"CPU": float(sys.argv[1])}, timeout=120) as group:
    ray.data.DataContext.get_current().enable_progress_bars = False
    ranks = group.run(read_shard, datasets={"train": ray.data.range(200, override_num_blocks=4).map_batches(lambda batch: batch)})
print("ROWS " + json.dumps(ranks))
"""


def machine_cpus() -> float:
    """The CPUs a private Ray counts on this machine (Ray's count: cgroup limits included)."""
    from ray._private.utils import get_num_cpus

    return float(get_num_cpus())


@pytest.fixture
def private_env() -> Iterator[Dict[str, str]]:
    """An environment whose runs start a private Ray of their own (short temp dir: Ray's socket paths are bounded)."""
    temp_dir = tempfile.mkdtemp(prefix="rdd", dir="/tmp" if os.path.isdir("/tmp") else None)
    yield {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "RAY_TMPDIR": temp_dir}
    shutil.rmtree(temp_dir, ignore_errors=True)


def explain(result: subprocess.CompletedProcess) -> str:
    return f"exit status {result.returncode}\n--- stdout:\n{result.stdout[-3000:]}\n--- stderr:\n{result.stderr[-3000:]}"


def assert_rows_split_whole(per_rank: List[List[int]]) -> None:
    rows = [row for rank in per_rank for row in rank]
    assert len(per_rank) == 2 and len(rows) == len(set(rows)) == 200, per_rank


@pytest.mark.soak  # a private Ray of its own; make test: test_datasets_on_a_cluster_whose_cpus_the_workers_hold_fail_naming_the_fix
def test_a_private_ray_leaves_ray_data_a_cpu_beside_workers_that_hold_the_machine(private_env: Dict[str, str], tmp_path: Path) -> None:
    # Two workers holding every CPU of the machine (-n equal to the cores, on the 2-core machine this was found on).
    per_worker = f"{machine_cpus() / 2:g}"
    script = tmp_path / "split.py"
    script.write_text(SPLIT_SCRIPT)
    command = ["run", "--standalone", "-n", "2", "--accelerator", "cpu", "--resources-per-worker", json.dumps({"CPU": float(per_worker)})]
    run = subprocess.run(
        [sys.executable, "-m", "raydist", *command, str(script), str(tmp_path)],
        env=private_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, explain(run)
    assert_rows_split_whole([json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)])


@pytest.mark.soak  # the Python entry point of the private Ray the test above starts through the CLI
def test_a_private_ray_of_a_python_driver_leaves_ray_data_a_cpu(private_env: Dict[str, str]) -> None:
    per_worker = f"{machine_cpus() / 2:g}"
    driver = subprocess.run(
        [sys.executable, "-c", DATASETS_DRIVER, per_worker], env=private_env, cwd=REPO, capture_output=True, text=True, timeout=180
    )
    lines = [line for line in driver.stdout.splitlines() if line.startswith("ROWS ")]
    assert driver.returncode == 0 and len(lines) == 1, explain(driver)
    assert_rows_split_whole(json.loads(lines[0][len("ROWS ") :]))


def read_shard() -> int:
    shard = raydist.get_dataset_shard("train")
    return sum(len(batch["id"]) for batch in shard.iter_batches(batch_size=10))


def live_data_actors() -> List[str]:
    table = ray._private.state.actors()
    return [a["ActorClassName"] for a in table.values() if "SplitCoordinator" in a["ActorClassName"] and a["State"] != "DEAD"]


@pytest.mark.nodes(NODE, NODE, NODE)
def test_datasets_on_a_cluster_whose_cpus_the_workers_hold_fail_naming_the_fix(cluster: object) -> None:
    ray.data.DataContext.get_current().enable_progress_bars = False
    started = time.monotonic()
    with pytest.raises(raydist.WorkerGroupError) as failed:
        raydist.run(read_shard, num_workers=3, resources_per_worker=WHOLE_NODE, timeout=120, datasets={"train": ray.data.range(60)})
    elapsed = time.monotonic() - started
    assert "none can ever be free while they run" in str(failed.value) and FIX in str(failed.value), str(failed.value)
    assert elapsed < ERROR_BOUND_S, f"took {elapsed:.1f} s"
    assert_nothing_left(within=10)
    wait_for(lambda: live_data_actors() == [], 30, "the split coordinators to be gone")


@pytest.mark.soak  # the script entry point of the check test_datasets_on_a_cluster_whose_cpus_the_workers_hold_fail_naming_the_fix makes
@pytest.mark.nodes(NODE, NODE, NODE)
def test_split_dataset_in_a_script_on_a_cluster_whose_cpus_the_workers_hold_fails_naming_the_fix(cluster: object, tmp_path: Path) -> None:
    script = tmp_path / "split.py"
    script.write_text(SPLIT_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    address = ray.get_runtime_context().gcs_address
    command = ["run", "--address", address, "-n", "3", "--accelerator", "cpu", "--resources-per-worker", json.dumps(WHOLE_NODE)]
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "raydist", *command, str(script), str(tmp_path)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert run.returncode == 1, explain(run)
    assert "none can ever be free while they run" in run.stderr and FIX in run.stderr, explain(run)
    assert elapsed < ERROR_BOUND_S, f"took {elapsed:.1f} s (interpreter start included)"
    assert_nothing_left(within=15)  # the driver's exit ends its actors asynchronously
