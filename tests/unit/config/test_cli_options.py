"""`raydist run`'s options are generated from the options' records (the flags
table, ``raydist.config.cli_options``): each flag with its spellings, metavar,
choices, action and help as its record says, defaults left to RunConfig, and a
new record with a flag is a new flag. No Ray (the CLI imports it only to run)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from typing import Any, Dict, List

import pytest

from raydist import cli
from raydist.cli import args as cli_args
from raydist.config import Option, RunConfig, cli_options, option_default
from raydist.config.flags import flag as cli_flag
from raydist.config.option import option_of

# The flags that set no single option (torchrun's -n, --nnodes, ...), with their defaults.
CLI_ONLY_DEFAULTS = {
    "help": argparse.SUPPRESS,
    "nproc_per_node": (1, None),
    "nnodes": None,
    "module": False,
    "standalone": False,
    "no_python": False,
    "run_path": False,
    "print_completion": None,
}
ACTION_OF = {None: "_StoreAction", "store_true": "_StoreTrueAction", "append": "_AppendAction"}


def run_parser() -> argparse.ArgumentParser:
    return cli.build_parser()[1]


def parser_actions() -> Dict[tuple, argparse.Action]:
    return {tuple(action.option_strings): action for action in run_parser()._actions if action.option_strings}


def test_every_flag_is_generated_from_its_record() -> None:
    actions = parser_actions()
    generated = [(option, flag) for option, flag in cli_options() if flag.generated]
    for option, flag in generated:
        action = actions.pop(flag.flags)
        assert (action.dest, action.metavar, type(action).__name__) == (option.name, flag.metavar, ACTION_OF[flag.action])
        assert (tuple(action.choices) if action.choices else None) == flag.choices, flag.flags
        assert action.default is None, flag.flags  # "not given": RunConfig keeps its own default
        assert action.help == flag.help_for(option_default(option)) and action.help, flag.flags
    refused = {spellings for spellings, action in actions.items() if type(action).__name__ == "_Refused"}
    assert {flags[0] for flags in refused} == {f for f, (kind, _) in cli.TORCHRUN_FLAGS.items() if kind == cli.REFUSED}
    cli_only = {action.dest: action.default for flags, action in actions.items() if flags not in refused}
    assert cli_only == CLI_ONLY_DEFAULTS
    positionals = [(a.dest, a.metavar, a.nargs) for a in run_parser()._actions if not a.option_strings]
    assert positionals == [("target", "script", None), ("script_args", "args", "*")]


def test_messages_name_each_option_by_a_flag_the_parser_has() -> None:
    spellings = {spelling for flags in parser_actions() for spelling in flags}
    for option, flag in cli_options():
        assert flag.flag.startswith("--") and flag.flag in spellings, option.name
    assert {option.name: flag.flag for option, flag in cli_options() if not flag.generated} == {
        "num_workers": "--nproc-per-node",
        "num_nodes": "--nnodes",
        "workers_per_node": "--nproc-per-node",
    }
    assert cli.as_flags("env['RANK']: no; restart_to_grow needs; pg_timeout and timeout; flight_recorder") == (
        "--env['RANK']: no; --restart-to-grow needs; --pg-timeout and --timeout; --no-flight-recorder"
    )


def test_only_policy_options_have_no_flag() -> None:
    # Set by `raydist run` itself, as torchrun behaves (or not useful from a shell).
    assert {f.name for f in dataclasses.fields(RunConfig) if option_of(f).flag is None} == {
        "retry_on_exception",
        "init_process_group",
        "object_store_threshold",
    }


def test_every_option_has_a_record_with_a_meaning() -> None:
    for field in dataclasses.fields(RunConfig):
        option = option_of(field)
        assert option.doc and f"{field.name}: " in (RunConfig.__doc__ or ""), field.name
        assert option_default(field) == option.default, field.name


def config_of(argv: List[str]) -> RunConfig:
    options = run_parser().parse_args([*argv, "train.py"])
    return cli.build_config(options)


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], {}),
        (["-n", "4"], {"num_workers": 4}),
        (["-n", "2", "--nnodes", "3"], {"num_workers": None, "num_nodes": 3, "workers_per_node": 2}),
        (
            ["-n", "2", "--nnodes", "1:3", "--restart-to-grow"],
            {"num_workers": None, "num_nodes": (1, 3), "workers_per_node": 2, "restart_to_grow": True},
        ),
        (["--nnodes", "2"], {"num_workers": None, "num_nodes": 2, "workers_per_node": 1}),
        (
            ["--label-selector", "zone=in(a,b),pool=!spot", "--accelerator-type", "H100", "--exclude-nodes", "10.0.0.5,7da0617f45cb"],
            {
                "label_selector": {"zone": "in(a,b)", "pool": "!spot"},
                "accelerator_type": "H100",
                "exclude_nodes": ("10.0.0.5", "7da0617f45cb"),
            },
        ),
        (
            ["--numa-binding", "core-complex", "--virtual-local-rank", "--role", "trainer", "--monitor-interval", "0.5"],
            {"numa_binding": "core-complex", "virtual_local_rank": True, "role": "trainer", "monitor_interval": 0.5},
        ),
        (["-n", "gpu"], {"num_workers": None, "accelerator": "gpu"}),
        (["-n", "auto", "--accelerator", "NPU"], {"num_workers": None, "accelerator": "npu"}),
        (["--env", "A=1", "--env=B=x=y"], {"env": {"A": "1", "B": "x=y"}}),
        (["--resources-per-worker", '{"CPU": 2}'], {"resources_per_worker": {"CPU": 2.0}}),
        (["--backend", "gloo", "--pg-timeout", "5"], {"backend": "gloo", "init_process_group": True, "pg_timeout": 5.0}),
        (["--placement_strategy", "strict_spread"], {"placement_strategy": "STRICT_SPREAD"}),
        (
            ["--timeout", "2.5", "--startup-timeout", "9", "--max_restarts", "3"],
            {"timeout": 2.5, "startup_timeout": 9.0, "max_restarts": 3},
        ),
        (["--preemption-signal", "none"], {"preemption_signal": None}),
        (["--preemption-signal", "sigusr1"], {"preemption_signal": "SIGUSR1"}),
        (
            ["--log_dir", "logs", "-r", "3", "-t", "0:1,1:2", "--local_ranks_filter", "1,0"],
            {
                "log_dir": "logs",
                "redirects": 3,
                "tee": {0: 1, 1: 2},
                "local_ranks_filter": (0, 1),
            },
        ),
        (["--address", "h:6379"], {"address": "h:6379"}),
        (
            ["--restart-mode", "WARM", "--spare-workers", "2", "--survivor-timeout", "3"],
            {"restart_mode": "warm", "spare_workers": 2, "survivor_timeout": 3.0},
        ),
        (["--state-dir", "ckpt", "--state-keep", "3"], {"state_dir": "ckpt", "state_keep": 3}),
        (["--state-overhead", "0.2"], {"state_overhead": 0.2}),
        (["--state-overhead", "None"], {"state_overhead": None}),
    ],
)
def test_flags_build_the_config(argv: List[str], expected: Dict[str, Any]) -> None:
    # raydist run restarts in fresh processes, as torchrun does, unless --restart-mode warm.
    defaults = {"num_workers": 1, "init_process_group": False, "retry_on_exception": True, "restart_mode": "fresh"}
    assert config_of(argv) == RunConfig(**{**defaults, **expected})


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--timeout", "-1"], "--timeout must be a positive"),
        (["--max-restarts", "-1"], "--max-restarts must be >= 0"),
        (["--env", "RANK=0"], "--env['RANK']"),
        (["-r", "4"], "--redirects '4' is neither a stream code"),
        (["-n", "gpu", "--accelerator", "cpu"], "contradicts"),
        (["--nnodes", "2", "-n", "auto"], "give a number"),
        (["-n", "0"], "--nproc-per-node must be >= 1"),
        (["--nnodes", "2", "--placement-strategy", "PACK"], "--placement-strategy PACK does not apply with --nnodes"),
        (["--nnodes", "2", "-n", "0"], "--nproc-per-node must be >= 1, got 0"),
        (["--nnodes", "0"], "--nnodes min must be >= 1"),
        (["--nnodes", "3:2"], "--nnodes MIN:MAX needs MIN <= MAX, got (3, 2)"),
        (["--label-selector", "zone"], "not KEY=VALUE"),
        (["--label-selector", "zone=in(a,"], "Ray's forms"),
        (["--exclude-nodes", "abc"], "--exclude-nodes entry 'abc'"),
        (["--accelerator-type", "H100", "--accelerator", "cpu"], "--accelerator-type names a device type"),
        (["--monitor-interval", "0"], "--monitor-interval must be a positive"),
        (["--spare-workers", "1"], "--spare-workers take dead ranks' places in warm restarts: they need --restart-mode warm"),
        (["--survivor-timeout", "0"], "--survivor-timeout must be a positive"),
        (["--state-dir", __file__], "exists and is not a directory"),
        (["--state-keep", "0"], "--state-keep must be >= 1"),
    ],
)
def test_rejected_values_are_named_as_flags(argv: List[str], message: str) -> None:
    with pytest.raises(cli.CliError, match=re.escape(message)):
        config_of(argv)


def test_a_new_field_is_a_new_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    retries = Option(
        2,
        check=lambda name, value: value,
        doc="retries per rank",
        flag=cli_flag("--retries-per-rank", "--retries_per_rank", help="retries (default {default})", metavar="K"),
    )

    @dataclasses.dataclass(frozen=True)
    class Extended:
        retries_per_rank: int = retries.field()

    extra = tuple((f, option_of(f).flag) for f in dataclasses.fields(Extended))
    monkeypatch.setattr(cli_args, "cli_options", lambda: cli_options() + extra)
    monkeypatch.setattr(sys.modules["raydist.cli.plan"], "cli_options", lambda: cli_options() + extra)
    parser = run_parser()
    action = next(a for a in parser._actions if "--retries_per_rank" in a.option_strings)
    assert (action.dest, action.help, action.default) == ("retries_per_rank", "retries (default 2)", None)
    assert parser.parse_args(["--retries-per-rank", "5", "x.py"]).retries_per_rank == "5"
    assert cli.as_flags("retries_per_rank must be") == "--retries-per-rank must be"
    assert option_default(extra[0][0]) == 2


def test_recorder_and_post_mortem_flags() -> None:
    parser = cli.build_parser()[0]
    plain = cli.build_config(parser.parse_args(["run", "x.py"]))
    assert plain.flight_recorder and not plain.post_mortem
    flagged = cli.build_config(parser.parse_args(["run", "--no-flight-recorder", "--post-mortem", "x.py"]))
    assert not flagged.flight_recorder and flagged.post_mortem


def test_the_backend_library_is_checked_once_on_the_cli_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from raydist.core.backend import BackendEntry
    from raydist.pool.driver.hooks import group_hooks

    checked: List[str] = []
    monkeypatch.setattr(BackendEntry, "check_requires", lambda entry: checked.append(entry.name))
    plan = cli.plan_run(run_parser().parse_args(["--backend", "gloo", __file__]), [])
    assert checked == ["torch"]  # when the config is built, before Ray
    group_hooks(plan.config)  # what the worker group builds from it
    assert checked == ["torch"]
