"""What ``raydist run`` was asked to do, checked before Ray starts: the
target, and the run's ``RunConfig`` from the flags; ``CliError`` for what is wrong."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Dict, Sequence, Tuple

from raydist.config import CLI_RESTART_MODE, ELASTIC_SIZE, RunConfig, cli_options

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure to report in one line and exit with ``status``."""

    def __init__(self, message: str, status: int = EXIT_FAILURE):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RunPlan:
    """What ``raydist run`` was asked to do, checked before Ray starts."""

    target: str  # absolute script (or directory) path, or module name
    target_as_typed: str
    module: bool
    script_args: Tuple[str, ...]
    standalone: bool
    config: RunConfig
    executable: bool = False  # --no-python: the target is a program, not a Python script


def plan_run(options: argparse.Namespace, script_args: Sequence[str]) -> RunPlan:
    """Validate everything that can be checked without Ray; CliError(status 2) if wrong."""
    executable = options.no_python and not options.run_path  # torchrun: --run-path wins
    if executable and options.module:
        raise CliError("--no-python and -m/--module exclude each other (as under torchrun)", EXIT_USAGE)
    if options.module:
        _check_module(options.target)
        target = options.target
    elif executable:
        target = _check_executable(options.target)
    else:
        target = _check_script(options.target)
    if options.standalone and options.address:
        raise CliError("--standalone starts a private Ray; it cannot be combined with --address", EXIT_USAGE)
    config = build_config(options)
    if options.standalone:
        _check_standalone_bundle(config)
    return RunPlan(
        target=target,
        target_as_typed=options.target,
        module=options.module,
        script_args=tuple(script_args),
        standalone=options.standalone,
        config=config,
        executable=executable,
    )


def _check_standalone_bundle(config: RunConfig) -> None:
    """With --standalone the cluster is this machine, so "auto" is knowable
    here: refuse a worker with no resources before the private Ray starts."""
    resources = config.resources_per_worker
    if config.accelerator != "auto" or not resources or any(resources.values()):
        return  # a bundle with something in it, or RunConfig checked it already
    from raydist.core.accelerators import BY_DEVICE_TYPE
    from raydist.core.devices import accelerator_type
    from raydist.pool.rules.sizing import worker_bundle

    try:
        worker_bundle(BY_DEVICE_TYPE[accelerator_type()], resources)
    except ValueError as error:
        raise CliError(as_flags(str(error)), EXIT_USAGE) from None


def build_config(options: argparse.Namespace) -> RunConfig:
    """The run's RunConfig from the flags given (the rest keep RunConfig's defaults)."""
    given = {
        option.name: value if flag.to_option is None else flag.to_option(value)
        for option, flag in cli_options()
        if flag.generated and (value := getattr(options, option.name)) is not None
    }
    given.update(_from_cli_only_flags(options))
    given.setdefault("restart_mode", CLI_RESTART_MODE)  # torchrun's semantics unless asked
    try:
        return RunConfig(
            **given,
            init_process_group=options.backend is not None,
            retry_on_exception=True,  # torchrun restarts after any failure
        )
    except (TypeError, ValueError, ImportError) as error:  # ImportError: the backend's library is missing
        raise CliError(as_flags(str(error)), EXIT_USAGE) from None


def _from_cli_only_flags(options: argparse.Namespace) -> Dict[str, Any]:
    """The options that -n/--nproc-per-node and --nnodes decide, as torchrun reads them
    (their values are checked once, as the options' own: RunConfig's messages name these flags)."""
    per_node, kind = options.nproc_per_node
    accelerator = options.accelerator
    if kind is not None and kind != "auto":
        if accelerator not in (None, "auto", kind):
            raise CliError(f"--nproc-per-node {kind} contradicts --accelerator {accelerator}", EXIT_USAGE)
        accelerator = kind
    derived: Dict[str, Any] = {}
    if accelerator is not None:
        derived["accelerator"] = accelerator
    if options.nnodes is None:  # no layout promised: the workers go wherever they fit
        if per_node is not None:
            derived["num_workers"] = per_node
        return derived
    if per_node is None:
        raise CliError(f"--nproc-per-node {kind} counts the whole cluster; give a number with --nnodes", EXIT_USAGE)
    derived["num_nodes"] = options.nnodes  # (min, max); RunConfig makes (n, n) n
    derived["workers_per_node"] = per_node
    return derived


def as_flags(message: str) -> str:
    """A RunConfig message with option names spelled as this command's flags."""
    # The elastic size as typed here ("--nproc-per-node=(min, max)" is no flag form).
    message = message.replace(ELASTIC_SIZE, "--nnodes MIN:MAX")
    message = message.replace("num_nodes=(min, max) needs min <= max", "--nnodes MIN:MAX needs MIN <= MAX")
    flag_of = {option.name: flag.flag for option, flag in cli_options()}
    names = "|".join(flag_of)
    # A value given as Python spells it ("restart_mode='warm'") as typed here ("--restart-mode warm").
    message = re.sub(r"(?<!-)\b(" + names + r")=(['\"]?)([\w.:-]+)\2", lambda m: f"{flag_of[m.group(1)]} {m.group(3)}", message)
    # (?<!-): a name already spelled as a flag (a hint's "--address") stays as it is.
    return re.sub(r"(?<!-)\b(" + names + r")\b", lambda m: flag_of[m.group(1)], message)


def _check_script(path: str) -> str:
    """The script's absolute path; a directory runs its ``__main__.py``, as python does."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "__main__.py")):
            raise CliError(f"{path!r} is a directory with no __main__.py to run", EXIT_USAGE)
        return os.path.abspath(path)
    if not os.path.isfile(path):
        raise CliError(f"script {path!r} not found (no file at {os.path.join(os.getcwd(), path)})", EXIT_USAGE)
    return os.path.abspath(path)


def _check_executable(target: str) -> str:
    """--no-python's program: a file here (absolute path) or a command on PATH (found again on each worker)."""
    if os.path.isfile(target):
        if not os.access(target, os.X_OK):
            raise CliError(f"{target!r} is not executable (--no-python runs it as a program)", EXIT_USAGE)
        return os.path.abspath(target)
    if os.sep not in target and shutil.which(target):
        return target
    raise CliError(f"program {target!r} not found (no such file, and not on PATH)", EXIT_USAGE)


def _check_module(name: str) -> None:
    """Fail unless ``python -m name`` would find something to run from here."""
    sys.path.insert(0, os.getcwd())  # python -m looks in the working directory first
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{name}.__main__")  # a package runs its __main__
            if spec is None:
                raise CliError(f"{name!r} is a package with no __main__ module to run", EXIT_USAGE)
    except CliError:
        raise
    except Exception as error:  # noqa: BLE001 - finding a submodule imports its package, which may fail any way
        raise CliError(f"module {name!r} not found ({type(error).__name__}: {error})", EXIT_USAGE) from None
    finally:
        sys.path.remove(os.getcwd())
    if spec is None:
        raise CliError(f"module {name!r} not found (searched the working directory and sys.path)", EXIT_USAGE)
