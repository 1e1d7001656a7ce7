"""``raydist run``'s command line: the parser, its flags generated from the
options' records (``raydist.config.cli_options``), torchrun's flags honoured or
refused, and the split between raydist's arguments and the script's."""

from __future__ import annotations

import argparse
from typing import Any, Dict, List, Optional, Sequence, Tuple

from raydist import __version__
from raydist.config import cli_options, option_default, parse_int
from raydist.core.accelerators import ACCELERATOR_CHOICES

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

COMPLETION_SHELLS = ("bash", "zsh", "tcsh")  # what shtab writes completions for


class _PrintCompletion(argparse.Action):
    """torchrun's ``--print-completion``: shtab writes the script from the
    whole ``raydist`` parser (``top``), so it follows every flag; then exit."""

    def __init__(self, *args: Any, top: argparse.ArgumentParser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._top = top

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Optional[str] = None) -> None:
        try:
            import shtab
        except ImportError:
            parser.exit(1, f"{option} needs the 'shtab' package: pip install shtab\n")
        print(shtab.complete(self._top, shell=values))
        parser.exit()


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
    run.add_argument(
        "--print-completion",
        "--print_completion",
        action=_PrintCompletion,
        top=parser,
        choices=COMPLETION_SHELLS,
        help="print a shell completion script for raydist (its commands and flags) to stdout and exit, "
        "as torchrun's does for torchrun (e.g. --print-completion bash > "
        "~/.local/share/bash-completion/completions/raydist); needs the optional 'shtab' package",
    )
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
        "target",
        metavar="script",
        help="the training script's path (relative to the working directory), or the module name with -m",
    )
    run.add_argument(
        "script_args",
        nargs="*",
        metavar="args",
        help="arguments for the script, passed through untouched",
    )
    return parser, run


# Every flag of `torchrun --help` (torch 2.13 to 2.15), by its first spelling: honoured
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
    "--log-line-prefix-template": (HONOURED, "RunConfig.log_line_prefix_template, ${hostname} the rank's node's short host name"),
    "--print-completion": (HONOURED, "a completion script for raydist's own commands and flags (with shtab, as torchrun's)"),
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
        "-n",
        "--nproc-per-node",
        "--nproc_per_node",
        "--num-workers",
        dest="nproc_per_node",
        type=_nproc,
        default=(1, None),
        metavar="N",
        help=f"workers per node (default 1); or, as torchrun takes it, {', '.join(map(repr, kinds[:-1]))} "
        f"or {kinds[-1]!r} for one worker per device of that kind in the cluster, or 'auto' for one "
        "per device of the kind the cluster has (one per CPU slot when it has none)",
    )
    run.add_argument(
        "--nnodes",
        type=_nnodes,
        default=None,
        metavar="N|MIN:MAX",
        help="torchrun's layout: exactly nproc-per-node workers on each of N distinct nodes (one "
        "placement-group bundle per node, STRICT_SPREAD); node g (GROUP_RANK g) holds ranks g*P to "
        "g*P+P-1 and LOCAL_WORLD_SIZE=P. Fails at once, naming the nodes, when fewer than N nodes can "
        "each hold P. MIN:MAX, as torchrun takes it, is elastic in whole nodes: as many nodes as can "
        "hold P (up to MAX) once MIN can, and after a node is lost or preempted the run restarts "
        "on the whole nodes there are. Without --nnodes, the workers go wherever they fit",
    )
    run.add_argument(
        "--no-python",
        "--no_python",
        action="store_true",
        help="run the target as an executable instead of a Python script: each worker starts it as "
        "a child process with its rank's environment (torchrun's --no-python); its exit status is the rank's",
    )
    run.add_argument(
        "--run-path",
        "--run_path",
        action="store_true",
        help="run the script with runpy.run_path in the worker's interpreter, which raydist always "
        "does for a script (torchrun's --run-path); it wins over --no-python, as under torchrun",
    )
    run.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="treat the target as a module name and run it like `python -m` (the working directory goes first on sys.path)",
    )
    run.add_argument(
        "--standalone",
        action="store_true",
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
    takes_value = {option for action in run_parser._actions for option in action.option_strings if action.nargs != 0}
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
