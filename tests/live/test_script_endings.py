"""How a torchrun script ends under `raydist run`, compared with torchrun:
its atexit handlers run, and a failing rank's traceback and error file land
in its log directory."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import pytest
import ray
from conftest import REPO

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("ray_local")]

SCRIPTS = REPO / "tests" / "scripts"
RUN_TIMEOUT_S = 120


def raydist_run(*args: str) -> subprocess.CompletedProcess:
    address = ray.get_runtime_context().gcs_address
    return subprocess.run(
        [sys.executable, "-m", "raydist", "run", "--address", address, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def torchrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def explain(result: subprocess.CompletedProcess) -> str:
    return f"exit status {result.returncode}\n--- stdout:\n{result.stdout}\n--- stderr:\n{result.stderr}"


@pytest.mark.parametrize("launcher", ["raydist", pytest.param("torchrun", marks=pytest.mark.soak)])  # torchrun: the reference
def test_a_scripts_atexit_handlers_run_when_it_ends(tmp_path: Path, launcher: str) -> None:
    args = [str(SCRIPTS / "atexit_script.py"), str(tmp_path)]
    result = raydist_run("-n", "2", *args) if launcher == "raydist" else torchrun(*args)
    assert result.returncode == 0, explain(result)  # a handler that raises does not fail the process
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atexit-0", "atexit-1"], explain(result)
    # Reported as Python reports it at exit, once per rank.
    output = result.stdout + result.stderr
    # (under torchrun the two ranks' lines may interleave: they share one stream)
    assert output.count("Exception ignored in atexit callback") == 2, explain(result)
    assert "logger of rank 0 failed at exit" in output and "logger of rank 1 failed at exit" in output


def rank_dirs(log_dir: Path, attempt: int = 0) -> List[Path]:
    (run_dir,) = log_dir.iterdir()
    return sorted((run_dir / f"attempt_{attempt}").iterdir())


def test_a_failing_ranks_traceback_and_error_file_are_in_its_log_directory(tmp_path: Path) -> None:
    # What torchrun 2.13 leaves for the same command (`--log-dir D -r 3`): the
    # rank's stderr.log holds its "[rank1]: "-prefixed traceback, error.json sits beside it.
    result = raydist_run("-n", "2", "--log-dir", str(tmp_path), "-r", "3", str(SCRIPTS / "record_fail.py"))
    assert result.returncode == 1, explain(result)
    rank_zero, rank_one = rank_dirs(tmp_path)
    stderr = (rank_one / "stderr.log").read_text()
    # Through torch's excepthook, as the interpreter prints an uncaught exception after init_process_group.
    assert "[rank1]: Traceback (most recent call last):" in stderr, stderr
    assert "[rank1]: ValueError: shard 1 is corrupt (recorded)" in stderr, stderr
    error = json.loads((rank_one / "error.json").read_text())  # torch's @record wrote it there
    assert "shard 1 is corrupt" in json.dumps(error)
    assert f"(error file {rank_one / 'error.json'}: ValueError: shard 1 is corrupt (recorded))" in result.stderr
    assert not (rank_zero / "error.json").exists()


HANDLERS = """
import atexit
def first(): print("first ran")
def broken(): raise ValueError("broken at exit")
def last(): print("last ran")
atexit.register(first)
atexit.register(broken)
atexit.register(last)
atexit.register(print, "unregistered")
atexit.unregister(print)
"""


def _normalised(text: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x…", re.sub(r'File "[^"]+"', 'File "…"', text))


def test_recorded_handlers_run_as_the_interpreter_runs_them_at_exit() -> None:
    at_exit = subprocess.run([sys.executable, "-c", HANDLERS], capture_output=True, text=True, timeout=60)
    recorded = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            from raydist.pool.worker import exit_hooks
            exit_hooks.install_recorder()
            exec(compile(open(0).read(), "<stdin>", "exec"))  # not "<string>": 3.13 shows the source of -c for it
            exit_hooks.run_recorded()
            print("after the script")
            exit_hooks.run_recorded()  # nothing twice
        """),
        ],
        input=HANDLERS,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert at_exit.stdout == "last ran\nfirst ran\n"
    assert recorded.stdout == "last ran\nfirst ran\nafter the script\n"  # and not again at the real exit
    assert _normalised(recorded.stderr) == _normalised(at_exit.stderr), recorded.stderr + at_exit.stderr


def test_the_processs_finalizers_outlive_a_script() -> None:
    # weakref.finalize registers its atexit handler when the first finalizer is made, here
    # after the worker started: run at a script's end, it would finalize every object of the
    # process and switch finalizers off for good.
    code = textwrap.dedent("""
        import os, tempfile, weakref
        from raydist.pool.worker import exit_hooks
        exit_hooks.install_recorder()
        kept = tempfile.TemporaryDirectory()  # the worker's, outliving the script
        exit_hooks.run_recorded()  # a script ended
        later = tempfile.TemporaryDirectory()
        name = later.name
        del later
        print(os.path.isdir(kept.name), weakref.finalize._shutdown, os.path.isdir(name))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["True", "False", "False"], result.stdout + result.stderr


# One kept worker runs the script again and again, as a warm restart or a
# second `raydist run` on the same workers does; faulthandler ends a hang.
KEPT_WORKER = """
import faulthandler, os, sys, tempfile
import ray.cloudpickle
from raydist.config.options import RunConfig
from raydist.pool.records import WorkerInfo, WorkerSpec
from raydist.pool.worker.actor import RayWorker
from raydist.pool.worker.script import run_script

faulthandler.dump_traceback_later(float(sys.argv[3]), exit=True)
worker = RayWorker(None)
info = WorkerInfo(
    rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, num_nodes=1, node_id="node",
    node_ip="127.0.0.1", pid=os.getpid(), device_ids=(), visible_device_ids=(), device_index=None, actor_index=0,
)
env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
worker.setup(WorkerSpec(worker=info, env=env, config=RunConfig(), device_type="cpu", init_kwargs=None))
call = ray.cloudpickle.dumps((run_script, (sys.argv[1], []), {}))
with tempfile.TemporaryDirectory() as scratch:
    for run in range(int(sys.argv[2])):
        os.mkdir(f"{scratch}/{run}")  # a store of its own: the last run's may not be gone yet
        os.environ["STORE_URL"] = f"file://{scratch}/{run}/store?rank=0&world_size=1"
        sent = worker.execute(call)  # a script's None, bare or (with the start-up's spans) as an Outcome
        assert sent is None or (sent.ok and sent.exception_type is None), (run, sent)
        print(f"run {run} ended", file=sys.stderr, flush=True)
"""


@pytest.mark.soak  # a race: a repetition test (the hold itself: tests/unit/worker/test_connections.py)
def test_a_ddp_script_that_destroys_its_group_ends_every_time_in_a_kept_worker() -> None:
    # Its namespace, freed after the script, held DDP's reducer and through it the
    # last reference to the destroyed group: freeing that joins gloo's threads with
    # the GIL held, while one of them needs it (a hang at the end of 1 script in
    # 30-130 here before the worker held the group itself). 400 runs, ~30 s.
    runs = 400
    result = subprocess.run(
        [sys.executable, "-c", KEPT_WORKER, str(SCRIPTS / "ddp_destroys_its_group.py"), str(runs), "90"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"run {runs - 1} ended" in result.stderr
