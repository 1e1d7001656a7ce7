"""``raydist run`` end to end, through ``python -m raydist`` in subprocesses.

Runs attach to the session's local Ray through RAY_ADDRESS (``attached_env``:
the command line stays the one torchrun takes), which saves each case a
private Ray's start; ``test_sys_exit_code_becomes_the_exit_status`` covers
that start itself (``--standalone``). RAY_TMPDIR points at a private
directory, so a run that should start no Ray is seen to start none. The
token and job-submission tests use a real head, ``ray start --block``, of
their own that serves on every port before they use it and ends with them
(``ray_head.RayHead``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Sequence

import psutil
import pytest
import ray_head
from conftest import assert_nothing_left, ray_address
from ray_head import RayHead

from raydist.cli import build_parser, split_script_args

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SCRIPTS = REPO / "tests" / "scripts"
BIN = Path(sys.executable).parent
RUN_TIMEOUT_S = 120
FINAL_LOSS = re.compile(r"final loss: (-?\d+\.\d{6})")


def short_tmpdir() -> str:
    # Ray puts Unix sockets under its temp dir; their paths must stay under ~107 chars.
    return tempfile.mkdtemp(prefix="rd", dir="/tmp" if os.path.isdir("/tmp") else None)


@pytest.fixture
def ray_tmpdir() -> Iterator[str]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cli_env(ray_tmpdir: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = ray_tmpdir
    return env


@pytest.fixture
def attached_env(ray_local: None, cli_env: Dict[str, str]) -> Iterator[Dict[str, str]]:
    """The environment of a run attached to the session's Ray (as a user with
    RAY_ADDRESS set); after the run, nothing of it is left in that Ray."""
    yield dict(cli_env, RAY_ADDRESS=ray_address())
    assert_nothing_left(within=15)  # the driver's exit ends its actors asynchronously


def raydist(args: Sequence[str], env: Dict[str, str], cwd: Path = REPO, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raydist", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def explain(result: subprocess.CompletedProcess) -> str:
    return f"exit status {result.returncode}\n--- stdout:\n{result.stdout}\n--- stderr:\n{result.stderr}"


def closed_port() -> socket.socket:
    """A bound socket that does not listen: connecting to its port is refused,
    and nothing else can take the port while the socket is open."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


# -- command line, no Ray ---------------------------------------------------


def test_help_documents_every_flag(cli_env: Dict[str, str]) -> None:
    result = raydist(["run", "--help"], cli_env, timeout=60)
    assert result.returncode == 0, explain(result)
    _, run_parser = build_parser()
    for action in run_parser._actions:
        assert action.help, f"{action.option_strings or action.dest} has no help text"
        for option in action.option_strings:
            assert option in result.stdout, f"{option} missing from `raydist run --help`"
    for flag in (
        "-n",
        "--nproc-per-node",
        "--nproc_per_node",
        "--num-workers",
        "--nnodes",
        "-m",
        "--accelerator",
        "--resources-per-worker",
        "--backend",
        "--max-restarts",
        "--address",
        "--env",
        "--placement-strategy",
        "--timeout",
        "--startup-timeout",
        "--standalone",
        "--log-dir",
        "--log_dir",
        "-r",
        "--redirects",
        "-t",
        "--tee",
        "--local-ranks-filter",
    ):
        assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", result.stdout), flag


