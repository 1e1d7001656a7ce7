"""Every option of ``raydist.run``, ``WorkerGroup`` and ``raydist run``, in one place.

``RunConfig`` is frozen and Ray-free: each default is written once here and
every check runs when it is built, before Ray is touched, so bad input fails
at once with the option's name. The CLI builds one from flags, ``run`` and
``WorkerGroup`` from keywords; the worker group only reads it.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import ipaddress
import json
import math
import os
import re
import signal
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

from raydist.core.accelerators import (
    ACCELERATOR_CHOICES,
    BY_NAME,
    ROWS,
    DEVICE_RESOURCES,
    VISIBLE_DEVICES_VARS,
    auto_help,
    kinds_help,
)
from raydist.core.backend import TORCH_BACKEND, backend_entry, reserved_env
from raydist.core.environment import DEVICE_INDEX_VAR, TORCHRUN_ENV_VARS

PLACEMENT_STRATEGIES: Tuple[str, ...] = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
# "warm": a restart keeps the surviving workers' processes; "fresh": every attempt in new processes.
RESTART_MODES: Tuple[str, ...] = ("warm", "fresh")
# What `raydist run` uses unless --restart-mode says otherwise: torchrun's semantics.
CLI_RESTART_MODE = "fresh"
# Measured break-even against gloo pickling among 4 ranks: 2-4 MB for
# broadcast, 1-2 MB for all-gather (benchmarks/collectives.py).
DEFAULT_OBJECT_STORE_THRESHOLD = 4 << 20

# The launcher variables raydist sets per rank: an override would give ranks
# a world that disagrees with the real one (a hang, or a port clash). Each
# backend's launcher side adds its own (the registry's reserved_env).
# What the launcher sets on every rank (torchrun's own variables, read off ``torchrun_env``), and the visible devices.
LAUNCHER_ENV_VARS = frozenset({*TORCHRUN_ENV_VARS, DEVICE_INDEX_VAR, *VISIBLE_DEVICES_VARS})
LAUNCHER_ENV_PREFIXES: Tuple[str, ...] = ("TORCHELASTIC_", "RAYDIST_")

# Ray's built-in resources, spelled as Ray spells them ("gpu" is a typo, not a custom resource).
_RAY_RESOURCES = ("CPU", "memory", "object_store_memory", *DEVICE_RESOURCES)
# Ray names placement-group resources "<name>_group_<index>_<pg id>" and "bundle_group_<pg id>".
_PLACEMENT_GROUP_RESOURCE = re.compile(r"^bundle$|^bundle_group_|_group_(\d+_)?[0-9a-f]{16,}$")
# Ray counts resources in units of 1/10000.
_RESOURCE_PRECISION = 1e-4

# torchrun's stream codes for -r/--redirects and -t/--tee: a bit per stream.
STD_NONE, STD_OUT, STD_ERR, STD_ALL = 0, 1, 2, 3
# One code for every local rank, or a code per local rank ({local_rank: code}).
StdSpec = Union[int, Dict[int, int]]
_STD_CODES = "0 none, 1 stdout, 2 stderr, 3 both"
_STD_ONE = re.compile(r"^[0-3]$")
_STD_PER_RANK = re.compile(r"^\d+:[0-3](,\d+:[0-3])*$")


def _type_name(value: Any) -> str:
    return type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {_type_name(value)} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_seconds(name: str, value: Any) -> float:
    if not _is_number(value):
        raise TypeError(f"{name} must be a number of seconds, not {_type_name(value)} {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {_type_name(value)} {value!r}")


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` matched case-insensitively against ``choices``, or ValueError listing them."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string (one of {', '.join(choices)}), not {_type_name(value)}")
    for choice in choices:
        if value.lower() == choice.lower():
            return choice
    raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(choices)}")


def check_resources(resources: Any) -> Dict[str, float]:
    """``resources_per_worker`` as a plain dict of floats; TypeError/ValueError naming the entry."""
    if not isinstance(resources, Mapping):
        raise TypeError(
            f'resources_per_worker must be a mapping such as {{"CPU": 2, "GPU": 1}}, not {_type_name(resources)}'
        )
    checked: Dict[str, float] = {}
    for name, amount in resources.items():
        where = f"resources_per_worker[{name!r}]"
        if not isinstance(name, str) or not name:
            raise TypeError(f"resources_per_worker keys must be non-empty resource names, got {name!r}")
        for known in _RAY_RESOURCES:
            if name != known and name.lower() == known.lower():
                raise ValueError(f"{where}: Ray's resource is spelled {known!r}")
        if name == "object_store_memory":
            raise ValueError(
                f"{where}: Ray does not reserve object store memory per worker (deprecated in Ray, and "
                "its raylet fails on it inside a placement group); leave it out: objects spill to disk "
                "when the store is full. 'memory' (heap bytes per worker) is honoured"
            )
        if _PLACEMENT_GROUP_RESOURCE.search(name):
            raise ValueError(f"{where}: names of this form are Ray's placement-group resources")
        if not _is_number(amount):
            raise TypeError(f"{where} must be a number, not {_type_name(amount)} {amount!r}")
        if not math.isfinite(amount) or amount < 0:
            raise ValueError(f"{where} must be a finite number >= 0, got {amount!r}")
        if amount and amount < _RESOURCE_PRECISION:
            raise ValueError(f"{where}={amount!r}: Ray counts resources in steps of {_RESOURCE_PRECISION:g}")
        if name in DEVICE_RESOURCES and amount > 1 and not float(amount).is_integer():
            raise ValueError(
                f"{where}={amount!r}: a worker either shares one device (an amount below 1) "
                "or holds whole devices (a whole number)"
            )
        checked[name] = float(amount)
    return checked


# Signals no process can handle.
_UNHANDLED_SIGNALS = ("SIGKILL", "SIGSTOP")
# raydist's own: the stack-dump signal (raydist.pool.worker.evidence.STACK_SIGNAL,
# SIGRTMIN+6; not imported: that module needs Ray).
_RAYDIST_SIGNALS = frozenset({int(signal.SIGRTMIN) + 6})


def _check_signal(name: Any) -> str:
    """A signal name such as "SIGTERM" or "SIGUSR1", as the signal module spells it,
    that a rank can catch and raydist does not use itself."""
    if not isinstance(name, str) or not isinstance(getattr(signal, name.upper(), None), signal.Signals):
        raise ValueError(f"preemption_signal must be a signal name such as 'SIGTERM' or 'SIGUSR1', got {name!r}")
    text = name.upper()
    if text in _UNHANDLED_SIGNALS:
        raise ValueError(f"preemption_signal {text} cannot be caught by a rank (no warning could reach the script)")
    if int(getattr(signal, text)) in _RAYDIST_SIGNALS:
        raise ValueError(f"preemption_signal {text} is raydist's stack-dump signal")
    return text


def check_signals_to_handle(value: Any) -> Tuple[str, ...]:
    """torchrun's ``--signals-to-handle``: "SIGTERM,SIGINT" or a sequence of names."""
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)):
        raise TypeError(f"signals_to_handle must be signal names such as 'SIGTERM,SIGINT', not {_type_name(value)} {value!r}")
    checked = []
    for name in names:
        text = name.strip().upper() if isinstance(name, str) else name
        if not isinstance(text, str) or not isinstance(getattr(signal, text, None), signal.Signals) or text in ("SIG_DFL", "SIG_IGN"):
            raise ValueError(f"signals_to_handle: {name!r} is not a signal name such as 'SIGTERM'")
        if text in _UNHANDLED_SIGNALS:
            raise ValueError(f"signals_to_handle: {text} cannot be handled by any process")
        checked.append(text)
    return tuple(dict.fromkeys(checked))


