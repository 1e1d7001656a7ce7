"""The documentation's examples run as written: every fenced block marked
``<!-- runnable -->`` in README.md and under docs/ (each runs on CPU with
2 workers).

A Python block runs in this process as a script would (its functions
defined in ``__main__``), on the session's local Ray, which ``raydist.run``
finds already initialised. A bash block runs each of its commands
(``raydist run ...``, ``python ...``) in a subprocess attached to that Ray
through RAY_ADDRESS, from the repository's root. The README's quickstart
runs in ``make test``; the guides' blocks run under ``soak`` (each shows a
behaviour whose own test is in ``make test``: failures in test_faults,
warm restarts in test_warm_restarts, state in test_state, hangs in
test_hangs, datasets in test_datasets, the group in test_group), and a
block that repeats one already listed runs once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List

import pytest
from conftest import assert_nothing_left, ray_address

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    if spec.name not in sys.modules:
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def _cases() -> List[Any]:
    seen = set()
    cases = []
    for block in _reference().runnable_blocks():
        if block.code in seen:
            continue
        seen.add(block.code)
        marks = [] if block.path == "README.md" else [pytest.mark.soak]
        cases.append(pytest.param(block, id=f"{block.path}:{block.line}", marks=marks))
    return cases


def _commands(code: str) -> List[List[str]]:
    """A bash block's commands, continuation lines joined, comments left out."""
    joined = code.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


def _argv(words: List[str]) -> List[str]:
    if words[0] == "raydist":
        return [sys.executable, "-m", "raydist", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    raise AssertionError(f"a runnable bash block runs raydist or python, not {words[0]!r}")


@pytest.mark.parametrize("block", _cases())
def test_the_block_runs_as_written(block: Any, ray_local: None) -> None:
    where = f"{block.path}:{block.line}"
    if block.language == "python":
        output = io.StringIO()
        namespace: Dict[str, Any] = {"__name__": "__main__"}
        with contextlib.redirect_stdout(output):
            exec(compile(block.code, where, "exec"), namespace)
        assert output.getvalue().strip(), f"{where} printed nothing"
    else:
        env = dict(os.environ, RAY_ADDRESS=ray_address())
        for words in _commands(block.code):
            result = subprocess.run(_argv(words), cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            assert result.returncode == 0, f"{where}: {shlex.join(words)}\n--- stdout:\n{result.stdout}\n--- stderr:\n{result.stderr}"
    assert_nothing_left(within=15)
