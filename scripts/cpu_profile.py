"""A pytest plugin that writes each test's wall time and the whole machine's
CPU time (from /proc/stat, so worker processes and Ray count too) as TSV:
what a test costs a CPU-bound tier on a small machine, comparable across
days when the machine's speed is not.

    PYTHONPATH=scripts CPU_PROFILE_OUT=/tmp/tier.tsv \\
        .venv/bin/python -m pytest -q -p cpu_profile -m "not soak" tests/live
"""

from __future__ import annotations

import os
import time
from typing import Any, Generator, List, Tuple

import pytest

_rows: List[Tuple[str, float, float]] = []


def _busy_cpu_seconds() -> float:
    """CPU time the machine spent on anything but idling, since boot."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle and iowait
    return (sum(values) - idle) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Generator[None, None, None]:
    cpu, wall = _busy_cpu_seconds(), time.monotonic()
    yield
    _rows.append((item.nodeid, time.monotonic() - wall, _busy_cpu_seconds() - cpu))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    path = os.environ.get("CPU_PROFILE_OUT", "cpu_profile.tsv")
    with open(path, "w") as out:
        out.write("test\twall_s\tcpu_s\n")
        for nodeid, wall, cpu in _rows:
            out.write(f"{nodeid}\t{wall:.2f}\t{cpu:.2f}\n")
    wall, cpu = sum(r[1] for r in _rows), sum(r[2] for r in _rows)
    terminalreporter.write_line(f"cpu_profile: {wall:.0f} s wall, {cpu:.0f} CPU-s over {len(_rows)} tests, in {path}")