def test_script_arguments_are_not_parsed() -> None:
    _, run_parser = build_parser()
    own, script = split_script_args(run_parser, ["-n", "2", "--env=A=1", "train.py", "--lr", "0.1", "-n", "5", "--", "x"])
    assert own == ["-n", "2", "--env=A=1", "train.py"]
    assert script == ["--lr", "0.1", "-n", "5", "--", "x"]
    own, script = split_script_args(run_parser, ["-n2", "-m", "pkg.train", "--help"])
    assert (own, script) == (["-n2", "-m", "pkg.train"], ["--help"])
    own, script = split_script_args(run_parser, ["--max-restarts", "1", "--", "-odd-name.py", "a"])
    assert (own, script) == (["--max-restarts", "1", "--", "-odd-name.py"], ["a"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "-n", "2", "no_such_script.py"], "no_such_script.py"),
        (["run", "-m", "no_such_package.train"], "no_such_package.train"),
        (["run", "--no-such-flag", "examples/ddp_torchrun.py"], "--no-such-flag"),
        (["run", "-n", "0", "examples/ddp_torchrun.py"], "must be >= 1"),
        (["run", "--nnodes", "3:2", "examples/ddp_torchrun.py"], "MIN <= MAX"),
        (["run", "--restart-to-grow", "examples/ddp_torchrun.py"], "needs an elastic size"),
        (["run", "--preemption-signal", "SIGNOPE", "examples/ddp_torchrun.py"], "signal name"),
        (["run", "--env", "NO_EQUALS_SIGN", "examples/ddp_torchrun.py"], "KEY=VALUE"),
        (["run", "--resources-per-worker", "[1]", "examples/ddp_torchrun.py"], "JSON object"),
        (["run", "-n"], "expected one argument"),
        (["run", "-n", "tpu", "examples/ddp_torchrun.py"], "a whole number"),
        (["run", "-n", "gpu", "--accelerator", "cpu", "examples/ddp_torchrun.py"], "contradicts"),
        (["run", "--nnodes", "2", "-n", "auto", "examples/ddp_torchrun.py"], "give a number"),
        (["run", "--env", "RANK=0", "examples/ddp_torchrun.py"], "--env['RANK']"),
        (["run", "--env", "WORLD_SIZE=3", "examples/ddp_torchrun.py"], "WORLD_SIZE"),
        (["run", "--timeout", "-1", "examples/ddp_torchrun.py"], "--timeout must be a positive"),
        (["run", "--startup-timeout", "0", "examples/ddp_torchrun.py"], "--startup-timeout"),
        (["run", "--max-restarts", "-1", "examples/ddp_torchrun.py"], "--max-restarts must be >= 0"),
        (["run", "--resources-per-worker", '{"GPU": 1.5}', "examples/ddp_torchrun.py"], "whole number"),
        (["run", "--resources-per-worker", '{"CPU": 0}', "--accelerator", "cpu", "examples/ddp_torchrun.py"], "no resources"),
        (["run", "--address", "http://127.0.0.1:8265", "examples/ddp_torchrun.py"], "ray job submit"),
        (["run", "--standalone", "--address", "127.0.0.1:6379", "examples/ddp_torchrun.py"], "--standalone"),
        (["run", "examples"], "no __main__.py"),
        (["run", "-r", "4", "examples/ddp_torchrun.py"], "--redirects '4' is neither a stream code"),
        (["run", "--tee", "0:1,1:5", "examples/ddp_torchrun.py"], "--tee '0:1,1:5'"),
        (["run", "--local-ranks-filter", "0,a", "examples/ddp_torchrun.py"], "--local-ranks-filter must be"),
        (["run", "--log-dir", "README.md", "examples/ddp_torchrun.py"], "--log-dir 'README.md' exists and is not a directory"),
    ],
)
def test_bad_command_line_fails_before_ray_starts(args: List[str], message: str, cli_env: Dict[str, str], ray_tmpdir: str) -> None:
    started = time.monotonic()
    result = raydist(args, cli_env, timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == 2, explain(result)
    assert message in result.stderr
    assert os.listdir(ray_tmpdir) == [], "a Ray instance was started"
    assert elapsed < 20, f"took {elapsed:.1f} s"


def test_unreachable_address_is_named_quickly(cli_env: Dict[str, str], ray_tmpdir: str) -> None:
    with closed_port() as sock:
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        started = time.monotonic()
        result = raydist(["run", "--address", address, "examples/ddp_torchrun.py"], cli_env, timeout=60)
        elapsed = time.monotonic() - started
    assert result.returncode != 0, explain(result)
    assert f"cannot reach the Ray cluster at {address}" in result.stderr, explain(result)
    assert elapsed < 15, f"took {elapsed:.1f} s (interpreter start included)"
    assert os.listdir(ray_tmpdir) == []


# -- runs attached to the session's Ray (one on a private Ray) ------------


def test_torchrun_script_gives_the_same_loss_as_under_torchrun(attached_env: Dict[str, str]) -> None:
    script = ["examples/ddp_torchrun.py", "--steps", "20", "--seed", "3", "--device", "cpu"]
    ours = raydist(["run", "-n", "2", "--accelerator", "cpu", *script], attached_env)
    assert ours.returncode == 0, explain(ours)
    assert "rank 0 of 2" in ours.stdout and "rank 1 of 2" in ours.stdout
    torchrun = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *script],
        cwd=REPO,
        env=attached_env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert torchrun.returncode == 0, explain(torchrun)
    ours_loss = FINAL_LOSS.findall(ours.stdout)
    torchrun_loss = FINAL_LOSS.findall(torchrun.stdout)
    assert len(ours_loss) == 1 and len(torchrun_loss) == 1, explain(ours) + explain(torchrun)
    assert abs(float(ours_loss[0]) - float(torchrun_loss[0])) <= 1e-6, (ours_loss, torchrun_loss)


