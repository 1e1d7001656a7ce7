"""Every flag of ``torchrun --help`` is accounted for in raydist's table:
honoured (and ``raydist run`` takes every torchrun spelling of it) or
refused (and ``raydist run`` exits 2 with the table's reason). No Ray."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from typing import Dict, List, Set

import pytest

from raydist import cli
from raydist.config import RunConfig

OPTIONS = {field.name for field in dataclasses.fields(RunConfig)}
# Honoured by RunConfig fields that the signal-handling work adds (issue 20);
# checked once those fields exist.
ADDED_ELSEWHERE = {"signals_to_handle", "shutdown_timeout"}


def torchrun_flags() -> Dict[str, List[str]]:
    """Each option ``torchrun --help`` lists, by its first long spelling: all
    its spellings. Read from torchrun's own parser, in this process."""
    from torch.distributed.run import get_args_parser

    flags: Dict[str, List[str]] = {}
    for action in get_args_parser()._actions:
        spellings = list(action.option_strings)
        if not spellings or action.help == argparse.SUPPRESS:  # the script and its arguments; hidden options
            continue
        longs = [s for s in spellings if s.startswith("--")]
        flags[longs[0] if longs else spellings[0]] = spellings
    return flags


@pytest.fixture(scope="module")
def flags() -> Dict[str, List[str]]:
    found = torchrun_flags()
    assert {"--nnodes", "--nproc-per-node", "--rdzv-backend", "--max-restarts"} <= set(found)  # in every torch raydist supports
    return found


def raydist_spellings() -> Set[str]:
    return {option for action in cli.build_parser()[1]._actions for option in action.option_strings}


def test_every_torchrun_flag_is_honoured_or_refused(flags: Dict[str, List[str]]) -> None:
    missing = sorted(set(flags) - set(cli.TORCHRUN_FLAGS) - {"--help"})
    assert not missing, f"torchrun flags neither honoured nor refused: {missing}"
    for flag, (kind, why) in cli.TORCHRUN_FLAGS.items():
        assert kind in (cli.HONOURED, cli.REFUSED) and why and "\n" not in why, flag


def test_honoured_flags_take_every_torchrun_spelling(flags: Dict[str, List[str]]) -> None:
    ours = raydist_spellings()
    for flag, spellings in flags.items():
        kind, why = cli.TORCHRUN_FLAGS.get(flag, (None, ""))
        if kind != cli.HONOURED:
            continue
        named = re.match(r"RunConfig\.(\w+)", why)
        if named:
            assert named.group(1) in OPTIONS | ADDED_ELSEWHERE, f"{flag}: no RunConfig option {named.group(1)}"
            if named.group(1) not in OPTIONS:
                continue  # comes with issue 20's fields
        assert set(spellings) <= ours, f"{flag}: raydist run lacks {sorted(set(spellings) - ours)}"


def test_refused_flags_exit_2_with_their_reason(flags: Dict[str, List[str]], capsys: pytest.CaptureFixture) -> None:
    for flag, spellings in flags.items():
        kind, why = cli.TORCHRUN_FLAGS.get(flag, (None, ""))
        if kind != cli.REFUSED:
            continue
        for spelling in spellings:
            with pytest.raises(SystemExit) as stopped:
                cli.main(["run", spelling, "x", "train.py"])
            assert stopped.value.code == 2, spelling
            assert f"torchrun's {flag} is refused: {why}" in capsys.readouterr().err, spelling


def test_print_completion_writes_a_script_for_every_flag(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("shtab", reason="shtab comes with the test extra")
    for spelling in ("--print-completion", "--print_completion"):
        with pytest.raises(SystemExit) as stopped:
            cli.main(["run", spelling, "bash"])  # no script needed, as with --help
        assert stopped.value.code == 0
        script = capsys.readouterr().out
        assert "raydist" in script and "--log-line-prefix-template" in script and "--nproc-per-node" in script
    monkeypatch.setitem(sys.modules, "shtab", None)  # not installed
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", "--print-completion", "zsh"])
    assert stopped.value.code == 1 and "pip install shtab" in capsys.readouterr().err
