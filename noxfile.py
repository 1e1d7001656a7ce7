"""The version matrix: raydist's built wheel on the versions users install.

    python -m nox            # both ends (make matrix; .ci/run runs it)
    python -m nox -s oldest  # one
    python -m nox -s newest-live  # the newest, with the whole live tier of make test

- ``newest``: the newest torch and Ray on the newest Python their wheels
  exist for;
- ``oldest``: the oldest versions ``pyproject.toml`` claims, on the oldest
  Python it claims.

Each installs raydist from its wheel (built here, not the checkout: a file
missing from the package fails), runs the unit tier and a live smoke subset
(``SMOKE``). The full live tier runs on the default environment (``make
test``). horovod is left out: it builds from source for each Python
(minutes), and its live tests skip, saying why, where it is absent.

nox rather than tox: the sessions are Python (the versions and the smoke
subset are data, one loop makes both sessions), and it finds pyenv's
interpreters by name. torch's wheels come from the package index (the CUDA
build, which runs on CPU); the machine's pip configuration, which pins torch
to the cached CPU wheel, is set aside for these environments.
"""

from __future__ import annotations

import glob
import os
import tempfile
from typing import List

import nox

REPO = os.path.dirname(os.path.abspath(__file__))
nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True
nox.options.reuse_existing_virtualenvs = False

# name -> (Python, pins). Oldest: pyproject.toml's floors (requires-python, torch, ray).
ENDS = {
    "newest": ("3.13", ["torch==2.15.0", "ray[default,data]==2.60.0"]),
    "oldest": ("3.9", ["torch==2.4.0", "ray[default,data]==2.51.2"]),
}

# A run; a crash with a spare and save_state; a torchrun script under raydist run
# beside torchrun itself; a Ray Data shard read exactly once across a crash.
SMOKE = [
    "tests/live/test_group.py::test_run_returns_rank_ordered_results_and_collectives_work",
    "tests/live/test_state.py::test_a_crashed_rank_resumes_bit_identical[warm-spare]",
    "tests/live/test_cli.py::test_torchrun_script_gives_the_same_loss_as_under_torchrun",
    "tests/live/test_exactly_once.py::test_a_crash_mid_epoch_reads_each_row_once_and_ends_with_the_weights_of_a_run_that_never_failed[ray-data]",
]


def _wheel(session: nox.Session) -> str:
    """raydist's wheel, built from this checkout into a fresh folder."""
    out = tempfile.mkdtemp(prefix="raydist-wheel-")
    session.run("python", "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", out, REPO)
    (wheel,) = glob.glob(os.path.join(out, "raydist-*.whl"))
    return wheel


def _interpreter(version: str) -> str:
    """pyenv's interpreter of ``version`` where pyenv has one (its shims answer
    only for the versions selected), else the version for nox to find."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")))
    return found[-1] if found else version


def _check_versions(session: nox.Session, pins: List[str]) -> None:
    """Each pinned package is the version asked for (a machine's own pip settings
    may cap it), or the session fails naming the one installed."""
    for pin in pins:
        name, wanted = pin.split("==")
        name = name.split("[")[0]
        found = session.run("python", "-c", f"import importlib.metadata as m; print(m.version({name!r}))", silent=True)
        got = str(found).strip().splitlines()[-1] if found else "nothing"
        if got.split("+")[0] != wanted:
            session.error(f"asked for {name}=={wanted}, got {got}")


def _end(name: str, python: str, pins: List[str], live: List[str]) -> None:
    """A session ``name``: the wheel, with ``pins``, on ``python``; the unit tier and the live tests ``live``."""

    @nox.session(name=name, python=_interpreter(python))
    def session(session: nox.Session) -> None:
        session.env["PIP_CONFIG_FILE"] = os.devnull  # torch from the index, not the machine's pinned CPU wheel
        wheel = _wheel(session)
        session.install(f"raydist[test,data] @ file://{wheel}", *pins)
        _check_versions(session, pins)
        # The tests import the wheel, never the checkout: pytest runs from another folder (Ray puts
        # the driver's folder on its workers' path), as `pytest` (`python -m` puts the folder first),
        # and Python's own subprocesses do not put theirs first (PYTHONSAFEPATH, Python >= 3.11).
        session.env["RAYDIST_TEST_INSTALLED"] = "1"
        session.env["PYTHONSAFEPATH"] = "1"
        options = ["-q", "-p", "no:cacheprovider", "-c", os.path.join(REPO, "pyproject.toml"), "--rootdir", REPO, "-n", "2"]
        session.chdir(tempfile.mkdtemp(prefix="raydist-matrix-"))
        session.run("pytest", *options, os.path.join(REPO, "tests", "unit"))
        session.run("pytest", *options, "--dist", "loadfile", *live)


for _name, (_python, _pins) in ENDS.items():
    _end(_name, _python, _pins, [os.path.join(REPO, test) for test in SMOKE])
# The whole live tier of `make test` on the newest versions (about 10 minutes more: not in CI;
# `python -m nox -s newest-live` before a release, or when torch or Ray move).
_end("newest-live", *ENDS["newest"], ["-m", "not soak", os.path.join(REPO, "tests", "live")])
nox.options.sessions = list(ENDS)
