"""The ``raydist`` command: ``raydist run`` is torchrun on a Ray cluster.

    raydist run -n 4 train.py --lr 0.1          # a script, as torchrun runs it
    raydist run -n 4 -m mypackage.train --lr 0.1  # a module, like python -m

Every worker is a Ray actor with torchrun's environment (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), and runs the script as
``__main__`` with ``sys.argv = [script, *args]``; the script initialises the
process group itself, as it does under torchrun. Everything after the script
(or module) name goes to the script untouched.

Exit status: 0 when every rank exits 0; a script's ``sys.exit(n)`` on every
failing rank gives ``n``; any rank that raised or died gives 1; bad command
lines (unknown flags, a missing script or module) give 2 before any worker
starts.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from raydist import __version__
from raydist.config import CLI_RESTART_MODE, ELASTIC_SIZE, RunConfig, cli_options, option_default, parse_int
from raydist.core.accelerators import ACCELERATOR_CHOICES
from raydist.core.backend import backend_entry
from raydist.pool.driver import signals

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

RUN_DESCRIPTION = """\
Run a torchrun-style training script (or -m module) on Ray actors, one per
rank. Each worker gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, ...) and runs the
script as __main__ with sys.argv = [script, *args]; the script initialises
torch.distributed itself, as under torchrun. Everything after the script (or
module) name is passed to it untouched.

The script is read by path on every worker: workers on this machine share its
files, and under `ray job submit --working-dir DIR` every worker runs in a
copy of DIR, where a path relative to DIR resolves."""


class CliError(Exception):
    """A failure to report in one line and exit with ``status``."""

    def __init__(self, message: str, status: int = EXIT_FAILURE):
        super().__init__(message)
        self.status = status


# -- argument types (of the CLI-only flags; RunConfig's live with its fields) --


def _nproc(value: str) -> Tuple[Optional[int], Optional[str]]:
    """torchrun's ``auto | cpu | gpu | xpu | N`` (plus raydist's other kinds):
    ``(N, None)``, or ``(None, kind)`` for one worker per device of that kind
    in the cluster ("auto": the kind the cluster has)."""
    word = value.strip().lower()
    if word in ACCELERATOR_CHOICES:
        return None, word
    return parse_int(value), None


def _nnodes(value: str) -> Tuple[int, int]:
    """torchrun's ``N`` or ``MIN:MAX`` (an elastic number of nodes)."""
    low, sep, high = value.partition(":")
    return (parse_int(low), parse_int(high)) if sep else (parse_int(value), parse_int(value))


# -- parser -----------------------------------------------------------------

RUN_EPILOG = (
    "exit status: 0 when every rank exits 0; n when every failing rank called "
    "sys.exit(n); 1 when a rank raised, died or timed out; 2 for a bad command line "
    "(checked before any worker starts).\n\n"
    "examples:\n"
    "  raydist run -n 4 train.py --lr 0.1\n"
    "  raydist run --nproc-per-node auto --accelerator gpu -m mypackage.train\n"
    "  ray job submit --address http://HEAD:8265 --working-dir . -- raydist run -n 8 train.py"
)