def reserved_env_vars() -> Tuple[FrozenSet[str], Tuple[str, ...]]:
    """The variables (and prefixes) ``env`` may not set: the launcher's, and
    those of every registered backend's launcher side."""
    names, prefixes = reserved_env()
    return LAUNCHER_ENV_VARS | names, LAUNCHER_ENV_PREFIXES + prefixes


def check_env(env: Any) -> Dict[str, str]:
    """Extra worker variables: strings only, none of the launcher variables raydist sets."""
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping of variable names to strings, not {_type_name(env)}")
    reserved, reserved_prefixes = reserved_env_vars() if env else (frozenset(), ())
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"env key {key!r} is not a valid environment variable name")
        if not isinstance(value, str):
            raise TypeError(f"env[{key!r}] must be a string, not {_type_name(value)} {value!r}")
        if "\0" in value:  # execve cannot carry it: the workers would fail after Ray started
            raise ValueError(f"env[{key!r}] contains a NUL character, which no environment variable can hold")
        if key in reserved or key.startswith(reserved_prefixes):
            raise ValueError(
                f"env[{key!r}]: raydist sets {key} on every rank from where the workers run; "
                "choose the world with num_workers / resources_per_worker instead"
            )
    return dict(env)


def _std_code(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where} must be a stream code ({_STD_CODES}), not {_type_name(value)} {value!r}")
    if not STD_NONE <= value <= STD_ALL:
        raise ValueError(f"{where} must be a stream code ({_STD_CODES}), got {value}")
    return value


def parse_std(name: str, value: Any) -> StdSpec:
    """torchrun's value for -r/--redirects and -t/--tee: one stream code for
    every local rank (``3``, ``"3"``) or codes per local rank
    (``{0: 1, 1: 2}``, ``"0:1,1:2"``; local ranks not named get 0)."""
    if isinstance(value, str):
        text = value.strip()
        if _STD_ONE.match(text):
            return int(text)
        if not _STD_PER_RANK.match(text):
            raise ValueError(
                f"{name} {value!r} is neither a stream code ({_STD_CODES}) nor "
                "LOCAL_RANK:CODE pairs such as '0:1,1:2'"
            )
        pairs = [pair.split(":") for pair in text.split(",")]
        ranks = [int(rank) for rank, _ in pairs]
        twice = sorted({rank for rank in ranks if ranks.count(rank) > 1})
        if twice:  # a dict would keep the last one silently
            raise ValueError(f"{name} {value!r} gives local rank {twice[0]} more than once")
        value = {int(rank): int(code) for rank, code in pairs}
    if isinstance(value, Mapping):
        codes: Dict[int, int] = {}
        for rank, code in value.items():
            _check_int(f"{name} key", rank, 0)
            codes[rank] = _std_code(f"{name}[{rank}]", code)
        return codes
    return _std_code(name, value)


def parse_local_ranks(name: str, value: Any) -> Optional[Tuple[int, ...]]:
    """torchrun's --local-ranks-filter: ``"0,1"``, an int or a collection of
    ints; sorted, each once. Empty means no filter, as under torchrun."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            items = [int(part) for part in value.split(",")] if value.strip() else []
        except ValueError:
            raise ValueError(f"{name} must be comma-separated local ranks such as '0,1', got {value!r}") from None
    elif isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, (list, tuple, set, frozenset, range)):
        items = list(value)
    else:
        raise TypeError(f"{name} must be local ranks such as '0,1' or {{0, 1}}, not {_type_name(value)} {value!r}")
    for item in items:
        _check_int(f"{name} entry", item, 0)
    twice = sorted({item for item in items if items.count(item) > 1})
    if twice:  # most likely a typo for another rank
        raise ValueError(f"{name} names local rank {twice[0]} more than once, in {value!r}")
    return tuple(sorted(set(items))) or None


def check_log_dir(value: Any) -> str:
    """A directory to create (or reuse) for per-rank logs; not an existing file."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"log_dir must be a directory path, not {_type_name(value)} {value!r}")
    path = os.fspath(value)
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"log_dir must name a directory, got {value!r}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"log_dir {path!r} exists and is not a directory")
    return path


def check_state_dir(value: Any) -> str:
    """A directory for committed save_state steps: a local path, not an existing file."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"state_dir must be a directory path, not {_type_name(value)} {value!r}")
    path = os.fspath(value)
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"state_dir must name a directory, got {value!r}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"state_dir {path!r} exists and is not a directory")
    return os.path.abspath(path)


# Ray's label syntax (Kubernetes'): a name, an optional DNS-subdomain prefix for keys.
_LABEL_NAME = r"[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
_LABEL_KEY = re.compile(rf"^({_LABEL_NAME}(\.{_LABEL_NAME})*/)?{_LABEL_NAME}$")
# A selector value in Ray's forms: "v", "!v", "in(v1,v2)", "!in(v1,v2)".
_LABEL_CONDITION = re.compile(rf"^!?(in\(\s*{_LABEL_NAME}(\s*,\s*{_LABEL_NAME})*\s*\)|{_LABEL_NAME})$")
NODE_ID_LABEL = "ray.io/node-id"  # Ray's own label of every node
# torchrun's --numa-binding modes (torch.numa.binding.AffinityMode).
NUMA_BINDING_MODES: Tuple[str, ...] = ("node", "socket", "exclusive", "core-complex")
_NODE_ID_PREFIX = re.compile(r"^[0-9a-fA-F]{8,}$")


def split_outside_parentheses(text: str) -> List[str]:
    """``"a=in(x,y),b=z"`` -> ``["a=in(x,y)", "b=z"]``: commas inside ``in(...)`` stay."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [part.strip() for part in parts + [current] if part.strip()]


