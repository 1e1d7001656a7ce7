"""The options that say how a run starts, restarts and stops: time limits,
restarts, signals; each with its checks."""

from __future__ import annotations

import os
import signal
from typing import Any, Tuple

from raydist.config.flags import flag, none_share, none_word, parse_int, parse_seconds, parse_share_or_none
from raydist.config.option import Option
from raydist.config.values import at_least, check_bool, check_seconds, choice, is_number, optional, type_name
from raydist.core import state_fs

# "warm": a restart keeps the surviving workers' processes; "fresh": every attempt in new processes.
RESTART_MODES: Tuple[str, ...] = ("warm", "fresh")
# What `raydist run` uses unless --restart-mode says otherwise: torchrun's semantics.
CLI_RESTART_MODE = "fresh"

# Signals no process can handle.
_UNHANDLED_SIGNALS = ("SIGKILL", "SIGSTOP")
# raydist's own: the stack-dump signal (raydist.pool.worker.evidence.STACK_SIGNAL,
# SIGRTMIN+6; not imported: that module needs Ray).
_RAYDIST_SIGNALS = frozenset({int(signal.SIGRTMIN) + 6})


def check_fraction(name: str, value: Any) -> float:
    """A share strictly between 0 and 1."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number between 0 and 1, not {type_name(value)} {value!r}")
    if not 0 < value < 1:
        raise ValueError(f"{name} must be between 0 and 1 (exclusive), got {value!r}")
    return float(value)


def check_signal(name: str, value: Any) -> str:
    """A signal name such as "SIGTERM" or "SIGUSR1", as the signal module spells it,
    that a rank can catch and raydist does not use itself."""
    if not isinstance(value, str) or not isinstance(getattr(signal, value.upper(), None), signal.Signals):
        raise ValueError(f"{name} must be a signal name such as 'SIGTERM' or 'SIGUSR1', got {value!r}")
    text = value.upper()
    if text in _UNHANDLED_SIGNALS:
        raise ValueError(f"{name} {text} cannot be caught by a rank (no warning could reach the script)")
    if int(getattr(signal, text)) in _RAYDIST_SIGNALS:
        raise ValueError(f"{name} {text} is raydist's stack-dump signal")
    return text


def check_signals_to_handle(name: str, value: Any) -> Tuple[str, ...]:
    """torchrun's ``--signals-to-handle``: "SIGTERM,SIGINT" or a sequence of names."""
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)):
        raise TypeError(f"{name} must be signal names such as 'SIGTERM,SIGINT', not {type_name(value)} {value!r}")
    checked = []
    for item in names:
        text = item.strip().upper() if isinstance(item, str) else item
        if not isinstance(text, str) or not isinstance(getattr(signal, text, None), signal.Signals) or text in ("SIG_DFL", "SIG_IGN"):
            raise ValueError(f"{name}: {item!r} is not a signal name such as 'SIGTERM'")
        if text in _UNHANDLED_SIGNALS:
            raise ValueError(f"{name}: {text} cannot be handled by any process")
        checked.append(text)
    return tuple(dict.fromkeys(checked))