def build_parser() -> Tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level parser and its ``run`` sub-parser."""
    parser = argparse.ArgumentParser(
        prog="raydist",
        description="Run distributed PyTorch on a Ray cluster.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"raydist {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="run a torchrun script on Ray workers",
        description=RUN_DESCRIPTION,
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    _add_cli_only_arguments(run)
    _add_config_arguments(run)
    _add_refused_arguments(run)
    debug = commands.add_parser(
        "debug",
        help="attach to a rank waiting in pdb (breakpoint() or --post-mortem) under a run on this machine",
        description="List the ranks waiting in pdb under the raydist runs started on this machine and "
        "attach this terminal to one of them: the way in when the run's own terminal cannot serve "
        "pdb (a job submitted without one). `c` continues the rank.",
    )
    debug.add_argument("--rank", type=parse_int, default=None, help="the rank to attach to (default: the only one waiting)")
    debug.add_argument("--list", action="store_true", help="only list the waiting ranks")
    run.add_argument(
        "target", metavar="script",
        help="the training script's path (relative to the working directory), or the module "
        "name with -m",
    )
    run.add_argument(
        "script_args", nargs="*", metavar="args",
        help="arguments for the script, passed through untouched",
    )
    return parser, run


# Every flag of `torchrun --help` (torch 2.13), by its first spelling: honoured
# (and by what) or refused (and why). A refused flag makes `raydist run` exit 2
# with its reason; a test reads `torchrun --help` and fails on a flag missing here.
HONOURED, REFUSED = "honoured", "refused"
TORCHRUN_FLAGS: Dict[str, Tuple[str, str]] = {
    "--nnodes": (HONOURED, "RunConfig.num_nodes: exactly --nproc-per-node ranks on each of N nodes; MIN:MAX elastic in whole nodes"),
    "--nproc-per-node": (HONOURED, "-n: workers per node (RunConfig.workers_per_node with --nnodes, else num_workers)"),
    "--standalone": (HONOURED, "a private local Ray for this run"),
    "--max-restarts": (HONOURED, "RunConfig.max_restarts"),
    "--monitor-interval": (HONOURED, "RunConfig.monitor_interval: how often the driver looks at node drains and room to grow"),
    "--role": (HONOURED, "RunConfig.role: ROLE_NAME and ${role_name} in the log line prefix"),
    "--module": (HONOURED, "-m: run a module like python -m"),
    "--no-python": (HONOURED, "run the target as an executable (a child of each worker, with the rank's environment)"),
    "--run-path": (HONOURED, "runpy.run_path in the worker's interpreter: what raydist always does for a script; wins over --no-python"),
    "--log-dir": (HONOURED, "RunConfig.log_dir"),
    "--redirects": (HONOURED, "RunConfig.redirects"),
    "--tee": (HONOURED, "RunConfig.tee"),
    "--local-ranks-filter": (HONOURED, "RunConfig.local_ranks_filter"),
    "--numa-binding": (HONOURED, "RunConfig.numa_binding, applied in each worker before the script"),
    "--virtual-local-rank": (HONOURED, "RunConfig.virtual_local_rank"),
    "--signals-to-handle": (HONOURED, "RunConfig.signals_to_handle"),
    "--shutdown-timeout": (HONOURED, "RunConfig.shutdown_timeout"),
    "--rdzv-backend": (REFUSED, "Ray is the rendezvous: raydist places the ranks and picks MASTER_ADDR/MASTER_PORT"),
    "--rdzv-endpoint": (REFUSED, "Ray is the rendezvous: give the Ray cluster with --address"),
    "--rdzv-id": (REFUSED, "Ray is the rendezvous: each run gets its own id (TORCHELASTIC_RUN_ID)"),
    "--rdzv-conf": (REFUSED, "Ray is the rendezvous: there is no rendezvous backend to configure"),
    "--start-method": (REFUSED, "workers are Ray actor processes, not multiprocessing children"),
    "--event-log-handler": (REFUSED, "raydist emits no torchelastic events; it logs restarts on the driver"),
    "--duplicate-stdout-filters": (REFUSED, "not supported: grep the per-rank files of --log-dir instead"),
    "--duplicate-stderr-filters": (REFUSED, "not supported: grep the per-rank files of --log-dir instead"),
    "--node-rank": (REFUSED, "one raydist run starts every node; node ranks follow where Ray placed the workers"),
    "--master-addr": (REFUSED, "MASTER_ADDR is rank 0's node, wherever Ray placed it"),
    "--master-port": (REFUSED, "MASTER_PORT is a free port raydist finds on rank 0's node"),
    "--local-addr": (REFUSED, "each worker's address is its Ray node's IP"),
    "--logs-specs": (REFUSED, "torchrun's LogsSpecs plugins are not loaded; --log-dir is laid out as torchrun's default"),
}
# torchrun's two spellings of each refused flag (all of them take a value).
_REFUSED_SPELLINGS: Dict[str, Tuple[str, ...]] = {
    flag: (flag, "--" + flag[2:].replace("-", "_")) for flag, (kind, _) in TORCHRUN_FLAGS.items() if kind == REFUSED
}


class _Refused(argparse.Action):
    """A torchrun flag raydist does not take: a usage error with the reason."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Optional[str] = None) -> None:
        raise argparse.ArgumentError(self, f"torchrun's {self.option_strings[0]} is refused: {self.help}")


