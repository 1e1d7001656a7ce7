"""A worker's side of output settling: a call returns on the driver only
once the lines its ranks printed during it have arrived there.

Ray redirects every worker's fd 1 and 2 to files; a log monitor on each node
tails them and forwards the lines to the driver, asynchronously. So a worker
notes the size of both files before a call; when a stream grew (or the call
failed), it ends that stream with a marker line ``<token> <call number>``.
The marker travels behind the call's lines through the same file, so once
the driver has seen it, every earlier line has been printed. A call that
prints nothing writes no marker and waits for none: warm calls stay as fast.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Tuple

# Set on every worker (to the driver's token) when the driver follows the markers.
MARKER_VAR = "RAYDIST_OUTPUT_MARKER"

_calls = itertools.count()  # one actor per process: this numbers its calls as the driver does


@dataclass(frozen=True)
class Printed:
    """A call's value from a rank whose streams got a marker after the call."""

    value: Any
    call: int
    streams: Tuple[bool, bool]  # (stdout, stderr)


def write_whole_lines() -> None:
    """This process's ``sys.stdout`` and ``sys.stderr`` write a line at once.

    A Ray worker's streams flush after every write, so ``print("loss", x)``
    reaches the file in pieces ("loss", " ", x, the newline), and the log
    monitor, which forwards whatever the file holds when it looks, can cut
    the line in two at the console and in the rank's log. Each stream
    becomes a line-buffered one over the same descriptor: a line is written
    whole at its newline (or a flush), as a terminal does under torchrun."""
    for name, errors in (("stdout", "strict"), ("stderr", "backslashreplace")):  # Python's own for each
        stream = getattr(sys, name)
        try:
            fd = stream.fileno()
            stream.flush()
        except (AttributeError, OSError, ValueError):  # not a file (the code's own): left as it is
            continue
        setattr(sys, name, open(fd, "a", buffering=1, encoding="utf-8", errors=errors, closefd=False))


def _flushed_sizes() -> Tuple[int, int]:
    """The sizes of the files behind fd 1 and 2 (-1: unknown), Python's buffers flushed first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream must not fail the call
            pass
    sizes = []
    for fd in (1, 2):
        try:
            sizes.append(os.fstat(fd).st_size)
        except OSError:
            sizes.append(-1)
    return sizes[0], sizes[1]


def _write_markers(token: str, call: int, streams: Tuple[bool, bool]) -> None:
    line = f"{token} {call}\n".encode()
    for fd, marked in zip((1, 2), streams):
        if marked:
            try:
                os.write(fd, line)  # the descriptor itself, whatever the code did to sys.stdout
            except OSError:
                pass


def marks_output(execute: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Wrap a worker's ``execute(call) -> Outcome``: after a call that printed,
    mark the streams it printed on and wrap the value in ``Printed``; after a
    failed call, mark both (the driver cannot be told which)."""

    @functools.wraps(execute)
    def run(self: Any, call: Any = None) -> Any:
        number = next(_calls)
        token = os.environ.get(MARKER_VAR)
        if not token:
            return execute(self, call)
        before = _flushed_sizes()
        outcome = execute(self, call)
        after = _flushed_sizes()
        if not outcome.ok:
            _write_markers(token, number, (True, True))  # a failure's Outcome cannot say which grew
            return outcome
        streams = (after[0] > before[0] >= 0, after[1] > before[1] >= 0)
        if not any(streams):
            return outcome
        _write_markers(token, number, streams)
        return dataclasses.replace(outcome, value=Printed(outcome.value, number, streams))

    return run