def check_label_selector(value: Any) -> Dict[str, str]:
    """Ray's label selector: ``{"zone": "a", "pool": "!in(spot,preemptible)"}``
    or the same as ``"zone=a,pool=!in(spot,preemptible)"``."""
    if isinstance(value, str):
        pairs = [part.partition("=") for part in split_outside_parentheses(value)]
        bad = ["".join(pair) for pair in pairs if not pair[1] or not pair[0].strip()]
        if bad:
            raise ValueError(f"label_selector entry {bad[0]!r} is not KEY=VALUE (e.g. zone=a, zone=!a, zone=in(a,b))")
        value = {key.strip(): condition.strip() for key, _, condition in pairs}
    if not isinstance(value, Mapping):
        raise TypeError(f"label_selector must be a mapping such as {{'zone': 'a'}} or 'zone=a', not {_type_name(value)}")
    for key, condition in value.items():
        if not isinstance(key, str) or not _LABEL_KEY.match(key):
            raise ValueError(f"label_selector key {key!r} is not a Ray label key (such as 'zone' or 'example.com/pool')")
        if not isinstance(condition, str) or not _LABEL_CONDITION.match(condition.strip()):
            raise ValueError(
                f"label_selector[{key!r}]={condition!r} is not one of Ray's forms: "
                "VALUE, !VALUE, in(V1,V2,...), !in(V1,V2,...)"
            )
    # Ray's placement takes "in(a,b)" but never places a bundle whose selector reads "in(a, b)".
    return {key: re.sub(r"\s+", "", condition) for key, condition in value.items()}


