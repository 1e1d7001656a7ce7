"""Pure rules of how runs and ranks end: signals named, restart lines, the
signals `raydist run` handles, Ray's death paragraphs recognised, progress
off a terminal, a script's atexit handlers reported as Python reports them."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from raydist import cli
from raydist.config import RunConfig
from raydist.pool.progress import PlainProgress, progress
from raydist.pool.rules.explain import explain_death
from raydist.pool.rules.logs import raylet_death_report_of
from raydist.pool.rules.policy import RestartReason, restart_line


def test_a_noted_signal_is_named() -> None:
    assert explain_death("", None, -signal.SIGTERM, True) == "killed by SIGTERM (a signal from outside the run)"
    assert explain_death("", None, 7, True) == "exited with status 7 (os._exit)"


def test_a_group_that_failed_while_starting_has_no_world_size_of_zero() -> None:
    line = restart_line(RestartReason("failure", "rank 1: ValueError: x", True), 0, 1, 3, 1)
    assert "world size was 0" not in line and "failed while starting" in line
    assert "world size was 4" in restart_line(RestartReason("failure", "x", True), 4, 1, 3, 1)


def test_signals_to_handle_default_and_parsing() -> None:
    assert RunConfig().signals_to_handle == ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torchrun's default
    assert RunConfig(signals_to_handle="sigterm, SIGUSR1").signals_to_handle == ("SIGTERM", "SIGUSR1")
    with pytest.raises(ValueError, match="SIGKILL cannot be handled"):
        RunConfig(signals_to_handle="SIGTERM,SIGKILL")
    with pytest.raises(ValueError, match="not a signal name"):
        RunConfig(signals_to_handle=["SIGNOPE"])
    with pytest.raises(ValueError, match="shutdown_timeout"):
        RunConfig(shutdown_timeout=0)


def test_torchruns_signal_flags_set_the_config() -> None:
    parser, _ = cli.build_parser()
    options = parser.parse_args(["run", "--signals-to-handle", "SIGTERM,SIGUSR2", "--shutdown_timeout", "5", "x.py"])
    config = cli.build_config(options)
    assert (config.signals_to_handle, config.shutdown_timeout) == (("SIGTERM", "SIGUSR2"), 5.0)


def test_rays_paragraph_on_a_followed_worker_is_recognised() -> None:
    paragraph = (
        "A worker died or was killed while executing a task by an unexpected system error. To troubleshoot "
        "the problem, check the logs for the dead worker. Lease ID: 01 Worker ID: da Node ID: 32 Worker IP "
        "address: 192.0.2.2 Worker port: 38767 Worker PID: 14448 Worker exit type: SYSTEM_ERROR"
    )
    assert raylet_death_report_of([paragraph], {"14448"})
    assert not raylet_death_report_of([paragraph], {"999"})  # someone else's worker: Ray says it
    assert not raylet_death_report_of(["Some other raylet message"], {"14448"})


def test_progress_off_a_terminal_is_one_plain_line(capsys: pytest.CaptureFixture) -> None:
    assert isinstance(progress(2, "raydist: workers started", io.StringIO()), PlainProgress)
    with PlainProgress(2, "raydist: workers started", delay=0) as bar:
        bar.update(1)
        bar.set_postfix_str("waiting")
        bar.update(0)
        bar.update(1)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines() == ["raydist: workers started: 1 of 2 so far, still waiting", "raydist: workers started: 2 of 2"]


def test_a_quick_phase_prints_nothing(capsys: pytest.CaptureFixture) -> None:
    with PlainProgress(2, "raydist: workers started") as bar:
        bar.update(2)
    assert capsys.readouterr().err == ""


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
        [sys.executable, "-c", textwrap.dedent("""
            from raydist.pool.worker import exit_hooks
            exit_hooks.install_recorder()
            exec(compile(open(0).read(), "<string>", "exec"))
            exit_hooks.run_recorded()
            print("after the script")
            exit_hooks.run_recorded()  # nothing twice
        """)],
        input=HANDLERS, capture_output=True, text=True, timeout=60,
    )
    assert at_exit.stdout == "last ran\nfirst ran\n"
    assert recorded.stdout == "last ran\nfirst ran\nafter the script\n"  # and not again at the real exit
    assert _normalised(recorded.stderr) == _normalised(at_exit.stderr), recorded.stderr + at_exit.stderr
