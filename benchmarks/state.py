"""Training state: what ``save_state`` costs the loop, and failure -> first
step with the state restored, against saving to disk. 4 ranks on a simulated
2-node cluster (``ray.cluster_utils.Cluster``, 3 CPU slots per node), state =
a model plus Adam of about ``--mb`` MB per rank (CPU tensors); each node's
object store ``--store-gib`` (3 GiB).

* save: the time one call blocks the loop, per rank (median over saves):
  ``raydist.save_state`` (the host copy; the rest runs in the background)
  against ``torch.save`` to local disk, ``torch.distributed.checkpoint.save``
  and the blocking part of ``async_save``, of the same state, in the same run.
* overhead: step time of a fixed ~``--step-ms`` ms step with no saving,
  saving every step and every 10 steps (save_state), interleaved.
* recovery: a rank dies (``os._exit``, after writing ``time.time()``); the
  clock stops when rank 0 has loaded the state and finished its first step
  of the next attempt: crash with a spare, without, a fresh restart that
  ``torch.load``s the last checkpoint from local disk, and ``torchrun
  --max-restarts 1`` + ``torch.load``.

    python benchmarks/state.py [--mb 100] [--reps 2] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import expose_to_workers, machine_line, two_simulated_nodes

import raydist


def build(mb: int) -> Any:
    """A model whose parameters hold ~mb/3 MB (Adam adds two moments: ~mb in all)."""
    width = max(64, int((mb * 2**20 / 3 / 4) ** 0.5))
    torch.manual_seed(0)  # the same on every rank, as DDP keeps it
    model = torch.nn.Linear(width, width, bias=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()  # the moments exist
    return model, optimizer


def busy(ms: float) -> None:
    """A step of fixed length (the work a real step does between saves)."""
    end = time.perf_counter() + ms / 1000
    x = torch.randn(64, 64)
    while time.perf_counter() < end:
        x = x @ x / 64


SHARED = {"shared": ["model", "optimizer"]}  # DDP's model and optimizer: the same on every rank


def save_costs(mb: int, saves: int, folder: str, gap_ms: float) -> Dict[str, float]:
    """Seconds one call blocks, median per method, for this rank. Each save_state
    comes ``gap_ms`` of work after the previous one (as when saving every 10
    steps of 200 ms): what it blocks for is the copy, not a step still in flight."""
    import torch.distributed.checkpoint as dcp

    model, optimizer = build(mb)
    rank = dist.get_rank()
    names = ["save_state", "save_state(shared)", "torch.save", "dcp.save", "dcp.async_save"]
    times: Dict[str, List[float]] = {name: [] for name in names}
    for index, kept in enumerate(({}, SHARED)):
        for step in range(saves):
            busy(gap_ms)
            started = time.perf_counter()
            raydist.save_state(100 * index + step, model=model, optimizer=optimizer, **kept)  # type: ignore[arg-type]
            times[names[index]].append(time.perf_counter() - started)
            started = time.perf_counter()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(folder, f"r{rank}.pt"))
            times["torch.save"].append(time.perf_counter() - started)
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            started = time.perf_counter()
            dcp.save(state, checkpoint_id=os.path.join(folder, f"dcp-{index}-{step}"))
            times["dcp.save"].append(time.perf_counter() - started)
            started = time.perf_counter()
            future = dcp.async_save(state, checkpoint_id=os.path.join(folder, f"adcp-{index}-{step}"))
            times["dcp.async_save"].append(time.perf_counter() - started)
            future.result()
    return {name: statistics.median(values) for name, values in times.items()}


def _saver(how: str, model: Any, optimizer: Any, folder: str) -> Any:
    """One way to save at a step: save_state (per rank or shared), torch.save, DCP's async_save."""
    import torch.distributed.checkpoint as dcp

    pending: List[Any] = []
    # async_save finishes with collectives of its own in a thread: a group of its
    # own keeps them apart from the loop's (on the default group they interleave and hang).
    group = dist.new_group(backend="gloo") if how == "dcp" else None

    def save(step: int) -> None:
        if how.startswith("save_state"):
            kept = SHARED if "shared" in how else {}
            raydist.save_state(step, model=model, optimizer=optimizer, **kept)  # type: ignore[arg-type]
        elif how == "torch.save":
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(folder, f"o{dist.get_rank()}.pt"))
        else:  # one async_save in flight at a time, as DCP asks
            if pending:
                pending.pop().result()
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            pending.append(dcp.async_save(state, checkpoint_id=os.path.join(folder, f"o-{step}"), process_group=group))

    return save


OVERHEAD_CASES = [
    ("none", "", 0),
    ("save_state every 10", "save_state", 10),
    ("save_state(shared) every 10", "save_state shared", 10),
    ("torch.save every 10", "torch.save", 10),
    ("dcp.async_save every 10", "dcp", 10),
    ("save_state every step", "save_state", 1),
    ("save_state(shared) every step", "save_state shared", 1),
]


def overhead(mb: int, steps: int, step_ms: float, folder: str) -> Dict[str, float]:
    """Mean step time (s) of a fixed step with a barrier, for each way of saving."""
    model, optimizer = build(mb)
    result: Dict[str, float] = {}
    base = 0
    for label, how, every in OVERHEAD_CASES:
        save = _saver(how, model, optimizer, folder)
        dist.barrier()
        started = time.perf_counter()
        for step in range(steps):
            busy(step_ms)
            dist.barrier()
            if every and step % every == 0:
                save(base + step)
        dist.barrier()
        result[label] = (time.perf_counter() - started) / steps
        base += steps
    return result


