"""Pure rules that turn a dead or hung worker's evidence into words: how a
process ended (from its last stderr lines and exit note) and where every
rank is (faulthandler stacks grouped by location, the odd ones out marked)."""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from raydist.pool.rules.text import ranks_text

# faulthandler's first line for each fatal signal it catches.
_FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}

# How explain_death says a rank's node went away (the restart policy reads it).
NODE_LOST_TEXT = "its node died or left the cluster"
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')

# Frames that are raydist's or Ray's own machinery around the user's call.
_MACHINERY = (os.sep + "ray" + os.sep, os.path.join("raydist", "pool") + os.sep, os.sep + "runpy.py", "<frozen runpy>")

# What a rank that runs no call reads as in group.stacks() and in a timeout's report.
IDLE_TEXT = "idle (no call running)"
_EXECUTE_FILE = os.path.join("worker", "actor.py")  # raydist's RayWorker.execute runs every call
_THREADING = os.sep + "threading.py"
# raydist's own code, where its background threads start.
_RAYDIST_CODE = (os.path.join("raydist", "pool") + os.sep, os.path.join("raydist", "core") + os.sep)

_COLLECTIVE_FILES = (
    os.path.join("torch", "distributed") + os.sep,
    os.sep + "horovod" + os.sep,
    os.path.join("raydist", "core", "collectives.py"),
)


def explain_death(ray_text: str, tail: Optional[str], exit_code: Optional[int], node_alive: bool) -> str:
    """One line on how a worker process ended, from what it left behind."""
    if exit_code is not None and exit_code < 0:
        return f"killed by {_signal_name(-exit_code)} (a signal from outside the run)"
    if exit_code is not None:
        return f"exited with status {exit_code} (os._exit)"
    for marker, name in _FATAL_SIGNALS.items():
        # Python's faulthandler and Ray's own handler both name the signal.
        if tail and (f"Fatal Python error: {marker}" in tail or f"*** {name} received" in tail):
            return f"killed by {name} ({marker.lower()})"
    if "running low on memory" in ray_text or "OutOfMemoryError" in ray_text:
        return "killed by Ray's memory monitor (OOM: the node ran low on memory)"
    if not node_alive:
        return NODE_LOST_TEXT
    return "killed without an exit status or crash report: SIGKILL (or SIGTERM) from outside, or the kernel's OOM killer"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class StackSummary:
    """The part of one rank's stack that says where it is."""

    where: str  # "in all_reduce at train.py:88"
    frames: Tuple[str, ...]  # the user's frames, outermost first
    in_collective: bool  # waiting for the other ranks


def summarize_stack(dump: str) -> StackSummary:
    """The stack of the thread running the user's call, from a faulthandler
    dump; ``IDLE_TEXT`` for a rank that runs no call (raydist's own threads,
    and Ray's idle task loop, say nothing of where the rank is)."""
    threads = [thread for thread in _threads(dump) if not _raydist_thread(thread)]
    # The call runs under raydist's execute; a thread cut short at faulthandler's
    # frame limit may hide it (a deep recursion in the user's code).
    running = [t for t in threads if _runs_the_call(t)] or [t for t in threads if t.truncated]
    if not running:
        return StackSummary(IDLE_TEXT, (), False)
    frames = list(reversed(running[0].frames))
    while frames and any(m in frames[0][0] for m in _MACHINERY):
        frames.pop(0)
    if not frames:
        return StackSummary("(no Python frames)", (), False)
    innermost = frames[-1]
    user = [f for f in frames if not _is_library(f[0])]
    where = f"in {innermost[2]} at {os.path.basename(innermost[0])}:{innermost[1]}"
    if user and user[-1] is not innermost:  # the user's line that led there
        where += f", from {user[-1][2]} at {os.path.basename(user[-1][0])}:{user[-1][1]}"
    lines = tuple(f'File "{file}", line {line}, in {func}' for file, line, func in frames)
    return StackSummary(where, lines, any(c in f[0] for f in frames for c in _COLLECTIVE_FILES))


@dataclass(frozen=True)
class _Thread:
    frames: Tuple[Tuple[str, int, str], ...]  # (file, line, function), the most recent call first, as faulthandler lists them
    truncated: bool  # faulthandler stopped at its frame limit: the outermost frames are missing


def _threads(dump: str) -> List[_Thread]:
    found: List[Tuple[List[Tuple[str, int, str]], bool]] = []  # each thread's frames, and whether they were cut short
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            found.append(([], False))
            continue
        match = _FRAME.match(line)
        if match and found:
            found[-1][0].append((match["file"], int(match["line"]), match["func"]))
        elif line.strip() == "..." and found:  # faulthandler's mark for a stack past its frame limit
            found[-1] = (found[-1][0], True)
    return [_Thread(tuple(frames), truncated) for frames, truncated in found if frames]


def _runs_the_call(thread: _Thread) -> bool:
    return any(file.endswith(_EXECUTE_FILE) and func == "execute" for file, _, func in thread.frames)


def _raydist_thread(thread: _Thread) -> bool:
    """One of raydist's own background threads (the diagnostics socket,
    save_state's sender and loader, ...): a thread started by ``threading``
    with raydist's code as its target (its outermost frame past threading's)."""
    if thread.truncated or not thread.frames[-1][0].endswith(_THREADING) or _runs_the_call(thread):
        return False
    target = next((file for file, _, _ in reversed(thread.frames) if not file.endswith(_THREADING)), "")
    return _is_raydist(target)


def _is_raydist(path: str) -> bool:
    return any(part in path for part in _RAYDIST_CODE)


def _is_library(path: str) -> bool:
    return "site-packages" in path or "dist-packages" in path or path.startswith(("<", os.path.dirname(os.__file__)))


def format_stacks(dumps: Dict[int, Optional[str]]) -> str:
    """Ranks grouped by where they are; the odd ones out marked.

    A rank outside any collective while others wait in one is marked; with
    no such difference, the smaller groups are.
    """
    groups: Dict[Tuple[str, Tuple[str, ...]], List[int]] = {}
    summaries: Dict[Tuple[str, Tuple[str, ...]], StackSummary] = {}
    missing = [rank for rank, dump in dumps.items() if not dump]
    for rank, dump in sorted(dumps.items()):
        if dump:
            summary = summarize_stack(dump)
            key = (summary.where, summary.frames)
            groups.setdefault(key, []).append(rank)
            summaries[key] = summary
    odd = _odd_groups(groups, summaries)
    lines = []
    for key, ranks in sorted(groups.items(), key=lambda item: item[1][0]):
        mark = "  <-- differs" if key in odd else ""
        lines.append(f"{ranks_text(ranks)}: {key[0]}{mark}")
        lines.extend(f"    {frame}" for frame in key[1])
    if missing:
        lines.append(f"{ranks_text(missing)}: no stack (the process did not answer)")
    return "\n".join(lines)


def _odd_groups(
    groups: Dict[Tuple[str, Tuple[str, ...]], List[int]], summaries: Dict[Tuple[str, Tuple[str, ...]], StackSummary]
) -> List[Tuple[str, Tuple[str, ...]]]:
    if len(groups) < 2:
        return []
    outside = [key for key in groups if not summaries[key].in_collective]
    if outside and len(outside) < len(groups):
        return outside
    largest = max(len(ranks) for ranks in groups.values())
    smaller = [key for key, ranks in groups.items() if len(ranks) < largest]
    return smaller