def check_exclude_nodes(value: Any) -> Tuple[str, ...]:
    """Nodes to leave out: Ray node ids (or their first 8+ characters) or IPs;
    a comma-separated string or a collection."""
    items = [part.strip() for part in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise TypeError(f"exclude_nodes must be node ids or IPs such as ['10.0.0.5'], not {_type_name(value)}")
    checked = []
    for item in items:
        if not isinstance(item, str) or not (_NODE_ID_PREFIX.match(item) or _is_ip(item)):
            raise ValueError(
                f"exclude_nodes entry {item!r} is neither a Ray node id (at least its first 8 "
                "characters) nor an IP address"
            )
        checked.append(item.lower() if _NODE_ID_PREFIX.match(item) else item)
    return tuple(dict.fromkeys(checked))


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _check_node_range(value: Any) -> Union[int, Tuple[int, int]]:
    """num_nodes: N, or (min, max) for an elastic number of whole nodes."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"num_nodes as a range is (min, max), got {value!r}")
        _check_int("num_nodes min", value[0], 1)
        _check_int("num_nodes max", value[1], 1)
        if value[1] < value[0]:
            raise ValueError(f"num_nodes=(min, max) needs min <= max, got {tuple(value)!r}")
        return value[0] if value[0] == value[1] else (value[0], value[1])
    _check_int("num_nodes", value, 1)
    return int(value)


# -- the command line's side of each option ----------------------------------
#
# A RunConfig field that ``raydist run`` exposes carries a ``CliFlag`` in its
# metadata (under CLI): cli.py generates the flag from it. A new option the
# CLI exposes is therefore one field here (+ the code using it + a README row).

CLI = "raydist.cli"


@dataclass(frozen=True)
class CliFlag:
    """How ``raydist run`` spells and reads one RunConfig option."""

    flags: Tuple[str, ...]  # every spelling, torchrun's underscore aliases included
    help: str  # "{default}" is replaced with the option's default
    parse: Optional[Callable[[str], Any]] = None  # argparse type: text -> value (RunConfig checks it)
    metavar: Optional[str] = None
    action: Optional[str] = None  # argparse action: "store_true", "append"
    choices: Optional[Tuple[str, ...]] = None
    to_option: Optional[Callable[[Any], Any]] = None  # parsed flag value -> option value
    # False: the option comes from CLI-only flags (num_workers from -n and
    # --nnodes); ``flag`` still names it in messages.
    generated: bool = True

    @property
    def flag(self) -> str:
        """The spelling that messages use: the first long one."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])

    def help_for(self, default: Any) -> str:
        return self.help.format(default=default)


def cli(*flags: str, help: str, **kwargs: Any) -> Dict[str, CliFlag]:
    """A field's metadata for its ``raydist run`` flag."""
    return {CLI: CliFlag(flags=flags, help=help, **kwargs)}


def _converter(kind: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """An argparse type that only converts (RunConfig checks the value)."""

    def parse(value: str) -> Any:
        try:
            return kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None

    return parse


parse_int = _converter(int, "a whole number")
parse_seconds = _converter(float, "a number of seconds")


def parse_resources(value: str) -> Dict[str, Any]:
    """``--resources-per-worker``'s JSON object."""
    try:
        resources = json.loads(value)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {value!r}") from None
    if not isinstance(resources, dict):
        raise argparse.ArgumentTypeError(f'expected a JSON object such as \'{{"CPU": 2}}\', got {value!r}')
    return resources


def parse_env_pair(value: str) -> Tuple[str, str]:
    """One ``--env KEY=VALUE``."""
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key, val


def _signal_or_none(value: str) -> Optional[str]:
    return None if value.lower() == "none" else value


# The CLI flag of each option (see cli()); kept beside the class so that the
# option table reads one line per option.
_NUM_WORKERS_FLAG = cli("--nproc-per-node", help="set by -n/--nproc-per-node", generated=False)
_NUM_NODES_FLAG = cli("--nnodes", help="set by --nnodes", generated=False)
_WORKERS_PER_NODE_FLAG = cli("--nproc-per-node", help="set by -n/--nproc-per-node with --nnodes", generated=False)
_ACCELERATOR_FLAG = cli(
    "--accelerator", parse=str.lower, choices=ACCELERATOR_CHOICES,
    help=f"device per worker: 'auto' ({auto_help()}) or one kind: {kinds_help()}; default: {{default}}",
)
_RESOURCES_PER_WORKER_FLAG = cli(
    "--resources-per-worker", parse=parse_resources, metavar="JSON",
    help='Ray resources per worker as a JSON object, e.g. \'{{"CPU": 4}}\', \'{{"GPU": 2}}\' '
    "(two GPUs per worker: LOCAL_RANK stays the local rank, raydist.get_context().device_index "
    'names the first of them) or \'{{"GPU": 0.5}}\' (two workers share a GPU). Default: 1 CPU '
    "plus 1 device",
)
_BACKEND_FLAG = cli(
    "--backend", metavar="NAME",
    help="initialise torch.distributed with this backend (gloo, nccl, hccl, ...) or "
    "'horovod' (or an installed plugin's) before the script starts, for scripts that expect "
    "an initialised process group (raydist.init_distributed() and raydist.compat reuse it; a "
    "direct dist.init_process_group() call would fail). Default: leave initialization to the "
    "script, as torchrun does",
)
_ENV_FLAG = cli(
    "--env", parse=parse_env_pair, action="append", metavar="KEY=VALUE", to_option=dict,
    help="set an environment variable on every worker (repeatable); workers on a "
    "remote cluster do not inherit this shell's environment",
)
_PLACEMENT_STRATEGY_FLAG = cli(
    "--placement-strategy", "--placement_strategy", parse=str.upper, choices=PLACEMENT_STRATEGIES,
    metavar="STRATEGY",
    help=f"Ray placement group strategy, one of {', '.join(PLACEMENT_STRATEGIES)} "
    "(default: {default}); not with --nnodes, which places one bundle per node (STRICT_SPREAD)",
)
_TIMEOUT_FLAG = cli(
    "--timeout", parse=parse_seconds, metavar="SECONDS",
    help="stop the run and fail if the script has not finished on every rank after "
    "this many seconds (default: no limit)",
)
_STARTUP_TIMEOUT_FLAG = cli(
    "--startup-timeout", parse=parse_seconds, metavar="SECONDS",
    help="how long to wait for the cluster to answer, for a busy or autoscaling cluster to "
    "provide the workers, and for them to initialise (default {default:g}); a request the "
    "cluster can never meet fails at once",
)
_MAX_RESTARTS_FLAG = cli(
    "--max-restarts", "--max_restarts", parse=parse_int, metavar="K",
    help="after a failure (a rank raises, exits non-zero or dies), restart the "
    "group and rerun the script, up to K times, as torchrun does (in fresh processes "
    "unless --restart-mode warm) "
    "(default {default}); TORCHELASTIC_RESTART_COUNT tells the script which attempt it is",
)
_ADDRESS_FLAG = cli(
    "--address", metavar="ADDRESS",
    help="Ray cluster to run on: its GCS address HOST:PORT (port 6379 by default), "
    "ray://HOST:PORT for Ray Client, or 'auto'. Default: RAY_ADDRESS if set (as "
    "inside `ray job submit`), else the cluster started with `ray start` on this "
    "machine, else a private local Ray (no dashboard) that stops when the run ends",
)
_PG_TIMEOUT_FLAG = cli(
    "--pg-timeout", parse=parse_seconds, metavar="SECONDS",
    help="how long a collective may wait before the process group fails it (torch's "
    "init_process_group timeout); applies with --backend, where raydist initialises the group",
)
_LOG_DIR_FLAG = cli(
    "--log-dir", "--log_dir", metavar="DIR",
    help="directory for per-rank log files, laid out as torchrun does: "
    "DIR/<run id>_<random>/attempt_<k>/<rank>/stdout.log and stderr.log, one attempt_<k> per "
    "restart. Written on this machine (the driver's), for every rank on every node",
)
_REDIRECTS_FLAG = cli(
    "-r", "--redirects", metavar="CODES",
    help="send streams to the log files instead of the console: 0 none, 1 stdout, 2 stderr, "
    "3 both, for every local rank (-r 3) or per local rank (-r 0:1,1:2); without --log-dir "
    "the files go to a new temporary directory (default {default})",
)
_TEE_FLAG = cli(
    "-t", "--tee", metavar="CODES",
    help="send streams to the log files and the console (codes as for --redirects; default {default})",
)
_LOCAL_RANKS_FILTER_FLAG = cli(
    "--local-ranks-filter", "--local_ranks_filter", metavar="RANKS",
    help="only these local ranks reach the console, e.g. 0 or 0,1 (their log files are "
    "written all the same). TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE ('[${{rank}}]:', with "
    "${{rank}}, ${{local_rank}}, ${{role_name}}) replaces the '(rank=N pid=P)' prefix of console lines",
)
_RESTART_TO_GROW_FLAG = cli(
    "--restart-to-grow", action="store_true",
    help="with --nnodes MIN:MAX: when the cluster can host more of the run's workers (a "
    "node joined), stop the workers and restart with more, as torchrun's elastic agent does "
    "on a membership change (not counted against --max-restarts)",
)
_PREEMPTION_SIGNAL_FLAG = cli(
    "--preemption-signal", metavar="SIGNAL", to_option=_signal_or_none,
    help="signal sent at once to the ranks on a node Ray starts draining (spot preemption, "
    "`ray drain-node`); the script reads the deadline with raydist.preemption_requested(); "
    "'none' for no signal (default: {default})",
)
_LABEL_SELECTOR_FLAG = cli(
    "--label-selector", "--label_selector", metavar="KEY=VALUE[,...]",
    help="run only on Ray nodes whose labels match, in Ray's forms: zone=a, zone=!a, "
    "zone=in(a,b), zone=!in(a,b); several conditions separated by commas all apply",
)
_ACCELERATOR_TYPE_FLAG = cli(
    "--accelerator-type", "--accelerator_type", metavar="TYPE",
    help="run only on nodes with this accelerator type, as Ray names it (H100, A100, L4, ...: "
    "the node's accelerator_type:TYPE resource)",
)
_EXCLUDE_NODES_FLAG = cli(
    "--exclude-nodes", "--exclude_nodes", metavar="NODE[,NODE...]",
    help="never run on these nodes: Ray node ids (or their first 8+ characters) or IP addresses",
)
_NUMA_BINDING_FLAG = cli(
    "--numa-binding", "--numa_binding", parse=str.lower, choices=NUMA_BINDING_MODES, metavar="MODE",
    help="torchrun's NUMA binding: before the script starts, bind each worker's threads to the "
    "CPUs near its GPU (torch.numa.binding's node, socket, exclusive or core-complex). Where "
    "a node gives no topology to bind by (no CUDA GPU, no NUMA information), nothing is bound "
    "and local rank 0 there prints one line saying why",
)
_VIRTUAL_LOCAL_RANK_FLAG = cli(
    "--virtual-local-rank", "--virtual_local_rank", action="store_true",
    help="as torchrun: every worker sees only its own device(s) (CUDA_VISIBLE_DEVICES and the "
    "like) and LOCAL_RANK=0, so its device is index 0",
)
_ROLE_FLAG = cli(
    "--role", metavar="ROLE",
    help="the workers' role name, as torchrun's: ROLE_NAME on every rank and ${{role_name}} "
    "in TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (default: {default})",
)
_MONITOR_INTERVAL_FLAG = cli(
    "--monitor-interval", "--monitor_interval", parse=parse_seconds, metavar="SECONDS",
    help="how often the driver looks at the cluster while the workers run (node drains, "
    "and room to grow with --restart-to-grow); worker deaths are seen at once regardless "
    "(default {default:g})",
)
_FLIGHT_RECORDER_FLAG = cli(
    "--no-flight-recorder", action="store_true", to_option=lambda given: not given,
    help="switch off torch's flight recorder in the workers (on by default, with a short "
    "buffer): without it a hang's report cannot say at which collective the ranks diverged, "
    "and no rank is named as a straggler",
)
_POST_MORTEM_FLAG = cli(
    "--post-mortem", action="store_true",
    help="keep a rank that raises alive at its exception and open pdb there (in this "
    "terminal, or through `raydist debug` from another shell); the run goes on when pdb ends",
)

_SIGNALS_TO_HANDLE_FLAG = cli(
    "--signals-to-handle", "--signals_to_handle", metavar="SIGNALS",
    help="comma-separated signals `raydist run` handles, whatever it inherited (a background "
    "job starts with SIGINT ignored), as torchrun does: each is forwarded to every rank, "
    "then after --shutdown-timeout the workers are killed and the run exits with status 1 "
    "(default: SIGTERM,SIGINT,SIGHUP,SIGQUIT; SLURM users often add SIGUSR1 or SIGUSR2). "
    "raydist.run() in Python leaves its process's signal handling alone",
)
_SHUTDOWN_TIMEOUT_FLAG = cli(
    "--shutdown-timeout", "--shutdown_timeout", parse=parse_seconds, metavar="SECONDS",
    help="after forwarding a handled signal, how long to wait for the ranks to finish "
    "(their handlers saving state) before killing them, as torchrun's option (default {default:g})",
)

_RESTART_MODE_FLAG = cli(
    "--restart-mode", parse=str.lower, choices=RESTART_MODES, metavar="MODE",
    help="warm: a restart keeps the surviving workers' processes (the process group is destroyed "
    "and the script runs again as __main__ in them; modules it imported stay imported) and "
    f"starts new ones only for the dead; fresh: every attempt in new processes, as torchrun "
    f"does (default for raydist run: {CLI_RESTART_MODE})",
)
_SPARE_WORKERS_FLAG = cli(
    "--spare-workers", parse=parse_int, metavar="K",
    help="start K extra workers ahead of time (placed, torch imported), outside the world; a "
    "dead rank's place goes to one of them at once (with --restart-mode warm) and a used one "
    "is replaced in the background (default {default})",
)
_STATE_DIR_FLAG = cli(
    "--state-dir", metavar="DIR",
    help="also write committed save_state steps to DIR (on the driver's machine) in the background, "
    "and resume from the newest one there when a new run starts; a step cut short is never loaded",
)
_STATE_KEEP_FLAG = cli(
    "--state-keep", parse=parse_int, metavar="N",
    help="committed steps kept in --state-dir (default {default})",
)
_SURVIVOR_TIMEOUT_FLAG = cli(
    "--survivor-timeout", parse=parse_seconds, metavar="SECONDS",
    help="in a warm restart, how long a surviving worker may take to return from the failed "
    "attempt before it is killed and replaced by a new process (default {default:g})",
)


@dataclass(frozen=True)
class RunConfig:
    """The options of one run. Built once (checked in ``__post_init__``), never changed.

    num_workers: ranks to start; None means one per device of the chosen kind
        in the cluster, or one per CPU slot when there are none. ``(min, max)``
        makes the group elastic: it starts with as many workers as fit (up to
        max) once min fit, and after a node loss or preemption restarts with
        the workers that fit then.
    num_nodes: with ``workers_per_node``, torchrun's layout: exactly
        ``workers_per_node`` ranks on each of ``num_nodes`` distinct nodes
        (node g holds ranks g*P ... g*P+P-1; every rank sees
        LOCAL_WORLD_SIZE=P); one placement-group bundle per node, STRICT_SPREAD
        (``placement_strategy`` does not apply). ``(min, max)``: elastic in
        whole nodes. Excludes ``num_workers``.
    workers_per_node: the ranks on each node under ``num_nodes``.
    accelerator: "auto" (GPU if the cluster has GPUs, else NPU, else HPU, else
        CPU), or one of "gpu", "xpu", "npu", "hpu", "cpu".
    resources_per_worker: Ray resources per worker, added to or overriding
        the default of 1 CPU plus 1 device, e.g. ``{"CPU": 4}``, ``{"GPU": 2}``
        or ``{"GPU": 0.5}``.
    backend: torch.distributed backend (default: the device's: nccl, hccl,
        xccl, gloo), or "horovod" to run hvd.init() instead.
    env: extra environment variables for every worker (not the launcher's own).
    placement_strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD.
    timeout: seconds a call may take; then WorkerGroupTimeout names the
        ranks that had not finished. None: no limit.
    startup_timeout: seconds to wait for the cluster to provide the workers
        and for them to initialise; a request that can never fit fails at once.
    max_restarts: rebuild the group and run again this many times after a
        worker dies (after any failure with ``retry_on_exception``).
    address: the Ray cluster to connect to when Ray is not initialised (else
        RAY_ADDRESS, else a local Ray is started).
    init_process_group: initialise torch.distributed before the function runs.
    object_store_threshold: objects at least this many bytes travel through
        Ray's object store in raydist's object collectives (None: never).
    pg_timeout: seconds the process group waits in a collective before it
        fails (torch's ``init_process_group(timeout=)``); None: torch's default.
    log_dir: directory for per-rank log files, laid out as torchrun lays them
        out (``<log_dir>/<run_id>_<random>/attempt_<k>/<rank>/stdout.log``);
        written on the driver's machine. None: a temporary directory, made
        only when ``redirects`` or ``tee`` asks for files.
    redirects: torchrun's ``-r``: streams written to the log files instead
        of the console, one code for all local ranks (0 none, 1 stdout,
        2 stderr, 3 both) or per local rank (``"0:1,1:2"``, ``{0: 1, 1: 2}``).
    tee: torchrun's ``-t``: streams written to the log files and the console
        (same codes).
    local_ranks_filter: torchrun's ``--local-ranks-filter``: only these local
        ranks reach the console (files are not filtered); None: all.
    restart_to_grow: with ``num_workers=(min, max)``, stop and restart the
        group when the cluster can host more of its workers (up to max), as
        torchrun's elastic agent does on a membership change; not counted
        against ``max_restarts``.
    preemption_signal: the signal ranks on a draining node get at once (their
        code reads the deadline with ``raydist.preemption_requested()``);
        None: no signal, only the deadline.
    label_selector: Ray node labels the workers' nodes must match, in Ray's
        forms (``{"zone": "a"}``, ``"!a"``, ``"in(a,b)"``, ``"!in(a,b)"``), or
        the same as ``"zone=a,pool=!spot"``.
    accelerator_type: only nodes with this accelerator type (Ray's
        ``accelerator_type:TYPE`` resource), e.g. "H100".
    exclude_nodes: nodes never to use: Ray node ids (or 8+ leading
        characters) or IP addresses.
    numa_binding: torchrun's ``--numa-binding`` mode (node, socket,
        exclusive, core-complex), applied in each worker before the code runs.
    virtual_local_rank: torchrun's ``--virtual-local-rank``: each worker sees
        only its own device(s), and LOCAL_RANK=0.
    role: torchrun's ``--role``: ROLE_NAME, and ``${role_name}`` in the log prefix.
    monitor_interval: seconds between the driver's looks at node drains and
        free room while a group runs.
    flight_recorder: switch torch's flight recorder on in every worker (a
        short buffer): a hang's report then says at which collective the
        ranks diverged, and a rank that reaches collectives consistently late
        is named (``WorkerGroup.stragglers()``).
    post_mortem: keep a rank that raised alive at its exception, in pdb
        (in the launching terminal, or attached with ``raydist debug``).
    signals_to_handle: the signals ``raydist run`` handles (torchrun's
        ``--signals-to-handle``): forwarded to every rank, then after
        ``shutdown_timeout`` the workers are killed. ``raydist.run()`` in
        Python leaves the process's signal handling to the program.
    shutdown_timeout: seconds to wait for the ranks after forwarding a
        signal, before they are killed (torchrun's ``--shutdown-timeout``).
    restart_mode: "warm" (the default): a restart keeps the surviving
        workers' processes (their process group destroyed and initialised
        again with the new ranks) and starts processes only for the dead;
        "fresh": every attempt in new processes, as torchrun does (the
        default of ``raydist run``).
    spare_workers: extra workers placed and started ahead of time (torch
        imported, device pinned), outside the world; a dead rank's place
        goes to one at once, and a used spare is replaced in the background.
    survivor_timeout: seconds a surviving worker's call may take to return
        after a failure before a warm restart kills it and starts a new
        process in its place.
    state_dir: a directory where committed ``save_state`` steps are also
        written (by the driver's node, in the background); a new run resumes
        from the newest one there.
    state_keep: committed steps kept in ``state_dir``.
    """

    num_workers: Union[None, int, Tuple[int, int]] = field(default=None, metadata=_NUM_WORKERS_FLAG)
    num_nodes: Union[None, int, Tuple[int, int]] = field(default=None, metadata=_NUM_NODES_FLAG)
    workers_per_node: Optional[int] = field(default=None, metadata=_WORKERS_PER_NODE_FLAG)
    accelerator: str = field(default="auto", metadata=_ACCELERATOR_FLAG)
    resources_per_worker: Mapping[str, float] = field(default_factory=dict, metadata=_RESOURCES_PER_WORKER_FLAG)
    backend: Optional[str] = field(default=None, metadata=_BACKEND_FLAG)
    env: Mapping[str, str] = field(default_factory=dict, metadata=_ENV_FLAG)
    placement_strategy: str = field(default="PACK", metadata=_PLACEMENT_STRATEGY_FLAG)
    timeout: Optional[float] = field(default=None, metadata=_TIMEOUT_FLAG)
    startup_timeout: float = field(default=300.0, metadata=_STARTUP_TIMEOUT_FLAG)
    max_restarts: int = field(default=0, metadata=_MAX_RESTARTS_FLAG)
    retry_on_exception: bool = False  # raydist run: always (torchrun restarts after any failure)
    address: Optional[str] = field(default=None, metadata=_ADDRESS_FLAG)
    init_process_group: bool = True  # raydist run: only with --backend
    object_store_threshold: Optional[int] = DEFAULT_OBJECT_STORE_THRESHOLD
    pg_timeout: Optional[float] = field(default=None, metadata=_PG_TIMEOUT_FLAG)
    log_dir: Optional[str] = field(default=None, metadata=_LOG_DIR_FLAG)
    redirects: StdSpec = field(default=STD_NONE, metadata=_REDIRECTS_FLAG)
    tee: StdSpec = field(default=STD_NONE, metadata=_TEE_FLAG)
    local_ranks_filter: Optional[Tuple[int, ...]] = field(default=None, metadata=_LOCAL_RANKS_FILTER_FLAG)
    restart_to_grow: bool = field(default=False, metadata=_RESTART_TO_GROW_FLAG)
    preemption_signal: Optional[str] = field(default="SIGTERM", metadata=_PREEMPTION_SIGNAL_FLAG)
    label_selector: Mapping[str, str] = field(default_factory=dict, metadata=_LABEL_SELECTOR_FLAG)
    accelerator_type: Optional[str] = field(default=None, metadata=_ACCELERATOR_TYPE_FLAG)
    exclude_nodes: Tuple[str, ...] = field(default=(), metadata=_EXCLUDE_NODES_FLAG)
    numa_binding: Optional[str] = field(default=None, metadata=_NUMA_BINDING_FLAG)
    virtual_local_rank: bool = field(default=False, metadata=_VIRTUAL_LOCAL_RANK_FLAG)
    role: str = field(default="default", metadata=_ROLE_FLAG)
    monitor_interval: float = field(default=1.0, metadata=_MONITOR_INTERVAL_FLAG)
    flight_recorder: bool = field(default=True, metadata=_FLIGHT_RECORDER_FLAG)
    post_mortem: bool = field(default=False, metadata=_POST_MORTEM_FLAG)
    signals_to_handle: Tuple[str, ...] = field(default=("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"), metadata=_SIGNALS_TO_HANDLE_FLAG)
    shutdown_timeout: float = field(default=30.0, metadata=_SHUTDOWN_TIMEOUT_FLAG)
    restart_mode: str = field(default="warm", metadata=_RESTART_MODE_FLAG)
    spare_workers: int = field(default=0, metadata=_SPARE_WORKERS_FLAG)
    survivor_timeout: float = field(default=10.0, metadata=_SURVIVOR_TIMEOUT_FLAG)
    state_dir: Optional[str] = field(default=None, metadata=_STATE_DIR_FLAG)
    state_keep: int = field(default=2, metadata=_STATE_KEEP_FLAG)

    def __post_init__(self) -> None:
        _check_values(self)
        _check_combinations(self)

    @property
    def warm_restarts(self) -> bool:
        return self.restart_mode == "warm"

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, tuple) or isinstance(self.num_nodes, tuple)

    @property
    def node_range(self) -> Optional[Tuple[int, int]]:
        """(min, max) nodes of ``workers_per_node`` each; None without ``num_nodes``."""
        if self.num_nodes is None:
            return None
        return self.num_nodes if isinstance(self.num_nodes, tuple) else (self.num_nodes, self.num_nodes)

    @property
    def worker_range(self) -> Optional[Tuple[int, int]]:
        """(min, max) workers; None when the size comes from the cluster."""
        nodes = self.node_range
        if nodes is not None:
            per_node = self.workers_per_node or 1
            return nodes[0] * per_node, nodes[1] * per_node
        if self.num_workers is None:
            return None
        return self.num_workers if isinstance(self.num_workers, tuple) else (self.num_workers, self.num_workers)

    @property
    def horovod(self) -> bool:
        return self.backend == "horovod"

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with ``changes`` applied (and checked)."""
        return dataclasses.replace(self, **changes)


def _set(config: RunConfig, name: str, value: Any) -> None:
    object.__setattr__(config, name, value)  # normalising inside a frozen dataclass


def _check_values(config: RunConfig) -> None:
    """Each option alone: types, ranges, spellings (normalised in place)."""
    _check_num_workers(config)
    _set(config, "accelerator", _check_choice("accelerator", config.accelerator, ACCELERATOR_CHOICES))
    _set(config, "resources_per_worker", check_resources({} if config.resources_per_worker is None else config.resources_per_worker))
    _check_devices(config)
    if config.backend is not None:
        if not isinstance(config.backend, str) or not config.backend.strip():
            raise TypeError(f"backend must be a backend name such as 'gloo' or 'horovod', not {config.backend!r}")
        _set(config, "backend", config.backend.strip().lower())
        _check_torch_backend(config.backend, config.accelerator)
    _set(config, "env", check_env({} if config.env is None else config.env))
    _set(config, "placement_strategy", _check_choice("placement_strategy", config.placement_strategy, PLACEMENT_STRATEGIES))
    if config.timeout is not None:
        _set(config, "timeout", check_seconds("timeout", config.timeout))
    _set(config, "startup_timeout", check_seconds("startup_timeout", config.startup_timeout))
    _check_int("max_restarts", config.max_restarts, 0)
    _check_bool("retry_on_exception", config.retry_on_exception)
    _check_bool("init_process_group", config.init_process_group)


# torch.distributed backends that device vendors' extensions register on import
# (not in Backend.backend_list until then): known, so not typos.
_EXTENSION_BACKENDS = frozenset(
    {row.default_backend for row in ROWS} | {row.fallback.backend for row in ROWS if row.fallback is not None}
)


# torch.distributed backends every torch build has, and those a build may lack.
_ALWAYS_BUILT = frozenset({"gloo", "fake"})
_BUILD_OPTIONS = frozenset({"nccl", "mpi", "ucc", "xccl"})


def _check_torch_backend(name: str, accelerator: str) -> None:
    """A torch.distributed backend name ("gloo", "cpu:gloo,cuda:nccl") that this
    torch knows and has, and that suits a known accelerator; other registry
    entries (horovod, plugins) are checked by their own requires."""
    if backend_entry(name).name != TORCH_BACKEND:
        return
    parts = [part.partition(":")[2] if ":" in part else part for part in name.split(",")]
    for part in parts:
        if part in _ALWAYS_BUILT or (part in _EXTENSION_BACKENDS and part not in _BUILD_OPTIONS):
            continue  # known without importing torch (the CLI stays quick for --backend gloo)
        import torch.distributed as dist

        known = (set(dist.Backend.backend_list) - {"undefined"}) | _EXTENSION_BACKENDS
        if part not in known:  # backend_list includes those torch plugins registered here
            raise ValueError(
                f"unknown backend {name!r}: not in raydist's registry nor torch.distributed's "
                f"({', '.join(sorted(known))})"
            )
        available = getattr(dist, f"is_{part}_available", None)
        if available is not None and not available():
            raise ValueError(f"backend {name!r}: this torch ({_torch_version()}) was built without {part}")
    if "nccl" in parts and accelerator == "cpu":
        raise ValueError(f"backend {name!r} needs CUDA devices but accelerator='cpu'; use backend='gloo'")


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _check_combinations(config: RunConfig) -> None:
    """Options checked together, and the rest of the per-option checks."""
    if config.backend is not None and not config.init_process_group and backend_entry(config.backend).name == TORCH_BACKEND:
        # torch.distributed's backends name what init_process_group would use;
        # another backend (horovod, a plugin) is always initialised.
        raise ValueError(f"backend={config.backend!r} has no effect with init_process_group=False")
    if config.object_store_threshold is not None:
        _check_int("object_store_threshold", config.object_store_threshold, 0)
    if config.pg_timeout is not None:
        _set(config, "pg_timeout", check_seconds("pg_timeout", config.pg_timeout))
    _check_address(config)
    if config.log_dir is not None:
        _set(config, "log_dir", check_log_dir(config.log_dir))
    _set(config, "redirects", parse_std("redirects", config.redirects))
    _set(config, "tee", parse_std("tee", config.tee))
    _set(config, "local_ranks_filter", parse_local_ranks("local_ranks_filter", config.local_ranks_filter))
    _check_bool("restart_to_grow", config.restart_to_grow)
    if config.restart_to_grow and not config.elastic:
        raise ValueError(f"restart_to_grow needs an elastic size: {ELASTIC_SIZE}")
    if config.preemption_signal is not None:
        _set(config, "preemption_signal", _check_signal(config.preemption_signal))
    _check_placement_options(config)
    if config.numa_binding is not None:
        _set(config, "numa_binding", _check_choice("numa_binding", config.numa_binding, NUMA_BINDING_MODES))
    _check_bool("virtual_local_rank", config.virtual_local_rank)
    if not isinstance(config.role, str) or not config.role.strip():
        raise TypeError(f"role must be a non-empty name, not {config.role!r}")
    _set(config, "monitor_interval", check_seconds("monitor_interval", config.monitor_interval))
    _check_bool("flight_recorder", config.flight_recorder)
    _check_bool("post_mortem", config.post_mortem)
    _set(config, "signals_to_handle", check_signals_to_handle(config.signals_to_handle))
    _set(config, "shutdown_timeout", check_seconds("shutdown_timeout", config.shutdown_timeout))
    _check_restart_options(config)


# How the API names an elastic size; the CLI (cli._as_flags) says --nnodes MIN:MAX.
ELASTIC_SIZE = "num_workers=(min, max) or num_nodes=(min, max)"


def _check_restart_options(config: RunConfig) -> None:
    """How restarts happen: warm or fresh, spares, the survivors' bound."""
    _set(config, "restart_mode", _check_choice("restart_mode", config.restart_mode, RESTART_MODES))
    _check_int("spare_workers", config.spare_workers, 0)
    _check_int("state_keep", config.state_keep, 1)
    if config.state_dir is not None:
        _set(config, "state_dir", check_state_dir(config.state_dir))
    if config.spare_workers and not config.warm_restarts:
        raise ValueError("spare_workers take dead ranks' places in warm restarts: they need restart_mode='warm'")
    if config.spare_workers and config.num_nodes is not None:
        raise ValueError(
            "spare_workers with num_nodes: a spare would have to be a whole node of workers_per_node "
            "workers to keep torchrun's layout; use num_workers with spares, or num_nodes without"
        )
    _set(config, "survivor_timeout", check_seconds("survivor_timeout", config.survivor_timeout))


def _check_placement_options(config: RunConfig) -> None:
    """num_nodes x workers_per_node, and which nodes may be used."""
    if config.num_nodes is not None:
        if config.num_workers is not None:
            raise ValueError(
                "num_workers and num_nodes exclude each other: with num_nodes the world is "
                "num_nodes x workers_per_node"
            )
        _set(config, "num_nodes", _check_node_range(config.num_nodes))
        if config.workers_per_node is None:
            raise ValueError("num_nodes needs workers_per_node (the workers on each node)")
        if config.placement_strategy != "PACK":  # the default cannot be told from a choice; any other is one
            raise ValueError(
                f"placement_strategy={config.placement_strategy!r} does not apply with num_nodes, which places "
                "one bundle per node on distinct nodes (STRICT_SPREAD)"
            )
    if config.workers_per_node is not None:
        _check_int("workers_per_node", config.workers_per_node, 1)
        if config.num_nodes is None:
            raise ValueError("workers_per_node needs num_nodes (how many nodes get that many workers)")
    _set(config, "label_selector", check_label_selector({} if config.label_selector is None else config.label_selector))
    if config.accelerator_type is not None:
        if not isinstance(config.accelerator_type, str) or not config.accelerator_type.strip() or any(
            char.isspace() for char in config.accelerator_type.strip()
        ):
            raise ValueError(f"accelerator_type must be a type name such as 'H100', got {config.accelerator_type!r}")
        if config.accelerator == "cpu":
            raise ValueError("accelerator_type names a device type but accelerator='cpu'")
        _set(config, "accelerator_type", config.accelerator_type.strip())
    _set(config, "exclude_nodes", check_exclude_nodes(config.exclude_nodes or ()))
    if config.exclude_nodes and NODE_ID_LABEL in config.label_selector:
        raise ValueError(f"label_selector names {NODE_ID_LABEL!r} and exclude_nodes is set: use one of them")


def _check_num_workers(config: RunConfig) -> None:
    value = config.num_workers
    if value is None or not isinstance(value, (tuple, list)):
        if value is not None:
            _check_int("num_workers", value, 1)
        return
    if len(value) != 2:
        raise ValueError(f"num_workers as a range is (min, max), got {value!r}")
    _check_int("num_workers min", value[0], 1)
    _check_int("num_workers max", value[1], 1)
    if value[1] < value[0]:
        raise ValueError(f"num_workers=(min, max) needs min <= max, got {tuple(value)!r}")
    _set(config, "num_workers", value[0] if value[0] == value[1] else (value[0], value[1]))


def _check_devices(config: RunConfig) -> None:
    resources = config.resources_per_worker
    if config.accelerator == "cpu":
        asked = [name for name in DEVICE_RESOURCES if resources.get(name, 0) > 0]
        if asked:
            raise ValueError(f"resources_per_worker asks for {asked[0]} but accelerator='cpu'")
        if resources and not any(resources.values()) and resources.get("CPU", 1) == 0:
            raise ValueError("resources_per_worker leaves a CPU worker with no resources at all")
    elif config.accelerator != "auto":
        resource = BY_NAME[config.accelerator].ray_resource or "CPU"
        if resources.get(resource, 1) == 0:
            raise ValueError(
                f"resources_per_worker sets {resource} to 0 but accelerator={config.accelerator!r} needs it"
            )


def _check_address(config: RunConfig) -> None:
    if config.address is None:
        return
    if not isinstance(config.address, str) or not config.address.strip():
        raise TypeError(f"address must be a Ray address such as 'HOST:6379', not {config.address!r}")
    if config.address.startswith(("http://", "https://")):
        raise ValueError(
            f"address {config.address!r} is a dashboard / job API URL; give the cluster's "
            "GCS endpoint (HOST:6379), or submit the run as a job: "
            f"ray job submit --address {config.address} -- raydist run ..."
        )


OPTION_NAMES: Tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunConfig))


