"""Per-rank logs and the driver's output.

The routing rules are unit-tested (tests/unit/test_log_routes.py); the driver's
output is checked here end to end in a subprocess attached to the session's
Ray, whose stdout and stderr are pipes (so also: no colour codes).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest
from test_cli import REPO, attached_env, cli_env, explain, ray_tmpdir  # noqa: F401 - fixtures

DRIVER = textwrap.dedent(
    """
    import logging, sys, ray, raydist

    def last_line(call):
        rank = raydist.get_context().rank
        print(f"rank {rank} printed in call {call}")
        print(f"rank {rank} warned in call {call}", file=sys.stderr)
        return call

    # RAY_ADDRESS: the session's Ray (a private one costs its start, not under test here);
    # WARNING: not Ray's own banner on attaching (its dashboard's address, in colour).
    ray.init(logging_level=logging.WARNING)
    with raydist.WorkerGroup(2, accelerator="cpu") as group:
        for call in range(CALLS):
            assert group.run(last_line, args=(call,)) == [call, call]
            print(f"driver: call {call} returned", flush=True)
            print(f"driver: call {call} returned", file=sys.stderr, flush=True)
    for call in range(CALLS, CALLS + RUNS):
        assert raydist.run(last_line, args=(call,), num_workers=2, accelerator="cpu") == [call, call]
        print(f"driver: call {call} returned", flush=True)
        print(f"driver: call {call} returned", file=sys.stderr, flush=True)
    """
)


def check_order(output: str, calls: int, worker_line: str) -> None:
    """Each call's lines from both ranks come before the driver's line after it returned."""
    lines = output.splitlines()
    position = {line: index for index, line in enumerate(lines)}
    for call in range(calls):
        returned = position[f"driver: call {call} returned"]
        for rank in (0, 1):
            ours = [i for i, line in enumerate(lines) if line.endswith(worker_line.format(rank=rank, call=call))]
            assert len(ours) == 1, (call, rank, output)
            assert ours[0] < returned, f"rank {rank}'s line of call {call} came after run() returned:\n{output}"


@pytest.mark.timeout(300)
def test_every_line_arrives_before_run_returns(attached_env: Dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    calls, runs = 20, 1  # each raydist.run starts fresh workers (seconds each): 20 calls on a group, 1 run
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.replace("CALLS", str(calls)).replace("RUNS", str(runs)))
    result = subprocess.run([sys.executable, str(script)], cwd=REPO, env=attached_env, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, explain(result)
    check_order(result.stdout, calls + runs, "rank {rank} printed in call {call}")
    check_order(result.stderr, calls + runs, "rank {rank} warned in call {call}")
    assert re.search(r"^\(rank=1 pid=\d+\) rank 1 printed in call 0$", result.stdout, flags=re.M), result.stdout
    assert "\x1b[" not in result.stdout + result.stderr, "colour codes in piped output"