def _add_refused_arguments(run: argparse.ArgumentParser) -> None:
    group = run.add_argument_group("torchrun flags raydist refuses (each exits 2 with its reason)")
    for flag, spellings in _REFUSED_SPELLINGS.items():
        group.add_argument(*spellings, action=_Refused, metavar="VALUE", help=TORCHRUN_FLAGS[flag][1], dest=argparse.SUPPRESS)


def _add_cli_only_arguments(run: argparse.ArgumentParser) -> None:
    """torchrun's flags that are not one RunConfig option each."""
    kinds = [kind for kind in ACCELERATOR_CHOICES if kind != "auto"]
    run.add_argument(
        "-n", "--nproc-per-node", "--nproc_per_node", "--num-workers",
        dest="nproc_per_node", type=_nproc, default=(1, None), metavar="N",
        help=f"workers per node (default 1); or, as torchrun takes it, {', '.join(map(repr, kinds[:-1]))} "
        f"or {kinds[-1]!r} for one worker per device of that kind in the cluster, or 'auto' for one "
        "per device of the kind the cluster has (one per CPU slot when it has none)",
    )
    run.add_argument(
        "--nnodes", type=_nnodes, default=None, metavar="N|MIN:MAX",
        help="torchrun's layout: exactly nproc-per-node workers on each of N distinct nodes (one "
        "placement-group bundle per node, STRICT_SPREAD); node g (GROUP_RANK g) holds ranks g*P to "
        "g*P+P-1 and LOCAL_WORLD_SIZE=P. Fails at once, naming the nodes, when fewer than N nodes can "
        "each hold P. MIN:MAX, as torchrun takes it, is elastic in whole nodes: as many nodes as can "
        "hold P (up to MAX) once MIN can, and after a node is lost or preempted the run restarts "
        "on the whole nodes there are. Without --nnodes, the workers go wherever they fit",
    )
    run.add_argument(
        "--no-python", "--no_python", action="store_true",
        help="run the target as an executable instead of a Python script: each worker starts it as "
        "a child process with its rank's environment (torchrun's --no-python); its exit status is the rank's",
    )
    run.add_argument(
        "--run-path", "--run_path", action="store_true",
        help="run the script with runpy.run_path in the worker's interpreter, which raydist always "
        "does for a script (torchrun's --run-path); it wins over --no-python, as under torchrun",
    )
    run.add_argument(
        "-m", "--module", action="store_true",
        help="treat the target as a module name and run it like `python -m` (the working "
        "directory goes first on sys.path)",
    )
    run.add_argument(
        "--standalone", action="store_true",
        help="start a private local Ray for this run even if RAY_ADDRESS is set or a cluster "
        "runs on this machine (torchrun's single-node mode)",
    )


def _add_config_arguments(run: argparse.ArgumentParser) -> None:
    """One flag per RunConfig option that carries a CliFlag, generated from it.

    Every flag defaults to None ("not given"), so RunConfig keeps its own default.
    """
    for option, flag in cli_options():
        if not flag.generated:
            continue
        settings: Dict[str, Any] = {"dest": option.name, "default": None, "help": flag.help_for(option_default(option))}
        for name, value in (("type", flag.parse), ("metavar", flag.metavar), ("action", flag.action), ("choices", flag.choices)):
            if value is not None:
                settings[name] = value
        run.add_argument(*flag.flags, **settings)


