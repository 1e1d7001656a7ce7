"""Shared helpers for the benchmarks: machine line, quiet Ray start, timing
statistics and markdown tables (so the output pastes into README.md as is)."""

from __future__ import annotations

import logging
import math
import os
import platform
import socket
import statistics
import time
from typing import Any, Iterable, List, Optional, Sequence


def machine_line() -> str:
    """Cores, architecture, memory and the versions the figures depend on."""
    import psutil
    import ray
    import torch

    gib = psutil.virtual_memory().total / 2**30
    gpu = "GPU" if torch.cuda.is_available() else "no GPU"
    return (
        f"{os.cpu_count()}-core {platform.machine()}, {gib:.0f} GiB, {gpu}, "
        f"Python {platform.python_version()}, torch {torch.__version__}, Ray {ray.__version__}"
    )


BENCH_DIR = os.path.dirname(os.path.abspath(__file__))


def expose_to_workers() -> None:
    """Put this folder on the import path of processes started from now on
    (Ray workers, torchrun), so they can import the benchmark modules that
    define the functions and classes they run."""
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if BENCH_DIR not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [BENCH_DIR, *paths] if p)


def init_ray(**kwargs: Any) -> None:
    """ray.init with the benchmarks' defaults: a new local instance (never one
    found running on the machine), no dashboard (it competes for the cores) and
    no worker output forwarded to the driver, unless overridden."""
    import ray

    expose_to_workers()
    kwargs.setdefault("address", "local")
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("log_to_driver", False)
    kwargs.setdefault("logging_level", logging.WARNING)
    ray.init(**kwargs)


def wait_for_quiet_cpu(threshold_percent: float = 40.0, timeout_s: float = 1.5) -> None:
    """Give the previous sample's processes a moment to finish exiting, so that
    one sample does not pay for another's teardown. Bounded: on a machine busy
    with other work the CPU never goes quiet."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if psutil.cpu_percent(interval=0.25) < threshold_percent:
            return


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): an observed value, no interpolation."""
    ordered = sorted(samples)
    rank = math.ceil(q / 100 * len(ordered))
    return ordered[max(0, min(len(ordered), rank) - 1)]


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def fmt_s(seconds: Optional[float]) -> str:
    return "n/a" if seconds is None else f"{seconds:.2f} s"


def fmt_ms(seconds: Optional[float]) -> str:
    if seconds is None:
        return "n/a"
    ms = seconds * 1000
    return f"{ms:.3f} ms" if ms < 1 else f"{ms:.2f} ms" if ms < 100 else f"{ms:.0f} ms"


def fmt_ratio(numerator: Optional[float], denominator: Optional[float]) -> str:
    if numerator is None or denominator is None or denominator <= 0:
        return "n/a"
    return f"{numerator / denominator:.2f}x"


def fmt_bytes(nbytes: int) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"


def verdict(met: Optional[bool]) -> str:
    return "n/a" if met is None else "MET" if met else "MISSED"


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A markdown table, columns padded so it also reads well in a terminal."""
    body: List[List[str]] = [[str(cell) for cell in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(columns)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print(f"\n{title}\n", flush=True)
    print(line(columns))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in body:
        print(line(row))
    print(flush=True)


def _cpu_ticks() -> List[int]:
    """The machine's CPU time by kind since boot (/proc/stat; empty where there is none)."""
    try:
        with open("/proc/stat") as stat:
            return [int(v) for v in stat.readline().split()[1:9]]
    except OSError:
        return []


_TICKS_AT_START = _cpu_ticks()
STEAL = 7  # /proc/stat's eighth column: time the hypervisor ran something else on this machine's cores


def load_line() -> str:
    """Load averages, and the share of the cores' time a hypervisor took since this
    benchmark started (steal): figures taken while other work ran on the machine,
    or on a virtual machine whose cores were shared, say so."""
    one, five, _ = os.getloadavg()
    line = f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"
    now = _cpu_ticks()
    if now and _TICKS_AT_START:
        spent = [b - a for a, b in zip(_TICKS_AT_START, now)]
        line += f", {100 * spent[STEAL] / max(1, sum(spent)):.0f} % of their time stolen since the start"
    return line


def header(name: str) -> None:
    print(f"== {name} ==  ({machine_line()}; {load_line()})", flush=True)


def two_simulated_nodes(store_gib: float, cpus: int = 3) -> Any:
    """Two raylets on this machine (``ray.cluster_utils.Cluster``), this process
    attached. Each node's object store is sized as a real node's is (Ray's
    default: 30 % of memory), not the 150 MiB of Ray's test cluster, which a
    100 MB state per rank does not fit (Ray spills it to disk)."""

    import ray
    from ray.cluster_utils import Cluster

    store = int(store_gib * 2**30)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "include_dashboard": False, "object_store_memory": store})
    cluster.add_node(num_cpus=cpus, object_store_memory=store)
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
    return cluster
