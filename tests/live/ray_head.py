"""A real head node, ``ray start --head --block`` with token auth, for the
tests that need a cluster started the way users start one.

The head is the test's alone and ends with it:

- Every port it is given was free when chosen, but Ray binds some of them
  seconds later (the client server, the agents), after its dashboard already
  answers. A port another process took meanwhile makes that component exit,
  and ``ray start --block`` then kills the whole head, GCS included: a
  driver connected to it waits 60 s and dies ("Failed to connect to GCS
  within 60 seconds"). So the head counts as up only once every one of its
  ports is listened on by its own processes; a port taken by another process,
  or a ``ray start`` that exited, costs a new head with new ports instead.
- Ray's own metrics servers default to fixed ports (44217, 44227) that the
  session's Ray already holds: the head gets free ones.
- ``ray start`` runs in a session of its own (so a signal to the test's
  process group does not reach it) and gets SIGTERM when the test process
  ends however it ends (killed, cut short), so it never outlives the tier;
  SIGTERM makes ``ray start --block`` stop what it started.
- ``stop`` does not use ``ray stop``, which stops every Ray on the machine
  (other tests' included).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import psutil

BIN = Path(sys.executable).parent
# ray start's port options; "port" is the GCS's.
PORT_OPTIONS = (
    "port",
    "dashboard-port",
    "ray-client-server-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "metrics-export-port",
)
# Ray reads these fixed defaults from the environment.
METRIC_PORT_VARIABLES = ("AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT")
START_TRIES = 3
PR_SET_PDEATHSIG = 1


def free_ports(count: int) -> List[int]:
    """``count`` distinct ports free now: each socket stays bound until all
    are chosen, so the kernel cannot hand out the same port twice."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def _end_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def process_table() -> Dict[int, Tuple[int, str, str]]:
    """pid -> (parent pid, state, command line) of every process, from ps."""
    out = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,stat=,args="], capture_output=True, text=True, check=True).stdout
    table: Dict[int, Tuple[int, str, str]] = {}
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit():
            table[int(parts[0])] = (int(parts[1]), parts[2], parts[3] if len(parts) > 3 else "")
    return table


def listeners() -> Dict[int, Set[Optional[int]]]:
    """port -> pids listening on it (None where the pid cannot be read)."""
    found: Dict[int, Set[Optional[int]]] = {}
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr:
            found.setdefault(conn.laddr.port, set()).add(conn.pid)
    return found


