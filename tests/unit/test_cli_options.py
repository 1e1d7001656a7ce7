"""`raydist run`'s options are generated from RunConfig's fields: the same
flags, spellings, defaults and values as the hand-written parser had, and a
new field with a CliFlag is a new flag. No Ray (the CLI imports it only to run)."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

import pytest

from raydist import cli
from raydist.config import CLI, RunConfig, cli_options, option_default
from raydist.config import cli as cli_flag
from raydist.core.accelerators import ACCELERATOR_CHOICES

# The hand-written parser's every option (before the table): spellings ->
# (dest, metavar, argparse action, choices). Defaults are None ("not given")
# except for the CLI-only flags.
OLD_FLAGS: Dict[Tuple[str, ...], Tuple[str, Optional[str], str, Optional[Tuple[str, ...]]]] = {
    ("-h", "--help"): ("help", None, "_HelpAction", None),
    ("-n", "--nproc-per-node", "--nproc_per_node", "--num-workers"): ("nproc_per_node", "N", "_StoreAction", None),
    ("--nnodes",): ("nnodes", "N|MIN:MAX", "_StoreAction", None),
    ("-m", "--module"): ("module", None, "_StoreTrueAction", None),
    ("--accelerator",): ("accelerator", None, "_StoreAction", ACCELERATOR_CHOICES),
    ("--resources-per-worker",): ("resources_per_worker", "JSON", "_StoreAction", None),
    ("--backend",): ("backend", "NAME", "_StoreAction", None),
    ("--max-restarts", "--max_restarts"): ("max_restarts", "K", "_StoreAction", None),
    ("--address",): ("address", "ADDRESS", "_StoreAction", None),
    ("--standalone",): ("standalone", None, "_StoreTrueAction", None),
    ("--env",): ("env", "KEY=VALUE", "_AppendAction", None),
    ("--placement-strategy", "--placement_strategy"): (
        "placement_strategy", "STRATEGY", "_StoreAction", ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"),
    ),
    ("--timeout",): ("timeout", "SECONDS", "_StoreAction", None),
    ("--startup-timeout",): ("startup_timeout", "SECONDS", "_StoreAction", None),
    ("--restart-to-grow",): ("restart_to_grow", None, "_StoreTrueAction", None),
    ("--preemption-signal",): ("preemption_signal", "SIGNAL", "_StoreAction", None),
    ("--pg-timeout",): ("pg_timeout", "SECONDS", "_StoreAction", None),
    ("--log-dir", "--log_dir"): ("log_dir", "DIR", "_StoreAction", None),
    ("-r", "--redirects"): ("redirects", "CODES", "_StoreAction", None),
    ("-t", "--tee"): ("tee", "CODES", "_StoreAction", None),
    ("--local-ranks-filter", "--local_ranks_filter"): ("local_ranks_filter", "RANKS", "_StoreAction", None),
    # Added with torchrun's layout, node selection and binding.
    ("--no-python", "--no_python"): ("no_python", None, "_StoreTrueAction", None),
    ("--run-path", "--run_path"): ("run_path", None, "_StoreTrueAction", None),
    ("--label-selector", "--label_selector"): ("label_selector", "KEY=VALUE[,...]", "_StoreAction", None),
    ("--accelerator-type", "--accelerator_type"): ("accelerator_type", "TYPE", "_StoreAction", None),
    ("--exclude-nodes", "--exclude_nodes"): ("exclude_nodes", "NODE[,NODE...]", "_StoreAction", None),
    ("--numa-binding", "--numa_binding"): ("numa_binding", "MODE", "_StoreAction", ("node", "socket", "exclusive", "core-complex")),
    ("--virtual-local-rank", "--virtual_local_rank"): ("virtual_local_rank", None, "_StoreTrueAction", None),
    ("--role",): ("role", "ROLE", "_StoreAction", None),
    ("--monitor-interval", "--monitor_interval"): ("monitor_interval", "SECONDS", "_StoreAction", None),
    **{
        (flag, "--" + flag[2:].replace("-", "_")): (argparse.SUPPRESS, "VALUE", "_Refused", None)
        for flag in (
            "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--start-method", "--event-log-handler",
            "--duplicate-stdout-filters", "--duplicate-stderr-filters", "--node-rank", "--master-addr",
            "--master-port", "--local-addr", "--logs-specs",
        )
    },
    # Added with the flight recorder and pdb on any rank.
    ("--no-flight-recorder",): ("flight_recorder", None, "_StoreTrueAction", None),
    ("--post-mortem",): ("post_mortem", None, "_StoreTrueAction", None),
    # torchrun's, added since the table.
    ("--signals-to-handle", "--signals_to_handle"): ("signals_to_handle", "SIGNALS", "_StoreAction", None),
    ("--shutdown-timeout", "--shutdown_timeout"): ("shutdown_timeout", "SECONDS", "_StoreAction", None),
    # Added with warm restarts.
    ("--restart-mode",): ("restart_mode", "MODE", "_StoreAction", ("warm", "fresh")),
    ("--spare-workers",): ("spare_workers", "K", "_StoreAction", None),
    ("--survivor-timeout",): ("survivor_timeout", "SECONDS", "_StoreAction", None),
    # Added with training state.
    ("--state-dir",): ("state_dir", "DIR", "_StoreAction", None),
    ("--state-keep",): ("state_keep", "N", "_StoreAction", None),
}
CLI_ONLY_DEFAULTS = {
    "help": argparse.SUPPRESS, "nproc_per_node": (1, None), "nnodes": None, "module": False, "standalone": False,
    "no_python": False, "run_path": False,
}
# The old FLAG_OF_OPTION: the flag that names each option in messages.
OLD_FLAG_OF_OPTION = {
    "num_workers": "--nproc-per-node", "accelerator": "--accelerator", "resources_per_worker": "--resources-per-worker",
    "backend": "--backend", "env": "--env", "placement_strategy": "--placement-strategy", "timeout": "--timeout",
    "startup_timeout": "--startup-timeout", "max_restarts": "--max-restarts", "address": "--address",
    "pg_timeout": "--pg-timeout", "restart_to_grow": "--restart-to-grow", "preemption_signal": "--preemption-signal",
    "log_dir": "--log-dir", "redirects": "--redirects", "tee": "--tee", "local_ranks_filter": "--local-ranks-filter",
    "num_nodes": "--nnodes", "workers_per_node": "--nproc-per-node", "label_selector": "--label-selector",
    "accelerator_type": "--accelerator-type", "exclude_nodes": "--exclude-nodes", "numa_binding": "--numa-binding",
    "virtual_local_rank": "--virtual-local-rank", "role": "--role", "monitor_interval": "--monitor-interval",
    "flight_recorder": "--no-flight-recorder", "post_mortem": "--post-mortem",
    "signals_to_handle": "--signals-to-handle", "shutdown_timeout": "--shutdown-timeout",
    "restart_mode": "--restart-mode", "spare_workers": "--spare-workers", "survivor_timeout": "--survivor-timeout",
    "state_dir": "--state-dir", "state_keep": "--state-keep",
}


def run_parser() -> argparse.ArgumentParser:
    return cli.build_parser()[1]


def test_generated_options_are_the_old_flags() -> None:
    actions = {tuple(action.option_strings): action for action in run_parser()._actions if action.option_strings}
    assert set(actions) == set(OLD_FLAGS)
    for flags, (dest, metavar, kind, choices) in OLD_FLAGS.items():
        action = actions[flags]
        assert (action.dest, action.metavar, type(action).__name__) == (dest, metavar, kind), flags
        assert (tuple(action.choices) if action.choices else None) == choices, flags
        assert action.default == CLI_ONLY_DEFAULTS.get(dest), flags
        assert action.help, flags
    positionals = [(a.dest, a.metavar, a.nargs) for a in run_parser()._actions if not a.option_strings]
    assert positionals == [("target", "script", None), ("script_args", "args", "*")]


def test_message_names_are_the_old_ones() -> None:
    assert {option.name: flag.flag for option, flag in cli_options()} == OLD_FLAG_OF_OPTION
    assert cli._as_flags("env['RANK']: no; restart_to_grow needs; pg_timeout and timeout") == (
        "--env['RANK']: no; --restart-to-grow needs; --pg-timeout and --timeout"
    )


def test_only_policy_options_have_no_flag() -> None:
    # Set by `raydist run` itself, as torchrun behaves (or not useful from a shell).
    assert {f.name for f in dataclasses.fields(RunConfig) if CLI not in f.metadata} == {
        "retry_on_exception", "init_process_group", "object_store_threshold",
    }


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
            {"label_selector": {"zone": "in(a,b)", "pool": "!spot"}, "accelerator_type": "H100",
             "exclude_nodes": ("10.0.0.5", "7da0617f45cb")},
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
        (["--log_dir", "logs", "-r", "3", "-t", "0:1,1:2", "--local_ranks_filter", "1,0"], {
            "log_dir": "logs", "redirects": 3, "tee": {0: 1, 1: 2}, "local_ranks_filter": (0, 1),
        }),
        (["--address", "h:6379"], {"address": "h:6379"}),
        (
            ["--restart-mode", "WARM", "--spare-workers", "2", "--survivor-timeout", "3"],
            {"restart_mode": "warm", "spare_workers": 2, "survivor_timeout": 3.0},
        ),
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
        (["--nnodes", "2", "--placement-strategy", "PACK"], "applies only without --nnodes"),
        (["--label-selector", "zone"], "not KEY=VALUE"),
        (["--label-selector", "zone=in(a,"], "Ray's forms"),
        (["--exclude-nodes", "abc"], "--exclude-nodes entry 'abc'"),
        (["--accelerator-type", "H100", "--accelerator", "cpu"], "--accelerator-type names a device type"),
        (["--monitor-interval", "0"], "--monitor-interval must be a positive"),
        (["--spare-workers", "1"], "--spare-workers take dead ranks' places in warm restarts: they need --restart-mode='warm'"),
        (["--survivor-timeout", "0"], "--survivor-timeout must be a positive"),
    ],
)
def test_rejected_values_are_named_as_flags(argv: List[str], message: str) -> None:
    with pytest.raises(cli.CliError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        config_of(argv)


def test_a_new_field_is_a_new_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass(frozen=True)
    class Extended:
        retries_per_rank: int = dataclasses.field(
            default=2,
            metadata=cli_flag("--retries-per-rank", "--retries_per_rank", help="retries (default {default})", metavar="K"),
        )

    extra = tuple((f, f.metadata[CLI]) for f in dataclasses.fields(Extended))
    monkeypatch.setattr(cli, "cli_options", lambda: cli_options() + extra)
    parser = run_parser()
    action = next(a for a in parser._actions if "--retries_per_rank" in a.option_strings)
    assert (action.dest, action.help, action.default) == ("retries_per_rank", "retries (default 2)", None)
    assert parser.parse_args(["--retries-per-rank", "5", "x.py"]).retries_per_rank == "5"
    assert cli._as_flags("retries_per_rank must be") == "--retries-per-rank must be"
    assert option_default(extra[0][0]) == 2


def test_parsing_imports_neither_ray_nor_torch() -> None:
    code = (
        "import sys, raydist.cli as c; p = c.build_parser()[1]; "
        "c.build_config(p.parse_args(['-n', '2', '--backend', 'gloo', 'x.py'])); "
        "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_recorder_and_post_mortem_flags() -> None:
    parser = cli.build_parser()[0]
    plain = cli.build_config(parser.parse_args(["run", "x.py"]))
    assert plain.flight_recorder and not plain.post_mortem
    flagged = cli.build_config(parser.parse_args(["run", "--no-flight-recorder", "--post-mortem", "x.py"]))
    assert not flagged.flight_recorder and flagged.post_mortem
