"""``run_ahead`` on a real Ray: a function that needs its rank before
``load_state`` falls back to running from the top (the right values, no wait
on what never comes), and a ``raydist run --run-ahead`` script restarts from
a model its processes built ahead. The bit-identical resume from a model built
ahead is ``test_state::test_a_crashed_rank_resumes_bit_identical[warm-spare-run-ahead]``;
which processes are asked, and when, is the engine's (``test_engine_run_ahead``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict

import pytest
import ray
import ray.cloudpickle
from conftest import REPO, assert_nothing_left, ray_address
from marks import read_marks, write_mark

import raydist

pytestmark = pytest.mark.timeout(300)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import this module


def rank_first(builds: str) -> Dict[str, Any]:
    """Reads its rank before load_state (what run_ahead asks a function not to do); rank 1 dies in attempt 0."""
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    write_mark(builds, f"build-{os.getpid()}-{attempt}.json", {"pid": os.getpid(), "rank": rank, "attempt": attempt})
    raydist.load_state()
    if attempt == 0 and rank == 1:
        os._exit(3)
    return {"rank": rank, "attempt": attempt, "pid": os.getpid()}


@pytest.mark.usefixtures("ray_local")
def test_a_function_that_needs_its_rank_before_load_state_runs_from_the_top(tmp_path: Path) -> None:
    results = raydist.run(
        rank_first,
        args=(str(tmp_path),),
        num_workers=2,
        max_restarts=1,
        spare_workers=1,
        resources_per_worker={"CPU": 0.5},
        run_ahead=True,
    )
    assert [(r["rank"], r["attempt"]) for r in results] == [(0, 1), (1, 1)]
    # Attempt 1 ran on the main thread from the top in each process, with its rank (the run ahead raised at once).
    builds = read_marks(tmp_path, "build-*.json")
    assert sorted((b["rank"], b["pid"]) for b in builds if b["attempt"] == 1) == sorted((r["rank"], r["pid"]) for r in results)
    assert_nothing_left(within=30, files=False)


SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import raydist
    sys.path.insert(0, {marks_module!r})
    from marks import write_mark

    model = torch.nn.Linear(4, 4)  # before load_state: no rank needed
    write_mark({builds!r}, f"build-{{os.getpid()}}-{{time.monotonic_ns()}}.json", {{"pid": os.getpid(), "rank": os.environ.get("RANK")}})
    resumed = raydist.load_state(model=model)
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    raydist.save_state(0, model=model)
    raydist.wait_committed()
    if attempt == 0 and rank == 1:
        sys.exit(3)
    print(f"rank {{rank}} attempt {{attempt}} pid {{os.getpid()}} resumed {{resumed}}", flush=True)
    """
)


@pytest.mark.soak  # the same path as a function's (raydist run sends run_script as its call): test_state's run-ahead case in make test
@pytest.mark.usefixtures("ray_local")
def test_a_script_run_ahead_restarts_from_the_model_its_processes_built_ahead(tmp_path: Path) -> None:
    builds = tmp_path / "builds"
    builds.mkdir()
    script = tmp_path / "ahead.py"
    script.write_text(SCRIPT.format(marks_module=str(REPO / "tests" / "live"), builds=str(builds)))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "raydist", "run", "--address", ray_address(), "-n", "2", "--accelerator", "cpu"]
    flags = [
        "--max-restarts",
        "1",
        "--restart-mode",
        "warm",
        "--spare-workers",
        "1",
        "--run-ahead",
        "--resources-per-worker",
        '{"CPU": 0.5}',
    ]
    result = subprocess.run([*command, *flags, str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    ended = [line.split() for line in result.stdout.splitlines() if " attempt 1 pid " in line]
    assert sorted(int(words[words.index("rank") + 1]) for words in ended) == [0, 1], result.stdout
    assert all(words[-1] == "0" for words in ended), result.stdout  # both resumed after step 0
    ahead = {b["pid"] for b in read_marks(builds, "build-*.json") if b["rank"] is None}
    assert {int(words[words.index("pid") + 1]) for words in ended} <= ahead, (ended, ahead)
    assert_nothing_left(within=30, files=False)
