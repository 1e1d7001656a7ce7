"""Helpers for the core tests: a launcher-free environment, free ports, and
real torchrun / fake-SLURM launches of the worker scripts in this folder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

SCRIPTS = Path(__file__).resolve().parent
LAUNCH_TIMEOUT_S = 60

# Every variable a launcher (torchrun, SLURM, MPI, horovodrun) may set: tests
# clear them so the environment the test suite runs in cannot leak in.
LAUNCHER_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
    }
)
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "HOROVOD_", "TORCHELASTIC_")


def is_launcher_var(name: str) -> bool:
    return name in LAUNCHER_NAMES or name.startswith(LAUNCHER_PREFIXES)


def clean_env(extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """A copy of os.environ without launcher variables, plus ``extra``; this
    folder first on the path (the scripts here import their helpers from it,
    also where PYTHONSAFEPATH keeps a script's own folder off the path)."""
    env = {k: v for k, v in os.environ.items() if not is_launcher_var(k)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def clear_launcher_vars(monkeypatch: Any) -> None:
    """Remove launcher variables from os.environ through a pytest monkeypatch (restored afterwards)."""
    for name in [k for k in os.environ if is_launcher_var(k)]:
        monkeypatch.delenv(name)


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _report(proc_output: str) -> str:
    return proc_output[-6000:]


def run_torchrun(script: str, nproc: int, outdir: Path) -> None:
    """Launch ``script outdir`` with real torchrun; fail with its output when it fails."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(SCRIPTS / script),
        str(outdir),
    ]
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{_report(proc.stdout + proc.stderr)}"


def run_fake_slurm(script: str, tasks: List[Dict[str, str]], outdir: Path) -> None:
    """Start one process per task with only SLURM variables (plus MASTER_*), as srun would."""
    shared = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPTS / script), str(outdir)],
            env=clean_env({**shared, **task}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for task in tasks
    ]
    outputs: List[str] = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
            outputs.append(out)
    finally:
        for proc in procs:  # a rank stuck in rendezvous must not outlive the test
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for task, proc, out in zip(tasks, procs, outputs):
        assert proc.returncode == 0, f"task {task} exited {proc.returncode}:\n{_report(out)}"


def load_results(outdir: Path, world_size: int) -> List[dict]:
    """Every rank's JSON result, indexed by rank; fails when one is missing."""
    found = sorted(p.name for p in outdir.glob("rank*.json"))
    expected = sorted(f"rank{r}.json" for r in range(world_size))
    assert found == expected, f"result files {found}, expected {expected}"
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(world_size)]


def write_result(outdir: Path, rank: int, result: dict) -> None:
    """Write atomically, so the parent never reads half a file."""
    tmp = outdir / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(result, sort_keys=True))
    os.replace(tmp, outdir / f"rank{rank}.json")