class RayHead:
    """Started by ``start()``, which returns once the head serves on every port."""

    def __init__(self, num_cpus: int = 4) -> None:
        self.num_cpus = num_cpus
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
        # Token auth stays on, with a token of this head's (no file in $HOME).
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        # Jobs inherit the head's environment: the entrypoint's python must be this one.
        self.env["PATH"] = os.pathsep.join([str(BIN), self.env.get("PATH", "")])
        self.ports: Dict[str, int] = {}
        self.metric_ports: List[int] = []
        self.temp_dir = ""
        self.process: Optional[subprocess.Popen] = None
        self.failed_starts: List[str] = []  # why each discarded head was discarded

    @property
    def gcs_port(self) -> int:
        return self.ports["port"]

    @property
    def dashboard_port(self) -> int:
        return self.ports["dashboard-port"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self, timeout: float = 45) -> "RayHead":
        for _ in range(START_TRIES):
            self._launch()
            problem = self._wait_until_serving(timeout)
            if problem is None:
                return self
            self.failed_starts.append(problem)
            self.stop()
        raise RuntimeError(f"no head came up in {START_TRIES} tries:\n" + "\n---\n".join(self.failed_starts))

    def _launch(self) -> None:
        # Ray puts Unix sockets under its temp dir; their paths must stay under ~107 chars.
        self.temp_dir = tempfile.mkdtemp(prefix="rd", dir="/tmp" if os.path.isdir("/tmp") else None)
        chosen = free_ports(len(PORT_OPTIONS) + len(METRIC_PORT_VARIABLES))
        self.ports = dict(zip(PORT_OPTIONS, chosen))
        env = dict(self.env, **dict(zip(METRIC_PORT_VARIABLES, map(str, chosen[len(PORT_OPTIONS) :]))))
        self.metric_ports = chosen[len(PORT_OPTIONS) :]
        command = [
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address",
            "127.0.0.1",
            "--dashboard-host",
            "127.0.0.1",
            "--num-cpus",
            str(self.num_cpus),
            "--num-gpus",
            "0",
            "--temp-dir",
            self.temp_dir,
            *[f"--{name}={port}" for name, port in self.ports.items()],
        ]
        self.log = open(os.path.join(self.temp_dir, "ray-start.log"), "w")
        self.process = subprocess.Popen(
            command, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_end_with_parent
        )

    def _wait_until_serving(self, timeout: float) -> Optional[str]:
        """None once every port of the head is listened on by its own
        processes and its job API answers; else why this head must go."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        wanted = {**{port: name for name, port in self.ports.items()}, **dict.fromkeys(self.metric_ports, "metrics")}
        while True:
            if self.process.poll() is not None:
                return f"ray start exited with {self.process.returncode}:\n{self.start_log()[-3000:]}"
            held = listeners()  # before the head's processes are listed: a listener seen is listed too
            own: Set[Optional[int]] = set(self.own_processes())
            for port, name in wanted.items():
                # None is a listener whose process psutil has not found yet: a process that bound its socket
                # between psutil's two reads of /proc (the head's own new component, as often as not). If
                # another program holds the port, the head's component fails to bind and ray start exits.
                foreign = held.get(port, set()) - own - {None}
                if foreign:
                    return f"its {name} port {port} was taken by another process ({sorted(map(str, foreign))})"
            if all(held.get(port, set()) & own for port in wanted) and self.ray("job", "list", "--address", self.url).returncode == 0:
                return None
            if time.monotonic() > deadline:
                missing = [f"{name} {port}" for port, name in wanted.items() if not held.get(port, set()) & own]
                return f"not serving after {timeout:g} s (nothing listens on: {', '.join(missing) or 'none'}; the job API fails)"
            time.sleep(0.2)  # polling with a deadline

    def ray(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "ray"), *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def start_log(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def own_processes(self) -> Dict[int, str]:
        """pid -> command line of every live process of this head: the
        ``ray start`` tree (job drivers included: they run in sessions of their
        own, but are children of the job supervisor) and anything naming the
        head's temp dir."""
        table = process_table()
        children: Dict[int, List[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        roots = [self.process.pid] if self.process is not None and self.process.poll() is None else []
        stack = [*roots, *(pid for pid, (_, _, args) in table.items() if self.temp_dir in args)]
        found: Dict[int, str] = {}
        while stack:
            pid = stack.pop()
            if pid in found or pid not in table:
                continue
            found[pid] = table[pid][2]
            stack.extend(children.get(pid, []))
        found.pop(os.getpid(), None)
        return {pid: args for pid, args in found.items() if not table[pid][1].startswith("Z")}

    def stop(self) -> None:
        """SIGTERM to the blocking ``ray start`` (it stops what it started),
        then SIGKILL to whatever of this head is left, and nothing else."""
        if self.process is None:
            return
        recorded = self.own_processes()  # before the tree unravels and loses its parents
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._wait_until_gone(recorded, timeout=5)
        for pid in self._wait_until_gone(recorded, timeout=0):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._wait_until_gone(recorded, timeout=5)
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.process = None

    def _wait_until_gone(self, recorded: Dict[int, str], timeout: float) -> List[int]:
        """Poll until no process of this head runs; the ones still running."""
        deadline = time.monotonic() + timeout
        while True:
            table = process_table()
            # A recorded pid counts only while it runs the same command (pids are reused).
            alive = {pid for pid, args in recorded.items() if pid in table and table[pid][2] == args and not table[pid][1].startswith("Z")}
            alive.update(self.own_processes())
            if not alive or time.monotonic() >= deadline:
                return sorted(alive)
            time.sleep(0.2)  # polling with a deadline
