"""Reaching Ray: one way for the API and the CLI, quick and clear failures,
and a group that outlives its Ray says so instead of starting another.

Each case runs in a fresh interpreter with a private RAY_TMPDIR, so that it
starts from "Ray not initialised" and any Ray it started would show there.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Dict, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def clean_env() -> Iterator[Dict[str, str]]:
    # Ray puts Unix sockets under its temp dir; the path must stay short.
    tmpdir = tempfile.mkdtemp(prefix="rd", dir="/tmp" if os.path.isdir("/tmp") else None)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env["RAY_TMPDIR"] = tmpdir
    yield env
    shutil.rmtree(tmpdir, ignore_errors=True)


def python(code: str, env: Dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def explain(result: subprocess.CompletedProcess) -> str:
    return f"exit status {result.returncode}\n--- stdout:\n{result.stdout}\n--- stderr:\n{result.stderr}"


CONNECT = """
    import sys, time, raydist
    started = time.monotonic()
    try:
        raydist.run(print, num_workers=1, address=sys.argv[1] if len(sys.argv) > 1 else {address!r}, startup_timeout={startup!r})
    except ConnectionError as error:
        print("ConnectionError:", error)
    print(f"elapsed {{time.monotonic() - started:.2f}}")
"""


def elapsed(result: subprocess.CompletedProcess) -> float:
    return float(result.stdout.rsplit("elapsed ", 1)[1].split()[0])


def test_closed_port_fails_within_five_seconds_naming_the_address(clean_env: Dict[str, str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        result = python(CONNECT.format(address=address, startup=300.0), clean_env)
    assert f"ConnectionError: cannot reach the Ray cluster at {address}" in result.stdout, explain(result)
    assert elapsed(result) < 5, explain(result)
    assert os.listdir(clean_env["RAY_TMPDIR"]) == [], "a Ray was started"


def test_port_that_never_answers_fails_within_startup_timeout(clean_env: Dict[str, str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)  # the kernel accepts connections; nothing ever answers
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        result = python(CONNECT.format(address=address, startup=3.0), clean_env)
    assert f"ConnectionError: no Ray cluster answered at {address}" in result.stdout, explain(result)
    assert elapsed(result) < 8, explain(result)
    assert os.listdir(clean_env["RAY_TMPDIR"]) == []


def test_dashboard_address_is_refused_with_what_to_do_instead(clean_env: Dict[str, str]) -> None:
    result = python(
        """
        import raydist
        try:
            raydist.run(print, address="http://127.0.0.1:8265")
        except ValueError as error:
            print("ValueError:", error)
        """,
        clean_env,
    )
    assert "ValueError: address 'http://127.0.0.1:8265' is a dashboard" in result.stdout, explain(result)
    assert "ray job submit" in result.stdout


RAY_SHUTDOWN_DURING_A_CALL = """
    import os, threading, time, tempfile
    import ray, raydist

    started = tempfile.mktemp()

    def block(path):
        open(path, "w").close()
        time.sleep(120)

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    group = raydist.WorkerGroup(1, resources_per_worker={"CPU": 0.5})
    future = group.submit(block, (started,))

    def stop_ray_once_the_call_runs():
        deadline = time.monotonic() + 60
        while not os.path.exists(started) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a file the call creates, with a deadline
        ray.shutdown()

    threading.Thread(target=stop_ray_once_the_call_runs).start()
    for attempt in (future.result, lambda: group.run(print)):
        try:
            attempt()
        except RuntimeError as error:
            print("RuntimeError:", error)
    group.shutdown()
    print("initialised:", ray.is_initialized())
"""


@pytest.mark.soak  # Ray shut down under a call
def test_ray_shutdown_during_a_call_is_a_clear_error_and_starts_no_new_ray(clean_env: Dict[str, str]) -> None:
    result = python(RAY_SHUTDOWN_DURING_A_CALL, clean_env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RuntimeError:")]
    assert len(lines) == 2, explain(result)
    assert "Ray was shut down (ray.shutdown()) while this WorkerGroup's call ran" in lines[0]
    assert "has been shut down (ray.shutdown())" in lines[1]
    assert "initialised: False" in result.stdout
    # One Ray session was ever started under this temp dir, and nothing of it runs.
    sessions = [name for name in os.listdir(os.path.join(clean_env["RAY_TMPDIR"], "ray")) if name.startswith("session_2")]
    assert len(sessions) == 1, sessions
    ps = subprocess.run(["ps", "-A", "-o", "args="], capture_output=True, text=True).stdout
    assert clean_env["RAY_TMPDIR"] not in ps


PRIVATE_HEAD = """
    import glob, json, os, psutil, ray, raydist
    from ray._private import services, utils
    from ray._private.node import Node
    def patchable():
        return (Node.start_monitor, Node.start_api_server, utils.get_dashboard_dependency_error,
                services.get_node, services._build_python_executable_command_memory_profileable)
    originals = patchable()
    raydist.run(print, num_workers=1)  # no address: the record of a `ray start` here is dead (the test wrote it)
    def command(process):
        try:
            return " ".join(process.cmdline())
        except psutil.Error:  # a killed worker not yet reaped
            return ""
    processes = [command(p) for p in psutil.Process().children(recursive=True)]
    session = ray._private.worker._global_node.get_session_dir_path()
    ports = {os.path.basename(path).rsplit("_", 1)[0]: open(path).read().strip() for path in glob.glob(os.path.join(session, "*_port_*"))}
    restored = patchable() == originals
    print("HEAD " + json.dumps({"processes": processes, "ports": ports, "restored": restored}))
"""


def test_a_private_ray_starts_only_what_a_run_needs(clean_env: Dict[str, str]) -> None:
    # A head that was killed leaves `ray start`'s record, which ray.init() would retry for minutes.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
        record = Path(clean_env["RAY_TMPDIR"]) / "ray" / "ray_current_cluster"
        record.parent.mkdir()
        record.write_text(dead)
        result = python(PRIVATE_HEAD, clean_env)
    assert f"the Ray cluster last started on this machine ({dead}, recorded in {record}) does not answer" in result.stderr, explain(result)
    lines = [line for line in result.stdout.splitlines() if line.startswith("HEAD ")]
    assert len(lines) == 1, explain(result)
    head = json.loads(lines[0][len("HEAD ") :])
    commands = "\n".join(head["processes"])
    assert "gcs_server" in commands and "raylet" in commands, commands  # it did start a Ray
    assert "autoscaler/_private/monitor.py" not in commands, commands  # nothing to scale
    assert "dashboard/dashboard.py" not in commands, commands  # no API server
    # No dashboard agent (it would run as in a minimal install: no metrics or HTTP server): raydist's stub,
    # which imports nothing of Ray, tells the raylet so through the agent's port files.
    agents = [command for command in head["processes"] if "dashboard/agent.py" in command]
    assert agents and all("raydist/pool/agent_stub.py" in command.split("dashboard/agent.py")[0] for command in agents), commands
    assert head["ports"].get("metrics_agent_port") == "-1" and head["ports"].get("dashboard_agent_listen_port") == "-1", head["ports"]
    assert head["restored"], "Ray's own functions were left patched"