@pytest.mark.soak  # the example end to end (its parts run in make test)
def test_open_clip_style_example(attached_env: Dict[str, str]) -> None:
    result = raydist(["run", "-n", "2", "--accelerator", "cpu", "examples/open_clip_style.py", "--steps", "6"], attached_env)
    assert result.returncode == 0, explain(result)
    assert "world size 2, device cpu, distributed True" in result.stdout
    for rank in (0, 1):
        assert f"rank {rank} (local rank {rank}) got config open-clip-style-seed0" in result.stdout
    assert "gathered from ranks [0, 1]" in result.stdout
    assert re.search(r"final losses: \[\d+\.\d+, \d+\.\d+\]", result.stdout), explain(result)


def test_a_raising_rank_fails_the_run_with_its_traceback(attached_env: Dict[str, str]) -> None:
    args = ["raise", "1", "--lr", "0.1", "-n", "5"]  # the script's own flags, raydist's names included
    result = raydist(["run", "-n", "2", "--accelerator", "cpu", "tests/scripts/cli_fail.py", *args], attached_env)
    assert result.returncode == 1, explain(result)
    assert "ValueError: deliberate failure on rank 1" in result.stderr, explain(result)
    assert "rank(s) failed: [1]" in result.stderr and "--- rank 1 [root cause]" in result.stderr
    assert f"rank 1 started with argv {args}" in result.stdout, explain(result)


def test_sys_exit_code_becomes_the_exit_status(cli_env: Dict[str, str]) -> None:
    # Also: -m runs a module found from the working directory, and --standalone
    # starts a private Ray even when RAY_ADDRESS names a cluster.
    with closed_port() as sock:
        env = dict(cli_env, RAY_ADDRESS=f"127.0.0.1:{sock.getsockname()[1]}")
        result = raydist(["run", "--standalone", "-n", "2", "--accelerator=cpu", "-m", "cli_fail", "exit-3"], env, cwd=SCRIPTS)
    assert result.returncode == 3, explain(result)
    assert "exited with status 3" in result.stderr
    assert "rank(s) failed: [0, 1]" in result.stderr


@pytest.mark.parametrize("code", [3, -1, 300, 255])
def test_exit_status_is_what_python_gives_for_the_same_sys_exit(code: int) -> None:
    from raydist.cli import failure_status
    from raydist.errors import WorkerFailure

    plain = subprocess.run([sys.executable, "-c", f"import sys; sys.exit({code})"]).returncode
    failures = [WorkerFailure(rank=r, node_id="n", node_ip="ip", pid=r, timestamp=0.0, exit_code=code) for r in (0, 1)]
    assert failure_status(failures) == plain


