"""pdb on any rank: breakpoint() under `raydist run` and raydist.run opens pdb
in the launching terminal (a pseudo-terminal here); without a terminal,
`raydist debug` attaches from another shell."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

import pytest
from conftest import ray_address

pexpect = pytest.importorskip("pexpect")

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("ray_local")]
START_S = 120  # two workers from nothing, on a busy machine


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("RAY_ADDRESS", None)
    return env


def _raydist_run(*args: str) -> list:
    # Attached to the session's Ray: what is tested is pdb, not the start of a private Ray.
    return [sys.executable, "-m", "raydist", "run", "--address", ray_address(), "-n", "2", "--accelerator", "cpu", *args]


def _debug_rank_one(child: "pexpect.spawn") -> None:
    """At rank 1's (Pdb) prompt: its RANK is '1', then continue."""
    child.expect_exact("(Pdb)", timeout=START_S)
    child.sendline('p os.environ["RANK"]')
    child.expect_exact("'1'", timeout=30)
    child.expect_exact("(Pdb)", timeout=30)
    child.sendline("c")


def test_breakpoint_on_rank_one_of_raydist_run_opens_pdb_in_the_terminal() -> None:
    command = _raydist_run(str(SCRIPTS / "breakpoint_rank1.py"))
    child = pexpect.spawn(command[0], command[1:], env=_env(), encoding="utf-8", timeout=START_S)
    try:
        child.expect_exact("rank 1 (pid", timeout=START_S)
        _debug_rank_one(child)
        child.expect_exact("rank 0 finished", timeout=60)
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before


@pytest.mark.soak  # the API entry point of pdb (the CLI one runs in make test)
def test_breakpoint_from_raydist_run_in_a_python_script() -> None:
    child = pexpect.spawn(
        sys.executable, [str(SCRIPTS / "breakpoint_run.py"), ray_address()], env=_env(), encoding="utf-8", timeout=START_S
    )
    try:
        _debug_rank_one(child)
        child.expect_exact("results: ['0', '1']", timeout=60)
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before


@pytest.mark.soak  # a second rank at a breakpoint
def test_a_second_rank_waits_its_turn_and_says_so() -> None:
    command = _raydist_run(str(SCRIPTS / "breakpoint_rank1.py"), "--both")
    child = pexpect.spawn(command[0], command[1:], env=_env(), encoding="utf-8", timeout=START_S)
    try:
        child.expect_exact("(Pdb)", timeout=START_S)
        if "it waits its turn" not in child.before:  # the other rank stopped too (before or after the prompt)
            child.expect_exact("it waits its turn", timeout=60)
        child.sendline('p os.environ["RANK"]')
        child.expect(r"'([01])'", timeout=30)
        first = child.match.group(1)
        child.sendline("c")
        child.expect_exact("(Pdb)", timeout=60)  # the second rank's session
        child.sendline('p os.environ["RANK"]')
        child.expect(r"'([01])'", timeout=30)
        assert child.match.group(1) != first
        child.sendline("c")
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before


def test_without_a_terminal_raydist_debug_attaches_from_another_shell() -> None:
    run = subprocess.Popen(
        _raydist_run(str(SCRIPTS / "breakpoint_rank1.py")),
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + START_S
        seen = []
        assert run.stdout is not None
        for line in run.stdout:  # the run says how to attach, then waits
            seen.append(line)
            if "raydist debug --rank 1" in line or time.monotonic() > deadline:
                break
        assert any("raydist debug --rank 1" in line for line in seen), "".join(seen)
        listed = subprocess.run(
            [sys.executable, "-m", "raydist", "debug", "--list"], env=_env(), capture_output=True, text=True, timeout=60
        )
        assert "rank 1: breakpoint() in breakpoint_rank1.py" in listed.stdout, listed.stdout + listed.stderr
        child = pexpect.spawn(sys.executable, ["-m", "raydist", "debug", "--rank", "1"], env=_env(), encoding="utf-8", timeout=60)
        _debug_rank_one(child)
        child.expect(pexpect.EOF, timeout=60)
        child.close()
        assert child.exitstatus == 0, child.before
        rest, _ = run.communicate(timeout=120)
        assert run.returncode == 0, "".join(seen) + rest
        assert "rank 1 finished" in rest
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def test_post_mortem_keeps_a_raising_rank_in_pdb_at_its_exception() -> None:
    command = _raydist_run("--post-mortem", str(SCRIPTS / "raise_rank1.py"))
    child = pexpect.spawn(command[0], command[1:], env=_env(), encoding="utf-8", timeout=START_S)
    try:
        child.expect_exact("post-mortem (KeyError)", timeout=START_S)
        child.expect_exact("(Pdb)", timeout=60)
        child.sendline("p table")
        child.expect_exact("{'rows': 3}", timeout=30)
        _debug_rank_one(child)
        child.expect_exact("KeyError: 'columns'", timeout=60)  # then the run fails as it would have
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close()
    assert child.exitstatus == 1, child.before