def split_script_args(run_parser: argparse.ArgumentParser, argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Split ``raydist run``'s arguments into its own (up to and including the
    script) and the script's, so that script flags are never parsed here."""
    takes_value = {
        option
        for action in run_parser._actions
        for option in action.option_strings
        if action.nargs != 0
    }
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--":  # "--" ends the options; the next token is the script
            return list(argv[: index + 2]), list(argv[index + 2 :])
        if token.startswith("-") and token != "-":
            if token.startswith("--"):
                joined = "=" in token
                name = token.split("=", 1)[0]
            else:
                joined = len(token) > 2  # "-n2"
                name = token[:2]
            index += 2 if name in takes_value and not joined else 1
            continue  # unknown options are left for argparse to reject
        return list(argv[: index + 1]), list(argv[index + 1 :])
    return list(argv), []


# -- run --------------------------------------------------------------------


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
    if config.backend is not None:
        try:
            backend_entry(config.backend).check_requires()  # a missing library fails before Ray starts
        except ImportError as error:
            raise CliError(str(error), EXIT_USAGE) from None
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
        raise CliError(_as_flags(str(error)), EXIT_USAGE) from None


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
    except (TypeError, ValueError) as error:
        raise CliError(_as_flags(str(error)), EXIT_USAGE) from None


def _from_cli_only_flags(options: argparse.Namespace) -> Dict[str, Any]:
    """The options that -n/--nproc-per-node and --nnodes decide, as torchrun reads them."""
    per_node, kind = options.nproc_per_node
    accelerator = options.accelerator
    if kind is not None and kind != "auto":
        if accelerator not in (None, "auto", kind):
            raise CliError(f"--nproc-per-node {kind} contradicts --accelerator {accelerator}", EXIT_USAGE)
        accelerator = kind
    if per_node is not None and per_node < 1:  # named per node, as typed
        raise CliError(f"--nproc-per-node must be >= 1, got {per_node}", EXIT_USAGE)
    derived: Dict[str, Any] = {}
    if accelerator is not None:
        derived["accelerator"] = accelerator
    if options.nnodes is None:  # no layout promised: the workers go wherever they fit
        if per_node is not None:
            derived["num_workers"] = per_node
        return derived
    min_nodes, max_nodes = options.nnodes
    if min_nodes < 1 or max_nodes < min_nodes:
        raise CliError(f"--nnodes must be N >= 1 or MIN:MAX with 1 <= MIN <= MAX, got {min_nodes}:{max_nodes}", EXIT_USAGE)
    if per_node is None:
        raise CliError(f"--nproc-per-node {kind} counts the whole cluster; give a number with --nnodes", EXIT_USAGE)
    if options.placement_strategy is not None:
        raise CliError(
            "--nnodes places one bundle per node on distinct nodes (STRICT_SPREAD); "
            "--placement-strategy applies only without --nnodes", EXIT_USAGE,
        )
    derived["num_nodes"] = min_nodes if min_nodes == max_nodes else (min_nodes, max_nodes)
    derived["workers_per_node"] = per_node
    return derived


def _as_flags(message: str) -> str:
    """A RunConfig message with option names spelled as this command's flags."""
    # The elastic size as typed here ("--nproc-per-node=(min, max)" is no flag form).
    message = message.replace(ELASTIC_SIZE, "--nnodes MIN:MAX")
    flag_of = {option.name: flag.flag for option, flag in cli_options()}
    # (?<!-): a name already spelled as a flag (a hint's "--address") stays as it is.
    return re.sub(r"(?<!-)\b(" + "|".join(flag_of) + r")\b", lambda m: flag_of[m.group(1)], message)


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


def failure_status(failures: Sequence[Any]) -> int:
    """The status python would exit with when every failing rank called
    ``sys.exit(n)`` (n modulo 256: -1 gives 255); else 1 (a rank raised or died)."""
    codes = {failure.exit_code for failure in failures}
    if len(codes) == 1:
        code = codes.pop()
        if code is not None and code % 256:
            return code % 256
    return EXIT_FAILURE


