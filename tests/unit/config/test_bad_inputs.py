"""Every option refuses a bad value when the configuration is built, with the
option's name, before Ray is imported (this tier makes Ray unimportable, so
reaching Ray here would fail with ImportError instead of the expected error).

A new RunConfig field or `raydist run` flag without a row here fails
``test_every_field_has_a_row`` / ``test_every_flag_has_a_row``."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Dict, FrozenSet, List, Tuple, Type

import pytest

from raydist import cli
from raydist.config import RunConfig

# field -> [(keywords, exception type, words the message must contain)]
Row = Tuple[Dict[str, Any], Type[Exception], str]
FIELD_ROWS: Dict[str, List[Row]] = {
    "num_workers": [({"num_workers": 0}, ValueError, "num_workers"), ({"num_workers": (3, 1)}, ValueError, "num_workers")],
    "num_nodes": [({"num_nodes": 2}, ValueError, "workers_per_node")],
    "workers_per_node": [({"workers_per_node": 2}, ValueError, "workers_per_node needs num_nodes")],
    "accelerator": [({"accelerator": "tpu9"}, ValueError, "accelerator")],
    "resources_per_worker": [({"resources_per_worker": {"gpu": 1}}, ValueError, "resources_per_worker")],
    "backend": [
        ({"backend": "nonsense"}, ValueError, "backend 'nonsense'"),
        ({"backend": "mpi"}, ValueError, "backend 'mpi'"),  # this torch is built without MPI
        ({"backend": "nccl", "accelerator": "cpu"}, ValueError, "backend 'nccl'"),
        ({"backend": "cpu:gloo,cuda:bogus"}, ValueError, "backend 'cpu:gloo,cuda:bogus'"),
        ({"backend": ""}, TypeError, "backend"),
    ],
    "env": [
        ({"env": {"X": "a\0b"}}, ValueError, "env['X']"),
        ({"env": {"A=B": "x"}}, ValueError, "env key"),
        ({"env": {"RANK": "1"}}, ValueError, "env['RANK']"),
        ({"env": {"X": 1}}, TypeError, "env['X']"),
    ],
    "placement_strategy": [({"placement_strategy": "CLUSTER"}, ValueError, "placement_strategy")],
    "timeout": [({"timeout": -1}, ValueError, "timeout")],
    "hang_timeout": [
        ({"hang_timeout": 0}, ValueError, "hang_timeout"),
        ({"hang_timeout": 5, "flight_recorder": False}, ValueError, "hang_timeout needs torch's flight recorder"),
    ],
    "straggler_action": [
        ({"straggler_action": "evict"}, ValueError, "straggler_action"),
        ({"straggler_action": "replace"}, ValueError, "straggler_action='replace' puts a spare in a straggler's place"),
        (
            {"straggler_action": "replace", "spare_workers": 1, "flight_recorder": False},
            ValueError,
            "straggler_action='replace' needs torch's flight recorder",
        ),
    ],
    "straggler_threshold": [({"straggler_threshold": 0}, ValueError, "straggler_threshold")],
    "straggler_windows": [({"straggler_windows": 0}, ValueError, "straggler_windows")],
    "health_check": [({"health_check": "always"}, ValueError, "health_check")],
    "health_threshold": [
        ({"health_threshold": 1.5}, ValueError, "health_threshold"),
        ({"health_threshold": "1/2"}, TypeError, "health_threshold"),
    ],
    "startup_timeout": [({"startup_timeout": "5"}, TypeError, "startup_timeout")],
    "max_restarts": [({"max_restarts": -1}, ValueError, "max_restarts")],
    "retry_on_exception": [({"retry_on_exception": "yes"}, TypeError, "retry_on_exception")],
    "address": [({"address": "http://head:8265"}, ValueError, "ray job submit --address http://head:8265")],
    "init_process_group": [({"init_process_group": "no"}, TypeError, "init_process_group")],
    "object_store_threshold": [({"object_store_threshold": -1}, ValueError, "object_store_threshold")],
    "pg_timeout": [({"pg_timeout": 0}, ValueError, "pg_timeout")],
    "log_dir": [({"log_dir": __file__}, ValueError, "log_dir")],  # an existing file
    "timeline": [
        ({"timeline": "/"}, ValueError, "is a directory"),
        ({"timeline": "/no/such/dir/t.json"}, ValueError, "does not exist"),
        ({"timeline": 3}, TypeError, "file path"),
    ],
    "redirects": [({"redirects": "0:1,0:2"}, ValueError, "redirects '0:1,0:2' gives local rank 0 more than once")],
    "tee": [({"tee": "0:1,0:2"}, ValueError, "tee '0:1,0:2' gives local rank 0 more than once"), ({"tee": 4}, ValueError, "tee")],
    "local_ranks_filter": [({"local_ranks_filter": "0,0"}, ValueError, "local_ranks_filter names local rank 0 more than once")],
    "log_line_prefix_template": [({"log_line_prefix_template": ["[", "]"]}, TypeError, "log_line_prefix_template must be a text")],
    "restart_to_grow": [
        ({"restart_to_grow": True}, ValueError, "restart_to_grow needs an elastic size"),
        ({"restart_to_grow": "yes"}, TypeError, "restart_to_grow"),
    ],
    "preemption_signal": [
        ({"preemption_signal": "SIGKILL"}, ValueError, "preemption_signal SIGKILL cannot be caught"),
        ({"preemption_signal": "SIGSTOP"}, ValueError, "preemption_signal SIGSTOP"),
        ({"preemption_signal": "SIGNOPE"}, ValueError, "preemption_signal"),
    ],
    "label_selector": [({"label_selector": {"bad key!": "a"}}, ValueError, "label_selector key")],
    "accelerator_type": [({"accelerator_type": "H 100"}, ValueError, "accelerator_type")],
    "exclude_nodes": [({"exclude_nodes": 5}, TypeError, "exclude_nodes")],
    "numa_binding": [({"numa_binding": "bogus"}, ValueError, "numa_binding")],
    "virtual_local_rank": [({"virtual_local_rank": 1}, TypeError, "virtual_local_rank")],
    "role": [({"role": ""}, TypeError, "role")],
    "monitor_interval": [({"monitor_interval": 0}, ValueError, "monitor_interval")],
    "flight_recorder": [({"flight_recorder": "on"}, TypeError, "flight_recorder")],
    "post_mortem": [({"post_mortem": None}, TypeError, "post_mortem")],
    "signals_to_handle": [({"signals_to_handle": "SIGTERM,SIGKILL"}, ValueError, "signals_to_handle: SIGKILL")],
    "shutdown_timeout": [({"shutdown_timeout": math.inf}, ValueError, "shutdown_timeout")],
    "restart_mode": [({"restart_mode": "lukewarm"}, ValueError, "restart_mode")],
    "spare_workers": [({"spare_workers": -1}, ValueError, "spare_workers")],
    "run_ahead": [
        ({"run_ahead": True, "restart_mode": "fresh"}, ValueError, "run_ahead readies the processes of a warm restart"),
        ({"run_ahead": 1}, TypeError, "run_ahead"),
    ],
    "survivor_timeout": [({"survivor_timeout": 0}, ValueError, "survivor_timeout")],
    "state_dir": [
        ({"state_dir": 3}, TypeError, "state_dir"),
        ({"state_dir": __file__}, ValueError, "not a directory"),
        ({"state_dir": "nosuch://bucket/run"}, ValueError, "state_dir 'nosuch://bucket/run': unknown scheme nosuch://"),
        ({"state_dir": "file://relative/dir"}, ValueError, "file:///dir"),
        ({"state_dir": "s3://"}, ValueError, "names no bucket"),
    ],
    "state_keep": [({"state_keep": 0}, ValueError, "state_keep")],
    "state_overhead": [
        ({"state_overhead": 0}, ValueError, "state_overhead must be between 0 and 1"),
        ({"state_overhead": 1.5}, ValueError, "state_overhead must be between 0 and 1"),
        ({"state_overhead": "5%"}, TypeError, "state_overhead must be a number"),
    ],
}
# Fields with no bad value at all; each needs a comment saying why. Empty: keep it so.
FIELDS_WITHOUT_BAD_VALUE: FrozenSet[str] = frozenset()

SCRIPT = __file__  # an existing script: a bad row must fail on its option, not on the target
# flag as the parser's first spelling -> [(argv before the script, words of the one-line message)]
FLAG_ROWS: Dict[str, List[Tuple[List[str], str]]] = {
    "-n": [(["-n", "0"], "--nproc-per-node must be >= 1"), (["-n", "many"], "-n")],
    "--nnodes": [(["--nnodes", "3:1", "-n", "1"], "--nnodes")],
    "-m": [(["-m"], "module")],  # the target read as a module that does not exist
    "--no-python": [(["--no-python", "-m"], "--no-python and -m/--module exclude each other")],
    "--standalone": [(["--standalone", "--address", "h:6379"], "--standalone starts a private Ray")],
    "--accelerator": [(["--accelerator", "tpu9"], "--accelerator")],
    "--resources-per-worker": [(["--resources-per-worker", "{"], "--resources-per-worker")],
    "--backend": [
        (["--backend", "nonsense"], "--backend 'nonsense'"),
        (["--backend", "mpi"], "--backend 'mpi'"),
        (["--accelerator", "cpu", "--backend", "nccl"], "--backend 'nccl'"),
    ],
    "--env": [(["--env", "NOEQUALS"], "--env"), (["--env", "RANK=1"], "--env['RANK']")],
    "--placement-strategy": [(["--placement-strategy", "CLUSTER"], "--placement-strategy")],
    "--timeout": [(["--timeout", "-1"], "--timeout")],
    "--hang-timeout": [
        (["--hang-timeout", "0"], "--hang-timeout"),
        (["--hang-timeout", "5", "--no-flight-recorder"], "--hang-timeout needs torch's flight recorder"),
    ],
    "--straggler-action": [
        (["--straggler-action", "evict"], "--straggler-action"),
        (["--straggler-action", "replace"], "--straggler-action replace puts a spare in a straggler's place"),
    ],
    "--straggler-threshold": [(["--straggler-threshold", "0"], "--straggler-threshold")],
    "--straggler-windows": [(["--straggler-windows", "0"], "--straggler-windows")],
    "--health-check": [(["--health-check", "always"], "--health-check")],
    "--health-threshold": [(["--health-threshold", "0"], "--health-threshold"), (["--health-threshold", "half"], "--health-threshold")],
    "--startup-timeout": [(["--startup-timeout", "soon"], "--startup-timeout")],
    "--max-restarts": [(["--max-restarts", "-1"], "--max-restarts")],
    "--address": [(["--address", "http://head:8265"], "ray job submit --address http://head:8265 -- raydist run")],
    "--pg-timeout": [(["--pg-timeout", "0"], "--pg-timeout")],
    "--log-dir": [(["--log-dir", SCRIPT], "--log-dir")],
    "-r": [(["-r", "0:1,0:2"], "--redirects '0:1,0:2' gives local rank 0 more than once")],
    "-t": [(["-t", "0:1,0:2"], "--tee '0:1,0:2' gives local rank 0 more than once")],
    "--local-ranks-filter": [(["--local-ranks-filter", "0,0"], "--local-ranks-filter names local rank 0 more than once")],
    "--restart-to-grow": [(["--restart-to-grow", "-n", "2"], "--restart-to-grow needs an elastic size: --nnodes MIN:MAX")],
    "--preemption-signal": [
        (["--preemption-signal", "SIGKILL"], "--preemption-signal SIGKILL cannot be caught"),
        (["--preemption-signal", "SIGNOPE"], "--preemption-signal"),
    ],
    "--label-selector": [(["--label-selector", "zone"], "--label-selector")],
    "--accelerator-type": [(["--accelerator-type", "H100", "--accelerator", "cpu"], "--accelerator-type")],
    "--exclude-nodes": [(["--exclude-nodes", "not a node"], "--exclude-nodes")],
    "--numa-binding": [(["--numa-binding", "bogus"], "--numa-binding")],
    "--role": [(["--role", " "], "--role")],
    "--monitor-interval": [(["--monitor-interval", "0"], "--monitor-interval")],
    "--signals-to-handle": [(["--signals-to-handle", "SIGSTOP"], "--signals-to-handle: SIGSTOP")],
    "--shutdown-timeout": [(["--shutdown-timeout", "nan"], "--shutdown-timeout")],
    "--restart-mode": [(["--restart-mode", "lukewarm"], "--restart-mode")],
    "--spare-workers": [(["--spare-workers", "1", "--restart-mode", "fresh"], "--spare-workers")],
    "--run-ahead": [(["--run-ahead"], "--run-ahead readies the processes of a warm restart: it needs --restart-mode warm")],
    "--survivor-timeout": [(["--survivor-timeout", "0"], "--survivor-timeout")],
    "--state-dir": [(["--state-dir", __file__], "not a directory"), (["--state-dir", "nosuch://b/x"], "unknown scheme")],
    "--state-keep": [(["--state-keep", "0"], "--state-keep")],
    "--state-overhead": [(["--state-overhead", "5%"], "a number between 0 and 1"), (["--state-overhead", "2"], "between 0 and 1")],
    "--timeline": [(["--timeline", "/no/such/dir/t.json"], "does not exist")],
    "--print-completion": [(["--print-completion", "fish"], "--print-completion")],
}
# Flags that take no value (or any text, as a prefix template) and combine with every other: nothing to get wrong.
FLAGS_WITHOUT_BAD_VALUE: FrozenSet[str] = frozenset(
    {"-h", "--run-path", "--virtual-local-rank", "--no-flight-recorder", "--post-mortem", "--log-line-prefix-template"}
)


def test_every_field_has_a_row() -> None:
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert fields >= FIELDS_WITHOUT_BAD_VALUE
    assert set(FIELD_ROWS) == fields - FIELDS_WITHOUT_BAD_VALUE


@pytest.mark.parametrize(
    "options, error, words",
    [row for rows in FIELD_ROWS.values() for row in rows],
    ids=[f"{name}-{i}" for name, rows in FIELD_ROWS.items() for i in range(len(rows))],
)
def test_bad_field_value_is_refused(options: Dict[str, Any], error: Type[Exception], words: str) -> None:
    with pytest.raises(error) as raised:
        RunConfig(**options)
    assert words in str(raised.value)
    assert "ray" not in sys.modules


def _run_flags() -> Dict[str, Tuple[str, ...]]:
    """Every option of `raydist run` (first spelling -> all), refused torchrun flags too."""
    run_parser = cli.build_parser()[1]
    return {action.option_strings[0]: tuple(action.option_strings) for action in run_parser._actions if action.option_strings}


def test_every_flag_has_a_row() -> None:
    flags = _run_flags()
    refused = {flag for flag in flags if flag in cli.TORCHRUN_FLAGS and cli.TORCHRUN_FLAGS[flag][0] == cli.REFUSED}
    assert set(flags) >= FLAGS_WITHOUT_BAD_VALUE
    assert set(FLAG_ROWS) == set(flags) - FLAGS_WITHOUT_BAD_VALUE - refused


def _exit_and_message(argv: List[str], capsys: pytest.CaptureFixture[str]) -> Tuple[Any, str]:
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", *argv, SCRIPT])
    lines = capsys.readouterr().err.strip().splitlines()
    return exited.value.code, lines[-1]


@pytest.mark.parametrize(
    "argv, words",
    [row for rows in FLAG_ROWS.values() for row in rows],
    ids=[f"{flag}-{i}" for flag, rows in FLAG_ROWS.items() for i in range(len(rows))],
)
def test_bad_flag_exits_2_before_ray(argv: List[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, message = _exit_and_message(argv, capsys)
    assert code == 2 and message.startswith("raydist run: error: ") and words in message, message
    assert "----" not in message and "ray" not in sys.modules


@pytest.mark.parametrize("flag", sorted(f for f, (kind, _) in cli.TORCHRUN_FLAGS.items() if kind == cli.REFUSED))
def test_refused_torchrun_flag_exits_2(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, message = _exit_and_message([flag, "x"], capsys)
    assert code == 2 and flag in message, message
