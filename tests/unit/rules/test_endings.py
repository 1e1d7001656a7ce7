"""Pure rules of how runs and ranks end: signals named, restart lines, the
signals `raydist run` handles, Ray's death paragraphs recognised, progress
off a terminal (a script's atexit handlers, run in real interpreters, are
in tests/live/test_script_endings.py)."""

from __future__ import annotations

import io
import signal

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