def execute(plan: RunPlan) -> int:
    """Start the workers, run the script on every rank, report; the exit status."""
    import ray

    from raydist.api import run
    from raydist.errors import InfeasibleResourcesError, WorkerGroupError, WorkerGroupTimeout, WorkerStartupTimeout
    from raydist.pool.cluster.connect import connect
    from raydist.pool.cluster.ray_private import shutdown_ray
    from raydist.pool.worker.script import run_executable, run_script

    name = plan.target_as_typed
    connected_here = False
    try:
        connected_here = connect(plan.config.address, startup_timeout=plan.config.startup_timeout, standalone=plan.standalone)
        signals.install(plan.config.signals_to_handle)  # again: ray.init sets its own SIGTERM handler
        # The group returns (or raises) once the ranks' output has reached this process.
        if plan.executable:
            run(run_executable, args=(plan.target, list(plan.script_args)), config=plan.config)
        else:
            run(run_script, args=(plan.target, list(plan.script_args), plan.module, plan.target_as_typed), config=plan.config)
        return 0
    except WorkerGroupError as error:
        print(f"raydist run: {name} failed: {error}", file=sys.stderr, flush=True)
        return failure_status(error.failures)
    except WorkerGroupTimeout as error:
        print(f"raydist run: {name} {error}", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    except (InfeasibleResourcesError, WorkerStartupTimeout) as error:
        print(f"raydist run: cannot start the workers: {error}", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    except ConnectionError as error:
        print(f"raydist run: error: {error}", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    except (ValueError, TypeError, ImportError) as error:  # options rejected once the cluster is known
        print(f"raydist run: error: {_as_flags(str(error))}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    finally:
        if connected_here and ray.is_initialized():
            shutdown_ray()  # stops a private local Ray; leaves a cluster running


def _configure_ray_output() -> None:
    """Ray's log forwarding, made to behave like torchrun's: every rank's lines
    (no "[repeated Nx]" folding), and no colour codes when piped."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # read when ray is imported
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def _exit_now(status: int) -> None:
    """End this process (the run's own: the console script, ``python -m
    raydist``) without interpreter finalisation: a signal can land anywhere
    in Ray's client, and its C++ threads may still be running while Python
    tears its objects down (a SIGSEGV at exit). Ray is stopped already."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not change the status
            pass
    os._exit(status)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``raydist`` console script and ``python -m raydist``."""
    argv_given = argv
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, run_parser = build_parser()
    if argv and argv[0] == "debug":
        from raydist.pool.driver.debug_client import debug_command

        options = parser.parse_args(argv)
        return debug_command(options.rank, options.list)
    if not argv or argv[0] != "run":
        parser.parse_args(argv)  # help, version, or a usage error; all exit here
        return EXIT_USAGE
    own, script_args = split_script_args(run_parser, argv[1:])
    options, unknown = parser.parse_known_args(["run", *own])
    if unknown:
        run_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        plan = plan_run(options, script_args)
    except CliError as error:
        run_parser.error(str(error))  # usage, message, exit status 2
    _configure_ray_output()
    signals.install(plan.config.signals_to_handle)  # whatever was inherited, as torchrun does
    try:
        return execute(plan)
    except CliError as error:
        print(f"raydist run: error: {error}", file=sys.stderr, flush=True)
        return error.status
    except KeyboardInterrupt:  # a handled signal arrives as one too (see signals)
        signum = signals.received()
        if signum is not None:  # torchrun exits with 1 after a signal, too
            print(f"raydist run: got {signals.SignalReceived(signum).name}; the workers were stopped", file=sys.stderr, flush=True)
            if argv_given is None:
                _exit_now(EXIT_FAILURE)
            return EXIT_FAILURE
        print("raydist run: interrupted; workers stopped", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        signals.restore()


if __name__ == "__main__":
    sys.exit(main())
