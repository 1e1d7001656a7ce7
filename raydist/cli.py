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
import json
import os
import socket
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from raydist import __version__

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# A TCP probe bounds the wait for an unreachable address (ray.init itself
# retries for minutes); the watchdog bounds a reachable port that is no Ray.
PROBE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 60.0
# How long the driver waits for the workers' last output lines to arrive.
OUTPUT_DRAIN_TIMEOUT_S = 5.0
DEFAULT_GCS_PORT = 6379
DEFAULT_CLIENT_PORT = 10001

# As in raydist.pool.placement, which imports Ray: `raydist run --help` should not.
ACCELERATORS = ("auto", "gpu", "npu", "cpu")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

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


# -- argument types ---------------------------------------------------------


def _number(kind: Callable[[str], float], minimum: float, strict: bool = False) -> Callable[[str], Any]:
    """An argparse type: ``kind(value)``, at least ``minimum`` (above it if ``strict``)."""
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"

    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {value!r}") from None
        if number < minimum or (strict and number == minimum):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return number

    return parse


_positive_int = _number(int, 1)
_non_negative_int = _number(int, 0)
_positive_seconds = _number(float, 0, strict=True)


def _nproc(value: str) -> Optional[int]:
    """An int >= 1, or ``auto`` (None: one worker per accelerator or CPU)."""
    return None if value.strip().lower() == "auto" else _positive_int(value)


def _nnodes(value: str) -> int:
    if ":" in value:
        raise argparse.ArgumentTypeError(
            f"elastic node ranges ({value!r}) are not supported: give a fixed number of nodes"
        )
    return _positive_int(value)


def _resources(value: str) -> Dict[str, float]:
    try:
        resources = json.loads(value)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {value!r}") from None
    if not isinstance(resources, dict) or not all(
        isinstance(amount, (int, float)) and not isinstance(amount, bool) and amount >= 0
        for amount in resources.values()
    ):
        raise argparse.ArgumentTypeError(
            f'expected a JSON object of non-negative numbers such as \'{{"CPU": 2}}\', got {value!r}'
        )
    return {str(name): float(amount) for name, amount in resources.items()}


def _env_pair(value: str) -> Tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key, val


def _strategy(value: str) -> str:
    upper = value.upper()
    if upper not in PLACEMENT_STRATEGIES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(PLACEMENT_STRATEGIES)}, got {value!r}")
    return upper