def recover(mb: int, steps: int, crash_at: int, marks: str, disk: Optional[str] = None) -> None:
    """Train; rank 1 dies at ``crash_at`` on attempt 0; rank 0 of the next attempt
    writes when its first step after loading ended. ``disk``: torch.save/torch.load instead."""
    if not dist.is_initialized() and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun keeps its agent store across restarts: a prefix per attempt (see benchmarks/elastic.py).
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        prefixed = dist.PrefixStore(f"attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)
        dist.init_process_group("gloo", store=prefixed, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    elif not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, attempt = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model, optimizer = build(mb)
    path = os.path.join(disk, f"rank{rank}.pt") if disk else ""
    if disk:
        start = None
        if os.path.exists(path):
            saved = torch.load(path, weights_only=False)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            start = saved["step"]
    else:
        start = raydist.load_state(model=model, optimizer=optimizer)
    for step in range(0 if start is None else start + 1, steps):
        if attempt == 0 and step == crash_at and rank == 1:
            with open(os.path.join(marks, "crash"), "w") as file:
                file.write(repr(time.time()))
            os._exit(1)
        busy(20)
        dist.barrier()
        if disk:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)
        else:
            raydist.save_state(step, model=model, optimizer=optimizer)
        if attempt > 0 and rank == 0 and not os.path.exists(os.path.join(marks, "first")):
            with open(os.path.join(marks, "first"), "w") as file:
                file.write(f"{time.time()!r} {start}")


def _recovery_seconds(marks: str) -> Tuple[float, str]:
    """Seconds from the crash to rank 0's first step after loading, and the step it resumed after."""
    crashed = float(open(os.path.join(marks, "crash")).read())
    first, start = open(os.path.join(marks, "first")).read().split()
    return float(first) - crashed, start


def recovery_table(mb: int) -> List[str]:
    """One row per case: seconds, the step resumed after, and torchrun's time over the case's."""
    measured: List[Tuple[str, Tuple[float, str]]] = []
    cases = [
        ("crash, spare", {"spare_workers": 1, "resources_per_worker": {"CPU": 0.5}}, False),
        ("crash, no spare", {}, False),
        ("fresh + torch.load", {"restart_mode": "fresh"}, True),
    ]
    for label, options, disk in cases:
        marks = tempfile.mkdtemp()
        raydist.run(recover, args=(mb, 12, 6, marks, marks if disk else None), num_workers=4, max_restarts=1, **options)
        measured.append((label, _recovery_seconds(marks)))
    marks = tempfile.mkdtemp()
    script = f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); import state; state.recover({mb}, 12, 6, {marks!r}, {marks!r})"
    with open(os.path.join(marks, "run.py"), "w") as file:
        file.write(script)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            "--max-restarts",
            "1",
            os.path.join(marks, "run.py"),
        ],
        check=True,
        capture_output=True,
    )
    measured.append(("torchrun --max-restarts 1 + torch.load", _recovery_seconds(marks)))
    anchor = measured[-1][1][0]
    return [f"| {label} | {seconds:.2f} | {start} | {anchor / seconds:.1f}x |" for label, (seconds, start) in measured]


def print_save_costs(options: argparse.Namespace, folder: str) -> None:
    gap = 10 * options.step_ms
    costs = raydist.run(save_costs, args=(options.mb, options.saves, folder, gap), num_workers=4, placement_strategy="SPREAD")
    print(
        f"\n## blocking time of one save, {options.mb} MB per rank (median, rank 0; saves {gap / 1000:g} s of work apart)\n\n"
        "| method | seconds | vs torch.save |\n|---|---|---|"
    )
    for name, seconds in costs[0].items():
        print(f"| {name} | {seconds:.4f} | {seconds / costs[0]['torch.save']:.2f}x |")


def print_overhead(options: argparse.Namespace, folder: str) -> None:
    steps = 10 if options.quick else 30
    times = raydist.run(overhead, args=(options.mb, steps, options.step_ms, folder), num_workers=4, placement_strategy="SPREAD")[0]
    print(
        f"\n## step time ({options.step_ms:g} ms of work + a barrier, {steps} steps each)\n\n| saving | step s | overhead |\n|---|---|---|"
    )
    for label, seconds in times.items():
        print(f"| {label} | {seconds:.4f} | {100 * (seconds / times['none'] - 1):+.1f} % |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--step-ms", type=float, default=200.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="save,overhead,recovery", help="which tables, comma-separated")
    parser.add_argument("--store-gib", type=float, default=3.0, help="object store per simulated node")
    options = parser.parse_args()
    import ray

    expose_to_workers()
    cluster = two_simulated_nodes(options.store_gib)
    print(machine_line())
    print(f"load average at the start: {os.getloadavg()}; object store {options.store_gib:g} GiB per node")
    folder, parts = tempfile.mkdtemp(), options.parts.split(",")
    if "save" in parts:
        print_save_costs(options, folder)
    if "overhead" in parts:
        print_overhead(options, folder)
    if "recovery" in parts:
        print(
            "\n## failure -> first step with the state restored (rank 0)\n\n"
            "| case | seconds | resumed after step | faster than torchrun |\n|---|---|---|---|"
        )
        for row in recovery_table(options.mb):
            print(row)
    print(f"\nload average at the end: {os.getloadavg()}")
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
