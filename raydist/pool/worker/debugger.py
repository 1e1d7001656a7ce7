"""pdb on any rank: ``breakpoint()`` in a worker opens pdb over a TCP
connection to the group's debug relay on the driver, which puts it in the
launching terminal (or lets ``raydist debug`` attach from another shell).

Ray installs its own hook for ``breakpoint()`` in workers (its debugpy or
rpdb one); ``install`` puts this one in its place. The other ranks are not
stopped: they wait where they are (typically in their next collective).
"""

from __future__ import annotations

import bdb
import builtins
import json
import os
import pdb
import socket
import sys
from types import FrameType
from typing import Any, Optional, TextIO

# Set by the driver for every rank: "HOST:PORT" of the relay, and its token.
ADDRESS_VAR = "RAYDIST_DEBUG_ADDRESS"
TOKEN_VAR = "RAYDIST_DEBUG_TOKEN"
HOOK = "raydist.pool.worker.debugger.set_trace"
CONNECT_TIMEOUT_S = 10.0
# Errors that end a pdb session rather than call for one.
QUIT_ERRORS = (bdb.BdbQuit, KeyboardInterrupt, SystemExit)


def install() -> None:
    """Make ``breakpoint()`` in this process call ``set_trace`` (when a relay is set)."""
    if not os.environ.get(ADDRESS_VAR):
        return
    os.environ["PYTHONBREAKPOINT"] = HOOK  # read by sys.__breakpointhook__ on every call
    sys.breakpointhook = set_trace
    if not isinstance(builtins.breakpoint, type(len)):  # Ray's debugpy hook replaces the builtin too
        builtins.breakpoint = _breakpoint


def _breakpoint(*args: Any, **kwargs: Any) -> Any:
    return sys.breakpointhook(*args, **kwargs)


class RemotePdb(pdb.Pdb):
    """pdb on a socket; ``c`` (or ``q``) ends the session and closes it."""

    def __init__(self, connection: socket.socket):
        self._connection = connection
        self._file: TextIO = connection.makefile("rw", buffering=1, encoding="utf-8", errors="replace", newline="\n")
        super().__init__(stdin=self._file, stdout=self._file, nosigint=True, readrc=False)
        self.prompt = "(Pdb) "

    def do_continue(self, arg: str) -> Any:
        # Breakpoints set with `b` would write to a closed session: a new breakpoint() opens a new one.
        self.clear_all_breaks()
        result = super().do_continue(arg)
        self.close()
        return result

    do_c = do_cont = do_continue

    def do_quit(self, arg: str) -> Any:
        result = super().do_quit(arg)
        self.close()
        return result

    do_q = do_exit = do_quit

    def do_EOF(self, arg: str) -> Any:  # the relay (or the driver) went away: quit, as pdb does on Ctrl-D
        result = super().do_EOF(arg)
        self.close()
        return result

    def close(self) -> None:
        for closing in (self._file, self._connection):
            try:
                closing.close()
            except OSError:
                pass


def _connect(kind: str, where: str) -> Optional[socket.socket]:
    """A connection to the relay, introduced; None (with a line on stderr) if there is none."""
    address = os.environ.get(ADDRESS_VAR, "")
    host, _, port = address.rpartition(":")
    hello = {
        "role": "rank",
        "token": os.environ.get(TOKEN_VAR, ""),
        "kind": kind,
        "where": where,
        "rank": int(os.environ.get("RANK", "-1")),
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    try:
        connection = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
        connection.settimeout(None)
        connection.sendall(json.dumps(hello).encode() + b"\n")
        return connection
    except (OSError, ValueError) as error:
        print(
            f"raydist: rank {hello['rank']}: cannot reach the debugger relay at {address!r} ({error}); going on without pdb",
            file=sys.stderr,
            flush=True,
        )
        return None


def _where(frame: Optional[FrameType]) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}" if frame is not None else "?"


def set_trace(*_: Any, header: Optional[str] = None, **__: Any) -> None:
    """``breakpoint()``: stop this rank in pdb, served by the driver's relay."""
    frame = sys._getframe().f_back
    if frame is not None and frame.f_code is _breakpoint.__code__:
        frame = frame.f_back
    connection = _connect("breakpoint()", _where(frame))
    if connection is None:
        return
    debugger = RemotePdb(connection)
    if header:
        debugger.message(header)
    debugger.set_trace(frame)


def post_mortem(error: BaseException) -> None:
    """Keep this rank at ``error`` in pdb until the session ends (``post_mortem=True``)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:  # where it was raised
        tb = tb.tb_next
    connection = _connect(f"post-mortem ({type(error).__name__})", _where(tb.tb_frame if tb else None))
    if connection is None:
        return
    debugger = RemotePdb(connection)
    debugger.message(f"{type(error).__name__}: {error}")
    debugger.reset()
    try:
        debugger.interaction(None, error.__traceback__)
    except bdb.BdbQuit:
        pass
    finally:
        debugger.close()
