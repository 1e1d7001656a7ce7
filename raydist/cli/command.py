"""``raydist run`` and ``raydist debug``: parse, plan, start the workers, run
the script on every rank, and exit with torchrun's status."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Sequence

from raydist.cli.args import build_parser, split_script_args
from raydist.cli.plan import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, CliError, RunPlan, as_flags, plan_run
from raydist.pool import signals


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
    from raydist.pool.ray_private import shutdown_ray
    from raydist.pool.worker.script import run_executable, run_script

    name = plan.target_as_typed
    connected_here = False
    try:
        connected_here = connect(plan.config.address, startup_timeout=plan.config.startup_timeout, standalone=plan.standalone)
        signals.install(plan.config.signals_to_handle)  # again: ray.init sets its own SIGTERM handler
        # The group returns (or raises) once the ranks' output has reached this process.
        if plan.executable:
            results = run(run_executable, args=(plan.target, list(plan.script_args)), config=plan.config)
        else:
            results = run(run_script, args=(plan.target, list(plan.script_args), plan.module, plan.target_as_typed), config=plan.config)
        _print_summary(results.summary)
        return 0
    except WorkerGroupError as error:
        print(f"raydist run: {name} failed: {error}", file=sys.stderr, flush=True)
        _print_summary(error.summary)
        return failure_status(error.failures)
    except WorkerGroupTimeout as error:
        print(f"raydist run: {name} {error}", file=sys.stderr, flush=True)
        _print_summary(error.summary)
        return EXIT_FAILURE
    except (InfeasibleResourcesError, WorkerStartupTimeout) as error:
        print(f"raydist run: cannot start the workers: {error}", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    except ConnectionError as error:
        print(f"raydist run: error: {error}", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    except (ValueError, TypeError, ImportError) as error:  # options rejected once the cluster is known
        print(f"raydist run: error: {as_flags(str(error))}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    finally:
        if connected_here and ray.is_initialized():
            shutdown_ray()  # stops a private local Ray; leaves a cluster running


def _print_summary(summary: Any) -> None:
    """The run's end summary (``RunSummary``), after everything the ranks printed, as torchrun's comes last."""
    if summary is not None:
        print(summary.table(), file=sys.stderr, flush=True)


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
            return EXIT_FAILURE
        print("raydist run: interrupted; workers stopped", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        signals.restore()
