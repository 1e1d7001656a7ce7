"""examples/elastic_ddp.py, the elastic DDP template: it runs under torchrun
alone (without raydist importable); warned of a preemption (SIGTERM, or the
deadline raydist.preemption_requested() reads), it saves a checkpoint at the
next step and exits with status 143; under ``raydist run --nnodes 1:3``
on a simulated cluster (head + 2 nodes, 2 CPUs each; ``-n 1``: one worker a
node, fewer processes to start) it survives losing a node: the run restarts
on the 2 workers that still fit, resumes from the last checkpoint (not from
step 0) and ends where an uninterrupted run ends.

The test removes the node once the first checkpoint is on disk (the file is
the progress marker); ``--step-delay`` only makes the steps long enough for
the removal to land mid-run on a fast machine.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict

import pytest
import torch
from conftest import REPO

EXAMPLE = REPO / "examples" / "elastic_ddp.py"
NODE = {"num_cpus": 2}
pytestmark = pytest.mark.nodes(NODE, NODE, NODE)  # for the tests that take the `cluster` fixture
STEPS, EVERY = 30, 5
PREFIX = r"^(?:\(rank=0 pid=\d+\) )?"  # raydist prefixes each line with its rank
FINAL = re.compile(PREFIX + r"final: step (\d+) world (\d+) loss ([0-9.]+)$", re.M)
RESUMED = re.compile(
    PREFIX + r"resumed from checkpoint at step (\d+) \(written by world size (\d+)\), world size (\d+) \(restart (\d+)\)$", re.M
)


def example_args(checkpoint_dir: Path, step_delay: float = 0.0) -> list:
    return [
        str(EXAMPLE),
        "--checkpoint-dir",
        str(checkpoint_dir),
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(EVERY),
        "--device",
        "cpu",
        "--step-delay",
        str(step_delay),
    ]


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """The example under plain torchrun, 2 processes, with raydist hidden: a
    ``raydist`` module first on the path that notes it was imported and
    raises ImportError, as a missing install would."""
    tmp = tmp_path_factory.mktemp("torchrun")
    hidden = tmp / "hide"
    hidden.mkdir()
    marker = tmp / "raydist-import-attempts"
    (hidden / "raydist.py").write_text(f"open({str(marker)!r}, 'a').write('x')\nraise ImportError('raydist hidden by the test')\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hidden), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *example_args(tmp / "checkpoints")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    return {"result": result, "marker": marker, "checkpoints": tmp / "checkpoints"}


@pytest.mark.soak  # the example under torchrun (the preemption warning runs in make test)
@pytest.mark.timeout(120)
def test_runs_under_torchrun_alone(torchrun_run: Dict[str, Any]) -> None:
    result = torchrun_run["result"]
    assert result.returncode == 0, result.stdout + result.stderr
    assert torchrun_run["marker"].read_text() == "xx"  # both ranks tried raydist and went on without it
    assert "starting at step 0, world size 2 (restart 0)" in result.stdout
    for step in range(EVERY, STEPS + 1, EVERY):
        assert re.search(rf"^step {step} world 2 loss [0-9.]+ \(checkpoint saved\)$", result.stdout, re.M), result.stdout
    final = FINAL.search(result.stdout)
    assert final and final.group(1, 2) == (str(STEPS), "2"), result.stdout
    checkpoint = torch.load(torchrun_run["checkpoints"] / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == STEPS and set(checkpoint) >= {"model", "optimizer", "step"}
    assert [p.name for p in torchrun_run["checkpoints"].iterdir()] == ["checkpoint.pt"]  # no temporary file left


@pytest.mark.timeout(60)
@pytest.mark.parametrize("warning", ["SIGTERM", pytest.param("deadline file", marks=pytest.mark.soak)])
def test_a_preemption_warning_saves_a_checkpoint_then_exits_143(tmp_path: Path, warning: str) -> None:
    """One process (world size 1, torchrun's variables set by hand). The
    warning comes as torchrun gives it (SIGTERM alone) or as raydist does with
    ``--preemption-signal none`` (only the deadline, in the file named by
    RAYDIST_PREEMPTION_FILE, which raydist.preemption_requested() reads)."""
    checkpoints, note = tmp_path / "checkpoints", tmp_path / "preempted"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RAYDIST_PREEMPTION_FILE=str(note),
    )
    process = subprocess.Popen(
        [sys.executable, *example_args(checkpoints, step_delay=0.2)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 40
        while not (checkpoints / "checkpoint.pt").exists():  # training is under way
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.05)  # polling the file the run writes, with a deadline
        if warning == "SIGTERM":
            process.send_signal(signal.SIGTERM)
        else:
            (tmp_path / "note.tmp").write_text(repr(time.time() + 20))
            os.replace(tmp_path / "note.tmp", note)  # whole, as raydist's node agent writes it
        stdout, stderr = process.communicate(timeout=40)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 143, stdout + stderr
    warned = re.search(r"^preemption warning(?: \(node leaves in (\d+) s\))?: checkpoint at step (\d+) saved, exiting$", stdout, re.M)
    assert warned, stdout + stderr
    step = int(warned.group(2))
    assert EVERY < step < STEPS and "final:" not in stdout
    assert re.search(rf"^step {step} world 1 loss [0-9.]+ \(checkpoint saved\)$", stdout, re.M), stdout
    if warning == "SIGTERM":
        assert warned.group(1) is None  # no deadline outside raydist
    else:
        assert 15 <= int(warned.group(1)) <= 20
    assert torch.load(checkpoints / "checkpoint.pt", weights_only=True)["step"] == step


@pytest.mark.soak  # the example end to end; node losses run in make test (test_elastic, test_state)
@pytest.mark.timeout(150)
def test_losing_a_node_resumes_from_the_checkpoint_on_fewer_workers(cluster: Any, torchrun_run: Dict[str, Any], tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [
        sys.executable,
        "-m",
        "raydist",
        "run",
        "--address",
        cluster.address,
        "--nnodes",
        "1:3",
        "-n",
        "1",
        "--accelerator",
        "cpu",
        "--max-restarts",
        "1",
        *example_args(checkpoints, step_delay=0.25),
    ]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (checkpoints / "checkpoint.pt").exists():  # the first checkpoint: the run is under way
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.1)  # polling the file the run writes, with a deadline
        first = torch.load(checkpoints / "checkpoint.pt", weights_only=True)
        assert first["world_size"] == 3 and first["step"] < STEPS
        cluster.remove_node(next(iter(cluster.worker_nodes)))  # never the head: the driver is there
        stdout, stderr = process.communicate(timeout=100)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stdout + stderr
    assert "starting at step 0, world size 3 (restart 0)" in stdout, stdout
    resumed = RESUMED.search(stdout)
    assert resumed, stdout + stderr
    step, written_by, world, restart = map(int, resumed.groups())
    assert EVERY <= step < STEPS and step % EVERY == 0  # from a checkpoint, not from step 0
    assert (written_by, world, restart) == (3, 2, 1)
    assert "node lost" in stderr and "restart 1 of 1" in stderr, stderr
    final = FINAL.search(stdout)
    assert final and final.group(1, 2) == (str(STEPS), "2"), stdout
    # The global batch is split over the ranks there are: the same trajectory
    # as torchrun's uninterrupted 2-rank run, up to rounding.
    reference = FINAL.search(torchrun_run["result"].stdout)
    assert reference, torchrun_run["result"].stdout
    assert float(final.group(3)) == pytest.approx(float(reference.group(3)), rel=1e-3, abs=1e-6)