# -- parser -----------------------------------------------------------------


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
        epilog=(
            "exit status: 0 when every rank exits 0; n when every failing rank called "
            "sys.exit(n); 1 when a rank raised, died or timed out; 2 for a bad command line "
            "(checked before any worker starts).\n\n"
            "examples:\n"
            "  raydist run -n 4 train.py --lr 0.1\n"
            "  raydist run --nproc-per-node auto --accelerator gpu -m mypackage.train\n"
            "  ray job submit --address http://HEAD:8265 --working-dir . -- raydist run -n 8 train.py"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    run.add_argument(
        "-n", "--nproc-per-node", "--nproc_per_node", "--num-workers",
        dest="nproc_per_node", type=_nproc, default=1, metavar="N",
        help="workers per node (default 1), or 'auto' for one per accelerator in the cluster "
        "(one per CPU when it has none)",
    )
    run.add_argument(
        "--nnodes", type=_nnodes, default=1, metavar="N",
        help="number of nodes: starts N x nproc-per-node workers and places them with the SPREAD "
        "strategy (unless --placement-strategy says otherwise), which spreads them over the "
        "cluster's nodes as evenly as Ray can; Ray does not guarantee exactly nproc-per-node "
        "on each of N nodes, and ranks are assigned from where the workers land "
        "(LOCAL_RANK, GROUP_RANK and LOCAL_WORLD_SIZE tell the truth)",
    )
    run.add_argument(
        "-m", "--module", action="store_true",
        help="treat the target as a module name and run it like `python -m` (the working "
        "directory goes first on sys.path)",
    )
    run.add_argument(
        "--accelerator", choices=ACCELERATORS, default="auto", type=str.lower,
        help="device per worker: 'auto' (GPU if the cluster has GPUs, else NPU, else CPU), "
        "'gpu', 'npu' or 'cpu' (default: auto)",
    )
    run.add_argument(
        "--resources-per-worker", type=_resources, default=None, metavar="JSON",
        help='Ray resources per worker as a JSON object, e.g. \'{"CPU": 4}\' or \'{"GPU": 2}\' '
        "(default: 1 CPU plus 1 accelerator)",
    )
    run.add_argument(
        "--backend", default=None, metavar="NAME",
        help="initialise torch.distributed with this backend (gloo, nccl, hccl, ...) or "
        "'horovod' before the script starts, for scripts that expect an initialised process "
        "group (raydist.init_distributed() and raydist.compat reuse it; a direct "
        "dist.init_process_group() call would fail). Default: leave initialization to the "
        "script, as torchrun does",
    )
    run.add_argument(
        "--max-restarts", "--max_restarts", dest="max_restarts", type=_non_negative_int,
        default=0, metavar="K",
        help="after a failure (a rank raises, exits non-zero or dies), restart the whole "
        "group on fresh workers and rerun the script, up to K times, as torchrun does "
        "(default 0); TORCHELASTIC_RESTART_COUNT tells the script which attempt it is",
    )
    run.add_argument(
        "--address", default=None, metavar="ADDRESS",
        help="Ray cluster to run on: its GCS address HOST:PORT (port 6379 by default), "
        "ray://HOST:PORT for Ray Client, or 'auto'. Default: RAY_ADDRESS if set (as "
        "inside `ray job submit`), else the cluster started with `ray start` on this "
        "machine, else a private local Ray (no dashboard) that stops when the run ends",
    )
    run.add_argument(
        "--standalone", action="store_true",
        help="start a private local Ray for this run even if RAY_ADDRESS is set or a cluster "
        "runs on this machine (torchrun's single-node mode)",
    )
    run.add_argument(
        "--env", type=_env_pair, action="append", default=[], metavar="KEY=VALUE",
        help="set an environment variable on every worker (repeatable); workers on a "
        "remote cluster do not inherit this shell's environment",
    )
    run.add_argument(
        "--placement-strategy", "--placement_strategy", dest="placement_strategy",
        type=_strategy, default=None, metavar="STRATEGY",
        help=f"Ray placement group strategy, one of {', '.join(PLACEMENT_STRATEGIES)} "
        "(default: PACK, or SPREAD with --nnodes above 1)",
    )
    run.add_argument(
        "--timeout", type=_positive_seconds, default=None, metavar="SECONDS",
        help="stop the run and fail if the script has not finished on every rank after "
        "this many seconds (default: no limit)",
    )
    run.add_argument(
        "--startup-timeout", type=_positive_seconds, default=300.0, metavar="SECONDS",
        help="how long to wait for a busy or autoscaling cluster to provide the workers "
        "(default 300); a request the cluster can never meet fails at once",
    )
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

    target: str  # absolute script path, or module name
    target_as_typed: str
    module: bool
    script_args: Tuple[str, ...]
    num_workers: Optional[int]
    nnodes: int
    placement_strategy: str
    env: Dict[str, str]


def plan_run(options: argparse.Namespace, script_args: Sequence[str]) -> RunPlan:
    """Validate everything that can be checked without Ray; CliError(status 2) if wrong."""
    if options.module:
        _check_module(options.target)
        target = options.target
    else:
        if not os.path.isfile(options.target):
            where = os.path.join(os.getcwd(), options.target)
            raise CliError(f"script {options.target!r} not found (no file at {where})", EXIT_USAGE)
        target = os.path.abspath(options.target)
    if options.nnodes > 1 and options.nproc_per_node is None:
        raise CliError(
            "--nproc-per-node auto counts the whole cluster; give a number with --nnodes", EXIT_USAGE
        )
    num_workers = None if options.nproc_per_node is None else options.nproc_per_node * options.nnodes
    strategy = options.placement_strategy or ("SPREAD" if options.nnodes > 1 else "PACK")
    return RunPlan(
        target=target,
        target_as_typed=options.target,
        module=options.module,
        script_args=tuple(script_args),
        num_workers=num_workers,
        nnodes=options.nnodes,
        placement_strategy=strategy,
        env=dict(options.env),
    )


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


def _probe_address(address: str) -> Tuple[str, int]:
    """Host and port of a Ray address, for a quick TCP reachability check."""
    rest = address
    port = DEFAULT_GCS_PORT
    if rest.startswith("ray://"):
        rest, port = rest[len("ray://") :], DEFAULT_CLIENT_PORT
    rest = rest.split("/", 1)[0]
    if rest.startswith("["):  # [IPv6]:port
        host, _, tail = rest[1:].partition("]")
        return host, int(tail[1:]) if tail.startswith(":") else port
    host, sep, port_text = rest.rpartition(":")
    if not sep:
        return rest, port
    try:
        return host, int(port_text)
    except ValueError:
        raise CliError(f"invalid Ray address {address!r}: port {port_text!r} is not a number", EXIT_USAGE) from None


def connect(address: Optional[str], standalone: bool) -> bool:
    """ray.init for the run, failing within seconds (naming the address) when
    the cluster cannot be reached. False if Ray was already initialised here."""
    import ray

    if ray.is_initialized():
        return False
    source = "--address"
    if standalone:
        address, source = "local", "--standalone"
    elif not address and os.environ.get("RAY_ADDRESS"):
        address, source = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if address and address not in ("local", "auto"):
        if address.startswith(("http://", "https://")):
            raise CliError(
                f"{address!r} ({source}) is a dashboard / job API address; give the cluster's "
                f"GCS address (HOST:{DEFAULT_GCS_PORT}), or submit the run as a job: "
                f"ray job submit --address {address} -- raydist run ...",
                EXIT_USAGE,
            )
        host, port = _probe_address(address)
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
        except OSError as error:
            raise CliError(f"cannot reach the Ray cluster at {address} (from {source}): {error}") from None

    def give_up() -> None:  # ray.init cannot be interrupted from another thread
        print(
            f"raydist run: error: no Ray cluster answered at {address} (from {source}) "
            f"within {CONNECT_TIMEOUT_S:g} s",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_FAILURE)

    watchdog = threading.Timer(CONNECT_TIMEOUT_S, give_up) if address not in (None, "local") else None
    if watchdog is not None:
        watchdog.daemon = True
        watchdog.start()
    try:
        if address and address != "local":
            ray.init(address=address)
        else:  # None attaches to a `ray start` cluster here if any, else starts a private Ray
            ray.init(address=address, include_dashboard=False)
    except Exception as error:  # noqa: BLE001 - Ray raises several kinds; all mean the same here
        where = f"the Ray cluster at {address} (from {source})" if address not in (None, "local") else "a local Ray"
        raise CliError(f"cannot connect to {where}: {error}") from None
    finally:
        if watchdog is not None:
            watchdog.cancel()
    return True


def _warn_if_too_few_nodes(nnodes: int) -> None:
    import ray

    alive = sum(1 for node in ray.nodes() if node["Alive"])
    if alive < nnodes:
        print(
            f"raydist run: warning: --nnodes {nnodes} but the cluster has {alive} node(s); "
            "workers are spread over the nodes there are",
            file=sys.stderr,
            flush=True,
        )


class OutputDrain:
    """Lets the driver wait until the workers' last output lines have arrived.

    Ray forwards worker output asynchronously, so a driver that exits as soon
    as the run ends can lose the tail (a script's final "loss: ..." line).
    Each rank ends with a marker line on stdout and stderr; this filter on
    Ray's printer hides the markers and records them, and ``wait`` returns
    once the expected ones are in (or after ``timeout``).
    """

    def __init__(self, timeout: float = OUTPUT_DRAIN_TIMEOUT_S):
        self.token = f"raydist-output-end-{uuid.uuid4().hex}"
        self._timeout = timeout
        self._seen: Set[Tuple[int, int, bool]] = set()  # (attempt, rank, is_err)
        self._changed = threading.Condition()

    def install(self) -> bool:
        """Wrap Ray's worker-output printer; False where this Ray has none to wrap."""
        try:
            from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

            with dispatcher._lock:
                for index, (name, handler) in enumerate(dispatcher.handlers):
                    if name == "ray_print_logs":
                        dispatcher.handlers[index] = (name, self._filter(handler))
                        return True
        except Exception:  # noqa: BLE001 - a private API; without it, no waiting
            pass
        return False

    def _filter(self, print_lines: Callable[[Dict[str, Any]], None]) -> Callable[[Dict[str, Any]], None]:
        def handle(data: Dict[str, Any]) -> None:
            lines = data.get("lines") or []
            kept = [line for line in lines if self.token not in line]
            if len(kept) != len(lines):
                with self._changed:
                    for line in lines:
                        if self.token in line:
                            try:
                                attempt, rank = line.split(self.token, 1)[1].split()[:2]
                                self._seen.add((int(attempt), int(rank), bool(data.get("is_err"))))
                            except ValueError:
                                pass  # mangled in transit: wait() times out instead
                    self._changed.notify_all()
                data = dict(data, lines=kept)
            if kept:
                print_lines(data)

        return handle

    def wait(self, attempt: int, ranks: Sequence[int]) -> None:
        expected = {(attempt, rank, is_err) for rank in ranks for is_err in (False, True)}
        with self._changed:
            self._changed.wait_for(lambda: expected <= self._seen, timeout=self._timeout)


def failure_status(failures: Sequence[Any]) -> int:
    """``n`` when every failing rank called ``sys.exit(n)``; else 1 (a rank raised or died)."""
    codes = {failure.exit_code for failure in failures}
    if len(codes) == 1:
        code = codes.pop()
        if code is not None and 0 < code < 256:
            return code
    return EXIT_FAILURE


def execute(plan: RunPlan, options: argparse.Namespace) -> int:
    """Start the workers, run the script on every rank, report; the exit status."""
    import ray

    from raydist.api import run
    from raydist.pool.errors import InfeasibleResourcesError, WorkerGroupError, WorkerGroupTimeout
    from raydist.pool.script import run_script

    name = plan.target_as_typed
    drain = OutputDrain()
    end_marker: Optional[str] = None
    connected_here = False
    try:
        connected_here = connect(options.address, options.standalone)
        end_marker = drain.token if drain.install() else None
        if plan.nnodes > 1:
            _warn_if_too_few_nodes(plan.nnodes)
        attempt_of_rank = run(
            run_script,
            num_workers=plan.num_workers,
            args=(plan.target, list(plan.script_args), plan.module, plan.target_as_typed, end_marker),
            accelerator=options.accelerator,
            resources_per_worker=options.resources_per_worker,
            backend=options.backend,
            env=plan.env,
            placement_strategy=plan.placement_strategy,
            timeout=options.timeout,
            startup_timeout=options.startup_timeout,
            max_restarts=options.max_restarts,
            retry_on_exception=True,  # torchrun restarts on any failure
            init_process_group=options.backend is not None,
        )
        if end_marker is not None:
            drain.wait(attempt_of_rank[0], range(len(attempt_of_rank)))
        return 0
    except WorkerGroupError as error:
        # Ranks that raised or exited wrote their end marker; killed ones could not.
        finished = [failure.rank for failure in error.failures if not failure.crashed]
        if end_marker is not None and finished:
            drain.wait(len(error.attempts), finished)
        print(f"raydist run: {name} failed: {error}", file=sys.stderr, flush=True)
        return failure_status(error.failures)
    except WorkerGroupTimeout as error:
        print(f"raydist run: {name} {error}", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    except InfeasibleResourcesError as error:
        print(f"raydist run: cannot start the workers: {error}", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    except (ValueError, TypeError, ImportError) as error:  # options raydist.run rejected
        print(f"raydist run: error: {error}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    finally:
        if connected_here:
            ray.shutdown()  # stops a private local Ray; leaves a cluster running


def _configure_ray_output() -> None:
    """Ray's log forwarding, made to behave like torchrun's: every rank's lines
    (no "[repeated Nx]" folding), and no colour codes when piped."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # read when ray is imported
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``raydist`` console script and ``python -m raydist``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, run_parser = build_parser()
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
    try:
        return execute(plan, options)
    except CliError as error:
        print(f"raydist run: error: {error}", file=sys.stderr, flush=True)
        return error.status
    except KeyboardInterrupt:
        print("raydist run: interrupted; workers stopped", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