def option_default(option: "dataclasses.Field[Any]") -> Any:
    """A RunConfig field's default value (a fresh one for a factory)."""
    if option.default_factory is not dataclasses.MISSING:
        return option.default_factory()
    return option.default


def cli_options() -> Tuple[Tuple["dataclasses.Field[Any]", CliFlag], ...]:
    """Every RunConfig field ``raydist run`` sets, with its flag, in field order."""
    return tuple((f, f.metadata[CLI]) for f in dataclasses.fields(RunConfig) if CLI in f.metadata)


def make_config(config: Optional[RunConfig], options: Mapping[str, Any]) -> RunConfig:
    """``config`` (or the defaults) with keyword ``options`` applied; TypeError for unknown names."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"unexpected option(s) {', '.join(map(repr, unknown))}; valid: {', '.join(OPTION_NAMES)}")
    if config is not None and not isinstance(config, RunConfig):
        raise TypeError(f"config must be a raydist.RunConfig, not {_type_name(config)}")
    return (config or RunConfig()).replace(**options) if options or config is None else config


def check_call(fn: Callable[..., Any], args: Any, kwargs: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """The call's arguments as a tuple and a dict; TypeError for what cannot run on a worker."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {_type_name(fn)}")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"fn {getattr(fn, '__name__', fn)!r} is an async function; pass a plain function")
    if inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"fn {getattr(fn, '__name__', fn)!r} is a generator function; its values would never "
            "run on the workers: return a list instead"
        )
    if isinstance(args, (str, bytes, bytearray, Mapping)) or not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list of positional arguments, not {_type_name(args)} {args!r}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise TypeError(f"kwargs must be a mapping of argument names to values, not {_type_name(kwargs)}")
    return tuple(args), dict(kwargs)


__all__ = [
    "RunConfig", "OPTION_NAMES", "CliFlag", "cli_options", "PLACEMENT_STRATEGIES",
    "make_config", "check_call", "parse_std", "parse_local_ranks", "NUMA_BINDING_MODES",
]
