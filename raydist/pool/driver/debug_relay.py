"""The driver's end of pdb on any rank (the worker's is
``raydist.pool.worker.debugger``).

``DebugRelay`` listens on the driver's node for ranks stopped in pdb. When
the driver's stdin is a terminal it serves them there, one at a time: a
second rank that stops waits its turn, and the relay says so. Without a
terminal (a submitted job) it prints how to attach from another shell:
``raydist debug`` reads the relays registered on this machine, lists the
waiting ranks and attaches to one. Every connection must carry the group's
random token: the relay hands a terminal to whoever holds it.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import secrets
import select
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from raydist.pool.worker.debugger import ADDRESS_VAR, TOKEN_VAR
from raydist.pool.worker.evidence import remove_stale

HELLO_TIMEOUT_S = 5.0
REGISTERED = re.compile(r"^(\d+)-\d+\.json$")  # <driver pid>-<port>.json: a relay's entry in registry_dir(), group 1 its pid


def registry_dir() -> str:
    """Where relays on this machine leave their address for ``raydist debug``."""
    return os.path.join(tempfile.gettempdir(), "raydist-debug")


@dataclass
class Stopped:
    """A rank waiting in pdb, and its connection."""

    rank: int
    pid: int
    host: str
    kind: str  # "breakpoint()" or "post-mortem (KeyError)"
    where: str  # "train.py:12"
    connection: socket.socket

    def describe(self) -> str:
        return f"rank {self.rank} (pid {self.pid} on {self.host}) stopped at {self.kind} in {self.where}"

    def public(self) -> Dict[str, Any]:
        return {"rank": self.rank, "pid": self.pid, "host": self.host, "kind": self.kind, "where": self.where}


def read_line(connection: socket.socket, limit: int = 64 * 1024) -> bytes:
    """One line (without the newline), read byte by byte so nothing after it is consumed."""
    data = bytearray()
    while len(data) < limit:
        byte = connection.recv(1)
        if not byte or byte == b"\n":
            break
        data += byte
    return bytes(data)


def pump_terminal(connection: socket.socket, stop: Optional[threading.Event] = None) -> None:
    """Relay ``connection`` to this process's stdin/stdout until it closes."""
    stdin = sys.stdin.fileno()
    stdin_open = True
    while stop is None or not stop.is_set():
        sources = [connection, stdin] if stdin_open else [connection]
        readable, _, _ = select.select(sources, [], [], 0.5)
        if connection in readable:
            data = connection.recv(65536)
            if not data:
                return
            sys.stdout.write(data.decode("utf-8", errors="replace"))
            sys.stdout.flush()
        if stdin_open and stdin in readable:
            typed = os.read(stdin, 65536)
            if typed:
                connection.sendall(typed)
            else:  # Ctrl-D: pdb quits, as it does at a local prompt
                stdin_open = False
                connection.shutdown(socket.SHUT_WR)


def splice(one: socket.socket, other: socket.socket) -> socket.socket:
    """Copy bytes both ways until one side closes; returns the side that closed."""
    while True:
        readable, _, _ = select.select([one, other], [], [])
        for source in readable:
            data = source.recv(65536)
            if not data:
                return source
            (other if source is one else one).sendall(data)


