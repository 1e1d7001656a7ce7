"""Where ``save_state``'s CPU goes: CPU seconds per save, by process, and the
stages of a rank's background send (CPU of the sending thread, wall time).

4 ranks on a simulated 2-node cluster (as ``benchmarks/state.py``), state =
a model plus Adam of about ``--mb`` MB per rank. The ranks do nothing but
save (idle between saves), so every CPU second counted between the first
and the last timed save is the saves' own: the ranks' loop-blocking copy and
background thread, the raylets (object store, the transfer to the other
node), the keeper and its holder. On a machine whose cores the training
keeps busy, that CPU is taken from the training steps.

    python benchmarks/state_cpu.py [--mb 100] [--saves 5]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import expose_to_workers, load_line, machine_line, two_simulated_nodes
from state import SHARED, build

import raydist

STAGES: Dict[str, List[float]] = {}  # stage -> [thread CPU s, wall s] summed, in this rank


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            total = STAGES.setdefault(name, [0.0, 0.0])
            total[0] += time.thread_time() - cpu
            total[1] += time.perf_counter() - wall

    return wrapper


def instrument() -> None:
    """Time the stages of this rank's store where they are module-level names."""
    from raydist.pool.worker import state_client

    for name in ("host_copy", "pack"):
        if hasattr(state_client, name):
            setattr(state_client, name, _timed(name, getattr(state_client, name)))
    client = state_client.RayStateStore
    for name in ("save", "_send", "_store"):
        if hasattr(client, name):
            setattr(client, name, _timed(name, getattr(client, name)))
    state_client.ray.put = _timed("ray.put", state_client.ray.put)


def kind(process: Any) -> str:
    try:
        line = " ".join(process.cmdline())
    except Exception:  # noqa: BLE001 - gone meanwhile
        return "gone"
    for key, label in (
        ("raylet", "raylet"),
        ("gcs_server", "gcs"),
        ("StateKeeper", "keeper/holders"),
        ("RayWorker", "ranks"),
        ("IDLE", "idle workers"),
    ):
        if key in line:
            return label
    return "ray other" if "ray" in line else "other"


def cpu_by_kind() -> Dict[str, float]:
    import psutil

    totals: Dict[str, float] = {}
    for process in psutil.process_iter():
        try:
            times = process.cpu_times()
            label = kind(process)
        except Exception:  # noqa: BLE001 - gone meanwhile
            continue
        totals[label] = totals.get(label, 0.0) + times.user + times.system + times.children_user + times.children_system
    return totals


def profile(mb: int, saves: int, shared: bool, gap: float) -> Dict[str, Any]:
    instrument()
    model, optimizer = build(mb)
    kept = SHARED if shared else {}
    for step in range(2):  # keeper and holders started, both slots touched
        raydist.save_state(step, model=model, optimizer=optimizer, **kept)
    raydist.wait_committed()  # the newest step committed: nothing of these saves is on its way
    dist.barrier()
    STAGES.clear()
    before = cpu_by_kind() if dist.get_rank() == 0 else {}
    started = time.perf_counter()
    blocking = []
    for step in range(2, 2 + saves):
        time.sleep(gap)
        began = time.perf_counter()
        raydist.save_state(step, model=model, optimizer=optimizer, **kept)
        blocking.append(time.perf_counter() - began)
    raydist.wait_committed()
    dist.barrier()
    wall = time.perf_counter() - started
    after = cpu_by_kind() if dist.get_rank() == 0 else {}
    spent = {k: (after.get(k, 0.0) - before.get(k, 0.0)) / saves for k in after}
    return {
        "cpu": spent,
        "stages": {k: [v / saves for v in vs] for k, vs in STAGES.items()},
        "blocking": statistics.median(blocking),
        "wall": wall,
    }


def report(label: str, results: List[Dict[str, Any]], saves: int) -> None:
    cpu = results[0]["cpu"]
    print(f"\n## {label}: CPU seconds per save, by process ({saves} saves, whole machine)\n")
    print("| process | CPU s / save |\n|---|---|")
    for name, seconds in sorted(cpu.items(), key=lambda item: -item[1]):
        if abs(seconds) >= 0.005:
            print(f"| {name} | {seconds:.3f} |")
    print(f"| all | {sum(cpu.values()):.3f} |")
    print("\nper rank: stage: thread CPU s / wall s per save (save = the loop's blocking call)\n")
    for rank, result in enumerate(results):
        stages = ", ".join(f"{k} {v[0]:.3f}/{v[1]:.3f}" for k, v in sorted(result["stages"].items()))
        print(f"- rank {rank}: blocking {result['blocking']:.4f} s; {stages}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--gap", type=float, default=1.0, help="seconds idle before each save")
    parser.add_argument("--store-gib", type=float, default=3.0, help="object store per simulated node")
    options = parser.parse_args()
    import ray

    expose_to_workers()
    cluster = two_simulated_nodes(options.store_gib)
    print(machine_line())
    print(f"load average at the start: {os.getloadavg()}; object store {options.store_gib:g} GiB per node")
    for label, shared in (("per-rank state", False), ("shared state", True)):
        args = (options.mb, options.saves, shared, options.gap)
        report(label, raydist.run(profile, args=args, num_workers=4, placement_strategy="SPREAD"), options.saves)
    print(f"\nAt the end: {load_line()}")
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
