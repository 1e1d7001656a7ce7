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

from raydist.cli.args import HONOURED, REFUSED, TORCHRUN_FLAGS, build_parser, split_script_args
from raydist.cli.command import execute, failure_status, main
from raydist.cli.plan import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, CliError, RunPlan, as_flags, build_config, plan_run

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "HONOURED",
    "REFUSED",
    "TORCHRUN_FLAGS",
    "CliError",
    "RunPlan",
    "as_flags",
    "build_config",
    "build_parser",
    "execute",
    "failure_status",
    "main",
    "plan_run",
    "split_script_args",
]