def test_a_directory_runs_its_main_and_n_cpu_is_one_worker_per_cpu_slot(attached_env: Dict[str, str], tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "helper.py").write_text("WHO = 'helper next to __main__'\n")
    (app / "__main__.py").write_text(
        "import os, ray, torch.distributed as dist\n"
        "from helper import WHO\n"  # python DIR puts DIR first on sys.path
        "dist.init_process_group('gloo')\n"
        "cpus = int(ray.cluster_resources()['CPU'])\n"
        "print(f'rank {dist.get_rank()} of {dist.get_world_size()} ({cpus} CPUs) imports {WHO}', flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    result = raydist(["run", "-n", "cpu", str(app)], attached_env)
    assert result.returncode == 0, explain(result)
    lines = re.findall(r"rank (\d+) of (\d+) \((\d+) CPUs\) imports helper next to __main__", result.stdout)
    assert lines, explain(result)
    world, cpus = int(lines[0][1]), int(lines[0][2])
    assert world == cpus and sorted(int(rank) for rank, _, _ in lines) == list(range(world)), explain(result)


# -- per-rank logs, against torchrun ----------------------------------------

LOG_SCRIPT = "tests/scripts/log_lines.py"


def run_files(log_dir: Path) -> Dict[str, str]:
    """The files of the one run under ``log_dir``, by path within the run's directory."""
    (run_dir,) = log_dir.iterdir()
    return {str(path.relative_to(run_dir)): path.read_text() for path in sorted(run_dir.rglob("*")) if path.is_file()}


def rank_lines(output: str) -> List[str]:
    return [line for line in output.splitlines() if re.match(r"\[\d+\]:.", line)]


def without_empty_lines(files: Dict[str, str]) -> Dict[str, str]:
    return {path: "".join(line for line in text.splitlines(keepends=True) if line.strip()) for path, text in files.items()}


def test_log_files_and_console_match_torchrun(attached_env: Dict[str, str], tmp_path: Path) -> None:
    env = dict(attached_env, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[${rank}]:")
    flags = ["-r", "3", "-t", "3", "--local-ranks-filter", "0"]
    # raydist gets the template from its flag (torch >= 2.14's), which wins over the variable.
    template = ["--log-line-prefix-template", "[${rank}]:"]
    ours_env = dict(env, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="not this one ${rank}:")
    ours = raydist(["run", "-n", "2", "--accelerator", "cpu", "--log-dir", str(tmp_path / "ours"), *flags, *template, LOG_SCRIPT], ours_env)
    assert ours.returncode == 0, explain(ours)
    torchrun = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(tmp_path / "torchrun"),
            *flags,
            LOG_SCRIPT,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert torchrun.returncode == 0, explain(torchrun)
    files = run_files(tmp_path / "ours")
    # The script prints no empty line. Ray's log forwarding can, rarely, read a
    # line while it is being written and pass its newline on as an empty line.
    assert without_empty_lines(files) == without_empty_lines(run_files(tmp_path / "torchrun"))
    assert sorted(files) == [f"attempt_0/{rank}/{name}.log" for rank in (0, 1) for name in ("stderr", "stdout")]
    assert "rank 1 attempt 0 stdout line 2\nrank 1 done\n" in files["attempt_0/1/stdout.log"]
    # Only rank 0 on the console, tee'd with the template's prefix, as torchrun shows it.
    assert rank_lines(ours.stdout) == rank_lines(torchrun.stdout), explain(ours) + explain(torchrun)
    assert rank_lines(ours.stderr) == rank_lines(torchrun.stderr), explain(ours) + explain(torchrun)
    console = ours.stdout + ours.stderr.split("raydist run summary:")[0]  # the summary, last, names every rank
    assert "[0]:rank 0 done" in ours.stdout and "rank 1" not in console
    # Ray's own "Connected to Ray cluster. View the dashboard at ..." line, printed on attaching, is Ray's.
    own_lines = [line for line in (ours.stdout + ours.stderr).splitlines() if "View the dashboard at" not in line]
    assert not [line for line in own_lines if "\x1b[" in line], explain(ours)


def test_each_attempt_has_its_log_directory(attached_env: Dict[str, str], tmp_path: Path) -> None:
    env = dict(attached_env, TMPDIR=str(tmp_path))  # no --log-dir: a temporary directory, named on stderr
    result = raydist(["run", "-n", "2", "--accelerator", "cpu", "-r", "3", "--max-restarts", "1", LOG_SCRIPT, "fail-first"], env)
    assert result.returncode == 0, explain(result)
    named = re.search(r"per-rank logs go to (\S+)", result.stderr)
    assert named and Path(named.group(1)).parent == tmp_path, explain(result)
    files = run_files(Path(named.group(1)))
    assert sorted({path.split("/")[0] for path in files}) == ["attempt_0", "attempt_1"]
    assert files["attempt_0/1/stderr.log"].endswith("rank 1 attempt 0 stderr line 2\nrank 1 fails attempt 0\n")
    assert files["attempt_1/1/stdout.log"].endswith("rank 1 attempt 1 stdout line 2\nrank 1 done\n")
    assert "stdout line" not in result.stdout and "stderr line" not in result.stderr, "redirected lines reached the console"


# -- ray job submit on a real local cluster ----------------------------------


@pytest.fixture(scope="module")
def token_head() -> Iterator[RayHead]:
    """One real head with token auth, shared by the tests that need a cluster."""
    if not (BIN / "ray").exists():
        pytest.skip("the ray command is not installed next to this Python")
    head = RayHead()
    try:
        yield head.start()
    finally:
        head.stop()


@pytest.mark.soak  # a real `ray start --head` and `ray job submit`
@pytest.mark.timeout(240)
def test_ray_job_submit_runs_a_torchrun_script_on_a_cluster(token_head: RayHead, tmp_path: Path) -> None:
    head = token_head
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(EXAMPLES / "ddp_torchrun.py", project / "ddp_torchrun.py")
    job_id = f"raydist-cli-test-{uuid.uuid4().hex[:8]}"
    submitted = head.ray(
        "job",
        "submit",
        "--address",
        head.url,
        "--submission-id",
        job_id,
        "--working-dir",
        str(project),
        "--",
        Path(sys.executable).name,
        "-m",
        "raydist",
        "run",
        "-n",
        "2",
        "ddp_torchrun.py",
        "--steps",
        "5",
        "--device",
        "cpu",
        timeout=RUN_TIMEOUT_S,
    )
    assert submitted.returncode == 0, explain(submitted) + head.start_log()
    # Without --no-wait, `ray job submit` follows the job's logs to its end and prints its final status.
    logs = submitted.stdout
    assert f"Job '{job_id}' succeeded" in logs, explain(submitted)
    for rank in (0, 1):
        assert re.search(rf"\(rank={rank}\b.*\) rank {rank} of 2 ", logs), logs
    assert FINAL_LOSS.search(logs), logs


@pytest.mark.timeout(120)
def test_token_protected_cluster_without_a_token_says_what_to_set(attached_env: Dict[str, str], tmp_path: Path) -> None:
    # The session's Ray keeps token auth on (Ray's default), with its token in ~/.ray/auth_token.
    address = attached_env["RAY_ADDRESS"]
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    cli_env = {k: v for k, v in attached_env.items() if k != "RAY_ADDRESS"}
    # This shell has neither RAY_AUTH_MODE nor a token (HOME without ~/.ray/auth_token).
    env = {k: v for k, v in cli_env.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)
    started = time.monotonic()
    result = raydist(["run", "--address", address, "-n", "1", "tests/scripts/cli_fail.py", "exit-0"], env, timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, explain(result)
    assert f"the Ray cluster at {address}" in result.stderr and "requires token authentication" in result.stderr, explain(result)
    assert "RAY_AUTH_MODE=token" in result.stderr and "~/.ray/auth_token" in result.stderr
    assert result.stderr.count("InvalidAuthToken") <= 1, explain(result)  # said once, not once a second
    assert elapsed < 15, f"took {elapsed:.1f} s (interpreter start included)"
    # With the token, the same command runs.
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    result = raydist(["run", "--address", address, "-n", "1", "tests/scripts/cli_fail.py", "none"], env)
    assert result.returncode == 0, explain(result)
    assert "rank 0 finished" in result.stdout, explain(result)


def head_state(head: RayHead) -> str:
    """What a failure next to a head must show: whether it still runs, and its
    ``ray start`` log (which names a subprocess that took the head down)."""
    status = "running" if head.process is not None and head.process.poll() is None else "exited"
    return f"\n--- the head's ray start ({status}):\n{head.start_log()[-3000:]}"


def hold_port(port: int) -> socket.socket:
    """Another program's server on ``port``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("0.0.0.0", port))
    sock.listen()
    return sock


@pytest.mark.soak  # the test harness's own head (ray_head.py), not raydist: every attached test uses it
@pytest.mark.timeout(150)
def test_a_port_taken_while_the_head_starts_costs_a_new_head_not_a_dead_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # The client server binds its port seconds after the dashboard answers; a port taken meanwhile made it
    # exit, and `ray start --block` then killed the head's GCS under the test that used it.
    held: List[socket.socket] = []

    def client_port_taken_first(count: int) -> List[int]:
        ports = real_free_ports(count)
        if not held:
            held.append(hold_port(ports[ray_head.PORT_OPTIONS.index("ray-client-server-port")]))
        return ports

    real_free_ports = ray_head.free_ports
    monkeypatch.setattr(ray_head, "free_ports", client_port_taken_first)
    head = RayHead(num_cpus=1)
    try:
        head.start()
        assert len(head.failed_starts) == 1 and "ray-client-server-port" in head.failed_starts[0], head.failed_starts
        serving = ray_head.listeners()
        own = set(head.own_processes())
        for name, port in head.ports.items():
            assert serving.get(port, set()) & own, f"nothing of the head listens on its {name} port {port}" + head_state(head)
        assert head.ray("job", "list", "--address", head.url).returncode == 0, head_state(head)
    finally:
        head.stop()
        for sock in held:
            sock.close()


HEAD_OF_A_CHILD = """
import threading
from ray_head import RayHead
head = RayHead(num_cpus=1).start()
print(head.process.pid, head.temp_dir, flush=True)
threading.Event().wait()  # until killed
"""


@pytest.mark.soak  # the test harness's own head (ray_head.py), not raydist
@pytest.mark.timeout(150)
def test_a_head_ends_with_the_test_process_that_started_it() -> None:
    # A tier cut short (its process killed) once left a `ray start --head --block` running for hours.
    child = subprocess.Popen([sys.executable, "-c", HEAD_OF_A_CHILD], stdout=subprocess.PIPE, text=True, cwd=REPO)
    pid, temp_dir = 0, ""
    try:
        line = child.stdout.readline() if child.stdout else ""  # the head is up (or the child failed: "")
        assert line, f"the child's head did not start (exit status {child.wait()})"
        pid, temp_dir = int(line.split()[0]), line.split()[1]
        child.kill()  # no teardown runs
        child.wait()
        deadline = time.monotonic() + 30
        while (left := head_processes(pid, temp_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)  # the head stops on its own: poll, with a deadline
        assert not left, "the head outlived the process that started it:\n" + "\n".join(left)
    finally:
        if child.poll() is None:
            child.kill()
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if process.pid == pid or (temp_dir and temp_dir in " ".join(process.cmdline())):
                    process.kill()
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)


def head_processes(ray_start_pid: int, temp_dir: str) -> List[str]:
    """The head's ``ray start`` and every process naming its temp dir, alive."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            command = " ".join(process.cmdline())
            if process.status() != psutil.STATUS_ZOMBIE and (process.pid == ray_start_pid or temp_dir in command):
                found.append(f"{process.pid} {command[:160]}")
    return found


@pytest.mark.soak  # a second error-file case (test_script_endings' runs in make test)
def test_a_record_script_shows_its_error_file_as_torchrun_does(attached_env: Dict[str, str]) -> None:
    script = "tests/scripts/record_fail.py"
    ours = raydist(["run", "-n", "2", "--accelerator", "cpu", script], attached_env)
    assert ours.returncode == 1, explain(ours)
    # Without a log directory the file was raydist's scratch, gone with the worker: not named.
    assert "(its error file: ValueError: shard 1 is corrupt (recorded))" in ours.stderr, explain(ours)
    torchrun = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script],
        cwd=REPO,
        env=attached_env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert torchrun.returncode == 1, explain(torchrun)
    # The same message and the same traceback (from the error file) as torchrun's report.
    expected = [
        f'File "{REPO / script}", line 9, in load_shard',
        'raise ValueError(f"shard {rank} is corrupt (recorded)")',
        "ValueError: shard 1 is corrupt (recorded)",
    ]
    for output in (torchrun.stderr, ours.stderr):
        lines = [line.strip() for line in output.splitlines()]
        assert all(text in lines for text in expected), explain(torchrun) + explain(ours)


def test_the_driver_side_never_imports_torch() -> None:
    # torch costs a driver over a second to import and to tear down; only workers need it.
    code = "import sys, raydist, raydist.api, raydist.cli; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", explain(result)


def test_parsing_imports_neither_ray_nor_torch() -> None:
    code = (
        "import sys, raydist.cli as c; p = c.build_parser()[1]; "
        "c.build_config(p.parse_args(['-n', '2', '--backend', 'gloo', 'x.py'])); "
        "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
