"""A pytest plugin that writes each test's wall time, the whole machine's CPU
time (from /proc/stat, so worker processes and Ray count too) and the time
the hypervisor took from this machine's cores (steal) as TSV: what a test
costs a CPU-bound tier on a small machine, comparable across days when the
machine's speed is not. Steal is not counted as CPU time: a core it is taken
from runs none of the tier's work meanwhile, and on a shared virtual machine
it moves from day to day (two spinning processes here have lost 40 % of their
time to it).

    PYTHONPATH=scripts CPU_PROFILE_OUT=/tmp/tier.tsv \\
        .venv/bin/python -m pytest -q -p cpu_profile -m "not soak" tests/live
"""

from __future__ import annotations

import os
import time
from typing import Any, Generator, List, Tuple

import pytest

_rows: List[Tuple[str, float, float, float]] = []


def _cpu_and_steal_seconds() -> Tuple[float, float]:
    """CPU time the machine spent on its own work, and the time stolen from it, since boot."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in stat.readline().split()[1:9])
    # (guest time is already part of user and nice)
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Generator[None, None, None]:
    (cpu, steal), wall = _cpu_and_steal_seconds(), time.monotonic()
    yield
    cpu_after, steal_after = _cpu_and_steal_seconds()
    _rows.append((item.nodeid, time.monotonic() - wall, cpu_after - cpu, steal_after - steal))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    path = os.environ.get("CPU_PROFILE_OUT", "cpu_profile.tsv")
    with open(path, "w") as out:
        out.write("test\twall_s\tcpu_s\tsteal_s\n")
        for nodeid, wall, cpu, steal in _rows:
            out.write(f"{nodeid}\t{wall:.2f}\t{cpu:.2f}\t{steal:.2f}\n")
    wall, cpu, steal = (sum(r[i] for r in _rows) for i in (1, 2, 3))
    terminalreporter.write_line(
        f"cpu_profile: {wall:.0f} s wall, {cpu:.0f} CPU-s (and {steal:.0f} s stolen by the hypervisor) over {len(_rows)} tests, in {path}"
    )