TIMEOUT = Option(
    None,
    check=optional(check_seconds),
    doc="seconds a call may take; then WorkerGroupTimeout names the ranks that had not finished. None: no limit.",
    flag=flag(
        "--timeout",
        parse=parse_seconds,
        metavar="SECONDS",
        help="stop the run and fail if the script has not finished on every rank after this many seconds (default: no limit)",
    ),
)
HANG_TIMEOUT = Option(
    None,
    check=optional(check_seconds),
    doc="seconds ranks may fail to reach a collective the others wait in before raydist kills "
    "them: their death is then a failure like any other (a warm restart puts a spare or a new "
    "process in their place, within ``max_restarts``), named as a hang. None: only reported, "
    "when the call fails. Needs the flight recorder.",
    flag=flag(
        "--hang-timeout",
        parse=parse_seconds,
        metavar="SECONDS",
        help="replace ranks that have not reached a collective the others entered for this many "
        "seconds (killed and restarted as a failure, within --max-restarts), instead of waiting "
        "for the process group's timeout (default: only report where they hung)",
    ),
)
# What a run does with a rank the straggler watch names slow: "report" it (the
# default: a warning, the summary), or "replace" it with a spare on another node.
STRAGGLER_ACTIONS: Tuple[str, ...] = ("report", "replace")
STRAGGLER_ACTION = Option(
    "report",
    check=choice(STRAGGLER_ACTIONS),
    doc='"report" (the default): a rank that reaches collectives consistently late is named in '
    'a warning and the run\'s summary; "replace": once it has been late by at least '
    "``straggler_threshold`` for ``straggler_windows`` windows in a row, it is killed and a "
    "ready spare on another node takes its place in a warm restart (not counted against "
    "``max_restarts``); its node hosts no rank for the rest of the run. Needs ``spare_workers`` "
    "and the flight recorder.",
    flag=flag(
        "--straggler-action",
        parse=str.lower,
        choices=STRAGGLER_ACTIONS,
        metavar="ACTION",
        help="report: name a rank that reaches collectives consistently late (default); replace: "
        "once it stays late for --straggler-windows windows, put a spare on another node in its "
        "place (a warm restart, not counted against --max-restarts; it needs a spare worker)",
    ),
)
STRAGGLER_THRESHOLD = Option(
    0.05,
    check=check_seconds,
    doc='with ``straggler_action="replace"``: the median lateness, in seconds, over a window of '
    "collectives at which a named straggler counts toward its replacement (a rank is named from "
    "10 ms on; a replacement costs a warm restart, so only a larger lag pays for one).",
    flag=flag(
        "--straggler-threshold",
        parse=parse_seconds,
        metavar="SECONDS",
        help="with --straggler-action replace: how late (median over a window of collectives) a "
        "straggler must be to count toward its replacement (default {default:g})",
    ),
)
STRAGGLER_WINDOWS = Option(
    3,
    check=at_least(1),
    doc='with ``straggler_action="replace"``: how many windows of collectives in a row (each '
    "window new collectives, 20 of them) a rank must be late by ``straggler_threshold`` before "
    "it is replaced: one slow window (a checkpoint, a page fault) replaces no one.",
    flag=flag(
        "--straggler-windows",
        parse=parse_int,
        metavar="N",
        help="with --straggler-action replace: windows of 20 collectives in a row a straggler must "
        "stay late before it is replaced (default {default})",
    ),
)
# The pre-flight health check: "auto" is "quick" on accelerators and "off" on CPUs.
HEALTH_CHECKS: Tuple[str, ...] = ("auto", "off", "quick", "thorough")
HEALTH_CHECK = Option(
    "auto",
    check=choice(HEALTH_CHECKS),
    doc="the pre-flight check of each new worker before it hosts a rank (the first world, spares, "
    "replacements): it times a matrix multiply on its device and, on an accelerator, checks a "
    "block of its memory; where raydist initialises the process group, the world times a checked "
    "all_reduce. A worker whose probe fails or whose figure falls below ``health_threshold`` x the "
    "median is unhealthy: its node hosts no rank for the rest of the run, a spare takes its place "
    '(an elastic world shrinks), else the run fails before any user code. "quick" (milliseconds), '
    '"thorough" (larger probes, most of the free device memory), "off"; "auto" (the default): '
    '"quick" on accelerators torch can see, "off" on CPU workers, which share cores with each other.',
    flag=flag(
        "--health-check",
        parse=str.lower,
        choices=HEALTH_CHECKS,
        metavar="MODE",
        help="probe each new worker before it hosts a rank (a timed matrix multiply, a device memory "
        "check, a checked all_reduce) and keep ranks off nodes that fail or fall below "
        "--health-threshold x the median: quick, thorough, off, or auto (quick on accelerators, off "
        "on CPUs; the default)",
    ),
)
HEALTH_THRESHOLD = Option(
    0.5,
    check=check_fraction,
    doc="with the health check: the share of the median compute figure below which a worker is unhealthy.",
    flag=flag(
        "--health-threshold",
        parse=float,
        metavar="SHARE",
        help="with --health-check: a worker slower than this share of the median is unhealthy (default {default:g})",
    ),
)
STARTUP_TIMEOUT = Option(
    300.0,
    check=check_seconds,
    doc="seconds to wait for the cluster to provide the workers and for them to initialise; a request that can never fit fails at once.",
    flag=flag(
        "--startup-timeout",
        parse=parse_seconds,
        metavar="SECONDS",
        help="how long to wait for the cluster to answer, for a busy or autoscaling cluster to "
        "provide the workers, and for them to initialise (default {default:g}); a request the "
        "cluster can never meet fails at once",
    ),
)
MAX_RESTARTS = Option(
    0,
    check=at_least(0),
    doc="rebuild the group and run again this many times after a worker dies (after any failure with ``retry_on_exception``).",
    flag=flag(
        "--max-restarts",
        "--max_restarts",
        parse=parse_int,
        metavar="K",
        help="after a failure (a rank raises, exits non-zero or dies), restart the "
        "group and rerun the script, up to K times, as torchrun does (in fresh processes "
        "unless --restart-mode warm) "
        "(default {default}); TORCHELASTIC_RESTART_COUNT tells the script which attempt it is",
    ),
)
RETRY_ON_EXCEPTION = Option(
    False,
    check=check_bool,  # raydist run: always (torchrun restarts after any failure)
    doc="count a raised exception as restartable too.",
)
RESTART_TO_GROW = Option(
    False,
    check=check_bool,
    doc="with ``num_workers=(min, max)``, stop and restart the group when the cluster can host "
    "more of its workers (up to max), as torchrun's elastic agent does on a membership change; "
    "not counted against ``max_restarts``.",
    flag=flag(
        "--restart-to-grow",
        action="store_true",
        help="with --nnodes MIN:MAX: when the cluster can host more of the run's workers (a "
        "node joined), stop the workers and restart with more, as torchrun's elastic agent does "
        "on a membership change (not counted against --max-restarts)",
    ),
)
PREEMPTION_SIGNAL = Option(
    "SIGTERM",
    check=optional(check_signal),
    doc="the signal ranks on a draining node get at once (their code reads the deadline with "
    "``raydist.preemption_requested()``); None: no signal, only the deadline.",
    flag=flag(
        "--preemption-signal",
        metavar="SIGNAL",
        to_option=none_word,
        help="signal sent at once to the ranks on a node Ray starts draining (spot preemption, "
        "`ray drain-node`); the script reads the deadline with raydist.preemption_requested(); "
        "'none' for no signal (default: {default})",
    ),
)
MONITOR_INTERVAL = Option(
    1.0,
    check=check_seconds,
    doc="seconds between the driver's looks at node drains and free room while a group runs.",
    flag=flag(
        "--monitor-interval",
        "--monitor_interval",
        parse=parse_seconds,
        metavar="SECONDS",
        help="how often the driver looks at the cluster while the workers run (node drains, "
        "and room to grow with --restart-to-grow); worker deaths are seen at once regardless "
        "(default {default:g})",
    ),
)
SIGNALS_TO_HANDLE = Option(
    ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"),
    check=check_signals_to_handle,
    doc="the signals ``raydist run`` handles (torchrun's ``--signals-to-handle``): forwarded to "
    "every rank, then after ``shutdown_timeout`` the workers are killed. ``raydist.run()`` in "
    "Python leaves the process's signal handling to the program.",
    flag=flag(
        "--signals-to-handle",
        "--signals_to_handle",
        metavar="SIGNALS",
        help="comma-separated signals `raydist run` handles, whatever it inherited (a background "
        "job starts with SIGINT ignored), as torchrun does: each is forwarded to every rank, "
        "then after --shutdown-timeout the workers are killed and the run exits with status 1 "
        "(default: SIGTERM,SIGINT,SIGHUP,SIGQUIT; SLURM users often add SIGUSR1 or SIGUSR2). "
        "raydist.run() in Python leaves its process's signal handling alone",
    ),
)
SHUTDOWN_TIMEOUT = Option(
    30.0,
    check=check_seconds,
    doc="seconds to wait for the ranks after forwarding a signal, before they are killed (torchrun's ``--shutdown-timeout``).",
    flag=flag(
        "--shutdown-timeout",
        "--shutdown_timeout",
        parse=parse_seconds,
        metavar="SECONDS",
        help="after forwarding a handled signal, how long to wait for the ranks to finish "
        "(their handlers saving state) before killing them, as torchrun's option (default {default:g})",
    ),
)
RESTART_MODE = Option(
    "warm",
    check=choice(RESTART_MODES),
    doc='"warm" (the default): a restart keeps the surviving workers\' processes (their process '
    "group destroyed and initialised again with the new ranks) and starts processes only for the "
    'dead; "fresh": every attempt in new processes, as torchrun does (the default of '
    "``raydist run``).",
    flag=flag(
        "--restart-mode",
        parse=str.lower,
        choices=RESTART_MODES,
        metavar="MODE",
        help="warm: a restart keeps the surviving workers' processes (the process group is destroyed "
        "and the script runs again as __main__ in them; modules it imported stay imported) and "
        "starts new ones only for the dead; fresh: every attempt in new processes, as torchrun "
        f"does (default for raydist run: {CLI_RESTART_MODE})",
    ),
)
SPARE_WORKERS = Option(
    0,
    check=at_least(0),
    doc="extra workers placed and started ahead of time (torch imported, device pinned), outside "
    "the world; a dead rank's place goes to one at once, and a used spare is replaced in the "
    "background.",
    flag=flag(
        "--spare-workers",
        parse=parse_int,
        metavar="K",
        help="start K extra workers ahead of time (placed, torch imported), outside the world; a "
        "dead rank's place goes to one of them at once (with --restart-mode warm) and a used one "
        "is replaced in the background (default {default})",
    ),
)
RUN_AHEAD = Option(
    False,
    check=check_bool,
    doc="with warm restarts: spares, and kept processes after a failure, run the call's function "
    "ahead, before they have a rank, up to its first ``load_state``, and park there; joining the "
    "next world, they only load the state and go on (imports done, model built). The function must "
    "not need its rank, process group or data before ``load_state``; one that raises there runs "
    "again from the top. ``raydist.run`` and ``raydist run`` only (their call is sent again after a restart).",
    flag=flag(
        "--run-ahead",
        action="store_true",
        help="with --restart-mode warm: spares, and kept processes after a failure, run the script "
        "ahead up to its first raydist.load_state() and wait there, so that a restart only loads "
        "the state (nothing before that call may need the rank or the process group; a script "
        "that does runs again from the top)",
    ),
)
SURVIVOR_TIMEOUT = Option(
    10.0,
    check=check_seconds,
    doc="seconds a surviving worker's call may take to return after a failure before a warm "
    "restart kills it and starts a new process in its place.",
    flag=flag(
        "--survivor-timeout",
        parse=parse_seconds,
        metavar="SECONDS",
        help="in a warm restart, how long a surviving worker may take to return from the failed "
        "attempt before it is killed and replaced by a new process (default {default:g})",
    ),
)