class DebugRelay:
    """Serves the ranks of one group that stop in pdb (see the module docstring)."""

    def __init__(self, host: str, terminal: Optional[bool] = None):
        self.token = secrets.token_hex(16)
        self._server = socket.create_server((host, 0))
        self.address = f"{host}:{self._server.getsockname()[1]}"
        self._terminal = sys.stdin is not None and sys.stdin.isatty() if terminal is None else terminal
        self._waiting: List[Stopped] = []
        self._serving: Optional[Stopped] = None
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._registry = os.path.join(registry_dir(), f"{os.getpid()}-{self._server.getsockname()[1]}.json")
        self._register()
        threading.Thread(target=self._accept, name="raydist-debug-relay", daemon=True).start()
        if self._terminal:
            threading.Thread(target=self._serve_terminal, name="raydist-debug-terminal", daemon=True).start()

    def env(self) -> Dict[str, str]:
        """What every rank needs to reach this relay."""
        return {ADDRESS_VAR: self.address, TOKEN_VAR: self.token}

    def stop(self) -> None:
        """Close the relay and every waiting session (their ranks' pdb sees EOF and quits)."""
        self._stop.set()
        try:  # wakes the thread blocked in accept(), which close() alone does not (Linux)
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for closing in [self._server] + [s.connection for s in self._waiting]:
            try:
                closing.close()
            except OSError:
                pass
        with self._changed:
            self._changed.notify_all()
        try:
            os.remove(self._registry)
        except OSError:
            pass

    def _register(self) -> None:
        os.makedirs(registry_dir(), exist_ok=True)
        remove_stale(registry_dir(), stale_after=0, owned=REGISTERED)  # drivers that were killed (SIGKILL) left theirs
        descriptor = os.open(self._registry, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            json.dump({"address": self.address, "token": self.token, "pid": os.getpid()}, file)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._greet, args=(connection,), daemon=True).start()

    def _greet(self, connection: socket.socket) -> None:
        try:
            connection.settimeout(HELLO_TIMEOUT_S)
            hello = json.loads(read_line(connection) or b"{}")
            connection.settimeout(None)
        except (OSError, ValueError):
            connection.close()
            return
        if not isinstance(hello, dict) or not hmac.compare_digest(str(hello.get("token", "")), self.token):
            connection.close()
            return
        if hello.get("role") == "rank":
            self._arrived(
                Stopped(
                    int(hello.get("rank", -1)),
                    int(hello.get("pid", 0)),
                    str(hello.get("host", "?")),
                    str(hello.get("kind", "breakpoint()")),
                    str(hello.get("where", "?")),
                    connection,
                )
            )
        elif hello.get("op") == "attach":
            self._attach(connection, hello.get("rank"))
        else:
            self._reply(connection, {"stopped": [s.public() for s in self._waiting] + ([self._serving.public()] if self._serving else [])})
            connection.close()

    def _arrived(self, stopped: Stopped) -> None:
        with self._changed:
            busy = self._serving is not None or bool(self._waiting)
            ahead = self._serving or (self._waiting[0] if self._waiting else None)
            self._waiting.append(stopped)
            self._changed.notify_all()
        if not self._terminal:
            _say(
                f"{stopped.describe()}; no terminal here: attach from another shell on this machine with "
                f"`raydist debug --rank {stopped.rank}` (`raydist debug --list` lists the waiting ranks)"
            )
        elif busy and ahead is not None:
            _say(f"{stopped.describe()}; it waits its turn (rank {ahead.rank}'s pdb session comes first)")

    def _take(self, rank: Optional[int] = None) -> Optional[Stopped]:
        with self._changed:
            for stopped in self._waiting:
                if rank is None or stopped.rank == rank:
                    self._waiting.remove(stopped)
                    self._serving = stopped
                    return stopped
        return None

    def _done(self, stopped: Stopped, closed: bool) -> None:
        with self._changed:
            self._serving = None
            if not closed and not self._stop.is_set():
                self._waiting.insert(0, stopped)  # the client left: the rank still waits
            self._changed.notify_all()

    def _serve_terminal(self) -> None:
        while not self._stop.is_set():
            with self._changed:
                while not self._stop.is_set() and (not self._waiting or self._serving is not None):
                    self._changed.wait()
            stopped = self._take()
            if stopped is None:
                continue
            _say(f"{stopped.describe()}; its pdb is here (`c` continues it)")
            try:
                pump_terminal(stopped.connection, self._stop)
            except OSError:
                pass
            stopped.connection.close()
            self._done(stopped, closed=True)
            _say(f"rank {stopped.rank}: pdb session ended")

    def _attach(self, client: socket.socket, rank: Any) -> None:
        stopped = self._take(None if rank is None else int(rank))
        if stopped is None:
            self._reply(client, {"error": f"no rank{'' if rank is None else ' ' + str(rank)} is waiting in pdb"})
            client.close()
            return
        self._reply(client, {"attached": stopped.public()})
        try:
            closed = splice(client, stopped.connection) is stopped.connection
        except OSError:
            closed = True
        client.close()
        if closed:
            stopped.connection.close()
        self._done(stopped, closed)

    @staticmethod
    def _reply(connection: socket.socket, message: Dict[str, Any]) -> None:
        try:
            connection.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass


def _say(line: str) -> None:
    print(f"raydist: {line}", file=sys.stderr, flush=True)
