"""The SLURM recipe (cluster_configs/slurm-symmetric-run.sbatch) on one node:
the batch file runs `ray symmetric-run` (a real Ray head on a loopback
address) and `raydist run --nnodes 1 -n 1`, and the script's exit status, 0
or 3, is the job's.

`ray symmetric-run` ends with `ray stop`, which stops every Ray process it can
see, and refuses to start when it sees another Ray: each job runs in a
private PID namespace (`unshare`), so it sees (and stops) only its own."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

import pytest
from conftest import REPO

RECIPE = REPO / "cluster_configs" / "slurm-symmetric-run.sbatch"
BIN = Path(sys.executable).parent
SCRIPT = """\
import os, sys
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "local world", os.environ["LOCAL_WORLD_SIZE"], flush=True)
sys.exit(int(sys.argv[1]))
"""
FAKE_SRUN = """#!/bin/sh
# srun on one node: drop srun's --options, run the command once.
while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
exec "$@"
"""
FAKE_SCONTROL = "#!/bin/sh\necho localhost\n"

pytestmark = pytest.mark.timeout(300)


def private_pid_namespace() -> List[str]:
    """The prefix that runs a command in its own PID namespace, or skip."""
    for prefix in (["unshare", "--pid", "--fork", "--mount-proc"], ["unshare", "-r", "--pid", "--fork", "--mount-proc"]):
        if shutil.which("unshare") and subprocess.run([*prefix, "true"], capture_output=True, check=False).returncode == 0:
            return prefix
    pytest.skip(
        "needs a private PID namespace (unshare): `ray symmetric-run` ends with `ray stop`, "
        "which would stop every other Ray on this machine"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_slurm_stubs(directory: Path) -> None:
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        path = directory / name
        path.write_text(text)
        path.chmod(0o755)


@pytest.mark.parametrize("status", [3, pytest.param(0, marks=pytest.mark.soak)])  # a failing status is the harder case
def test_the_scripts_exit_status_is_the_jobs(tmp_path: Path, status: int) -> None:
    prefix = private_pid_namespace()
    make_slurm_stubs(tmp_path)
    script = tmp_path / "exit_with.py"
    script.write_text(SCRIPT)
    ray_dir = tempfile.mkdtemp(prefix="rdsl")  # short: Ray's socket paths live under it
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")},
        "PATH": os.pathsep.join([str(tmp_path), str(BIN), os.environ["PATH"]]),
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": "localhost",
        "RAY_HEAD_IP": "127.0.0.1",
        "RAY_PORT": str(free_port()),
        "RAY_START_ARGS": f"--num-cpus=1 --include-dashboard=false --temp-dir={ray_dir}",
        "RAYDIST_ARGS": "--accelerator cpu",
    }
    try:
        result = subprocess.run(
            [*prefix, "bash", str(RECIPE), str(script), str(status)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    output = result.stdout + result.stderr
    assert result.returncode == status, output[-4000:]
    assert "rank 0 of 1 local world 1" in output, output[-4000:]
    assert "Running command on head node" in output, output[-4000:]