def check_state_dir(name: str, value: Any) -> str:
    """A directory for committed save_state steps: a local path (not an existing file)
    or a filesystem URI whose scheme pyarrow or fsspec can open here (not contacted yet)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a directory path or URI, not {type_name(value)} {value!r}")
    path = os.fspath(value)
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{name} must name a directory, got {value!r}")
    try:
        location = state_fs.check_location(path)
    except (ValueError, ImportError) as error:
        raise type(error)(f"{name} {error}") from None
    if state_fs.is_local(location) and os.path.isfile(state_fs.local_path(location)):
        raise ValueError(f"{name} {path!r} exists and is not a directory")
    return location


STATE_DIR = Option(
    None,
    check=optional(check_state_dir),
    doc="a directory or filesystem URI (``file://``, ``s3://``, ``gs://``, ...) where committed "
    "``save_state`` steps are also written (by the driver's node, in the background); a new run "
    "resumes from the newest one there.",
    flag=flag(
        "--state-dir",
        metavar="DIR|URI",
        help="also write committed save_state steps to DIR (on the driver's machine) or a pyarrow/fsspec URI "
        "(s3://bucket/path, gs://..., file:///dir) in the background, "
        "and resume from the newest one there when a new run starts; a step cut short is never loaded",
    ),
)
STATE_OVERHEAD = Option(
    0.05,
    check=optional(check_fraction),
    doc="the share of the training loop's time that sending ``save_state`` steps may cost, as measured "
    "at each save: a rank that saves more often than that sends only some of the steps (the committed "
    "step trails further). None: every step it can, as soon as the last one is committed.",
    flag=flag(
        "--state-overhead",
        parse=parse_share_or_none,
        to_option=none_share,
        metavar="SHARE",
        help="the share of the loop's time sending save_state steps may cost, as measured; saved more often, "
        "only some steps are sent; 'none': every step it can (default {default:g})",
    ),
)
STATE_KEEP = Option(
    2,
    check=at_least(1),
    doc="committed steps kept in ``state_dir``.",
    flag=flag(
        "--state-keep",
        parse=parse_int,
        metavar="N",
        help="committed steps kept in --state-dir (default {default})",
    ),
)
