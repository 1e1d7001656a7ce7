"""Training state: what ``save_state`` costs the loop, and failure -> first
step with the state restored, against saving to disk. 4 ranks on a simulated
2-node cluster (``ray.cluster_utils.Cluster``, 3 CPU slots per node), state =
a model plus Adam of about ``--mb`` MB per rank (CPU tensors); each node's
object store ``--store-gib`` (3 GiB).

* save: the time one call blocks the loop, per rank (median over saves):
  ``raydist.save_state`` (its return, plus what the next ``optimizer.step()``,
  a step's work later, waits for the copy of the optimizer's tensors; the
  rest runs in the background) against ``torch.save`` to local disk, ``torch.distributed.checkpoint.save``
  and the blocking part of ``async_save``, of the same state, in the same run.
* overhead: step time of a fixed ~``--step-ms`` ms step (and an
  ``optimizer.step()`` that changes nothing, but waits as a real one would) with no saving,
  saving every step and every 10 steps (save_state), interleaved; after the
  run's first commit, which starts the keeper and its holders (once per
  run: its time is printed apart); the time the loop spent in the save and
  the optimizer's step; the commit lag (how many steps the committed step
  trails the one being saved). The step keeps the CPU busy (4 ranks on the
  machine's cores, so any copy in the background slows it), or with
  ``--idle-steps`` leaves it free, as a rank whose GPU does the work. A
  table per ``--state-overhead`` (the run's ``state_overhead``: by default
  the default, 0.05, and ``none``, every step the ranks can send).
* recovery: a rank dies (``os._exit``, after writing ``time.time()``), or a
  node holding two of the ranks is removed (``Cluster.remove_node``; the
  driver writes the time just before), with a third node as big added before
  the loss to take them; the clock stops when rank 0 has loaded the state
  and finished its first step of the next attempt: crash with a spare,
  without, the node loss (warm), a fresh restart that ``torch.load``s the
  last checkpoint from local disk, and ``torchrun --max-restarts 1`` +
  ``torch.load``.
* ``--shared``: the model and optimizer saved as shared state (DDP's case:
  one copy per node) against torch.save by rank 0 alone; save_state(shared)
  and torch.save in the save table, every 10 steps in the overhead table,
  the crashes with a spare (and torchrun) in the recovery table. It is how a
  state of ``--mb 1000`` fits a small machine (``--store-gib 4``): per rank
  it would take 1 GB x 4 ranks x 2 places x 2 steps of object store.

    python benchmarks/state.py [--mb 100] [--parts save,overhead,recovery] [--quick] [--idle-steps] [--state-overhead 0.05,none] [--reps N] [--cases TEXT,...]
    python benchmarks/state.py --mb 1000 --shared --store-gib 4
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_leaves

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import expose_to_workers, load_line, machine_line, two_simulated_nodes
from _state_recovery import SHARED, build, busy, recovery_table

import raydist


def _time_dcp(state: Dict[str, Any], folder: str, tag: str, times: Dict[str, List[float]]) -> None:
    """DCP's save and the blocking part of its async_save, each removed once timed (disk stays bounded)."""
    import torch.distributed.checkpoint as dcp

    started = time.perf_counter()
    dcp.save(state, checkpoint_id=os.path.join(folder, f"dcp-{tag}"))
    times["dcp.save"].append(time.perf_counter() - started)
    started = time.perf_counter()
    future = dcp.async_save(state, checkpoint_id=os.path.join(folder, f"adcp-{tag}"))
    times["dcp.async_save"].append(time.perf_counter() - started)
    future.result()
    dist.barrier()  # every rank has written its part before rank 0 removes the folders
    if dist.get_rank() == 0:
        for name in (f"dcp-{tag}", f"adcp-{tag}"):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def save_costs(mb: int, saves: int, folder: str, gap_ms: float, shared_only: bool = False) -> Dict[str, float]:
    """Seconds one call blocks, median per method, for this rank. Each save_state
    comes ``gap_ms`` of work after the previous one (as when saving every 10
    steps of 200 ms): what it blocks for is the copy, not a step still in flight.
    ``shared_only``: save_state(shared) against DDP's torch.save by rank 0 alone."""
    model, optimizer = build(mb)
    optimizer.zero_grad(set_to_none=True)  # its step() below changes nothing: only its wait is timed
    raydist.load_state(model=model, optimizer=optimizer)  # as a loop begins
    rank = dist.get_rank()
    kinds: List[Tuple[str, Dict[str, Any]]] = [("save_state(shared)", SHARED)]
    if not shared_only:
        kinds.insert(0, ("save_state", {}))
    times: Dict[str, List[float]] = {name: [] for name in [k for k, _ in kinds] + ["torch.save", "dcp.save", "dcp.async_save"]}
    times.update({f"{name}: of which optimizer.step waits": [] for name, _ in kinds})
    for index, (name, kept) in enumerate(kinds):
        for step in range(saves):
            busy(gap_ms)
            started = time.perf_counter()
            raydist.save_state(100 * index + step, model=model, optimizer=optimizer, **kept)  # type: ignore[arg-type]
            returned = time.perf_counter() - started
            busy(gap_ms / 10)  # the next step's forward and backward, then its optimizer step
            started = time.perf_counter()
            optimizer.step()
            waited = time.perf_counter() - started
            times[name].append(returned + waited)
            times[f"{name}: of which optimizer.step waits"].append(waited)
            if rank == 0 or not shared_only:
                started = time.perf_counter()
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(folder, f"r{rank}.pt"))
                times["torch.save"].append(time.perf_counter() - started)
            if not shared_only:
                _time_dcp({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, folder, f"{index}-{step}", times)
    return {name: statistics.median(values) for name, values in times.items() if values}


def _saver(how: str, model: Any, optimizer: Any, folder: str) -> Any:
    """One way to save at a step: save_state (per rank or shared), torch.save, DCP's async_save, or a plain copy."""
    import torch.distributed.checkpoint as dcp

    pending: List[Any] = []
    copies: List[Any] = []
    # async_save finishes with collectives of its own in a thread: a group of its
    # own keeps them apart from the loop's (on the default group they interleave and hang).
    group = dist.new_group(backend="gloo") if how == "dcp" else None

    def save(step: int) -> None:
        if how == "copy":  # one copy of every tensor into memory reused from step to step: what any snapshot must at least do
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            live = [leaf for leaf in tree_leaves(state) if isinstance(leaf, torch.Tensor)]
            if not copies:
                copies.extend(torch.empty_like(t) for t in live)
            for copy, tensor in zip(copies, live):
                copy.copy_(tensor)
        elif how.startswith("save_state"):
            kept = SHARED if "shared" in how else {}
            raydist.save_state(step, model=model, optimizer=optimizer, **kept)  # type: ignore[arg-type]
        elif how.startswith("torch.save"):
            if how.endswith("rank 0") and dist.get_rank() != 0:
                return
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
    ("a copy of the state every step, in the loop (the floor)", "copy", 1),
    ("save_state every step", "save_state", 1),
    ("save_state(shared) every step", "save_state shared", 1),
]
SHARED_OVERHEAD_CASES = [
    ("none", "", 0),
    ("save_state(shared) every 10", "save_state shared", 10),
    ("torch.save (rank 0) every 10", "torch.save rank 0", 10),
]


def first_commit(model: Any, optimizer: Any, step_ms: float, kept: Dict[str, Any]) -> float:
    """A loop's start (``load_state``, then a step), its first save, then seconds until
    that save is committed. Once per run: the keeper and its holders start for it."""
    raydist.load_state(model=model, optimizer=optimizer)  # as a loop begins: the keeper starts here
    busy(step_ms)
    raydist.save_state(0, model=model, optimizer=optimizer, **kept)  # type: ignore[arg-type]
    started = time.perf_counter()
    raydist.wait_committed()
    return time.perf_counter() - started


def overhead(mb: int, steps: int, step_ms: float, folder: str, shared_only: bool = False, idle: bool = False) -> Dict[str, Any]:
    """Mean step time (s) of a fixed step with a barrier, for each way of saving,
    after the run's first commit (reported apart: ``first commit``); for save_state,
    the commit lag: how many steps the committed one trails the step being saved
    (mean and most, read without waiting just before each save)."""
    model, optimizer = build(mb)
    optimizer.zero_grad(set_to_none=True)  # its step() in the loop changes nothing: it only waits for save_state's copy
    first = first_commit(model, optimizer, step_ms, SHARED if shared_only else {})
    times: Dict[str, float] = {}
    lags: Dict[str, Tuple[float, int]] = {}
    waits: Dict[str, float] = {}  # seconds per step the loop spent in the save and in optimizer.step()
    base = 1
    for label, how, every in SHARED_OVERHEAD_CASES if shared_only else OVERHEAD_CASES:
        save = _saver(how, model, optimizer, folder)
        behind: List[int] = []
        waited = 0.0
        dist.barrier()
        started = time.perf_counter()
        for step in range(steps):
            if idle:  # the CPU free while the step runs (as when the GPU does the work)
                time.sleep(step_ms / 1000)
            else:
                busy(step_ms)
            before = time.perf_counter()
            optimizer.step()
            waited += time.perf_counter() - before
            dist.barrier()
            if every and step % every == 0:
                committed = raydist.wait_committed(timeout=0) if how.startswith("save_state") else None
                if committed is not None and committed >= base:  # (before its first commit: the previous case's)
                    behind.append(base + step - committed)
                before = time.perf_counter()
                save(base + step)
                waited += time.perf_counter() - before
        dist.barrier()
        times[label] = (time.perf_counter() - started) / steps
        waits[label] = waited / steps
        if behind:
            lags[label] = (statistics.mean(behind), max(behind))
        raydist.wait_committed()  # the next case starts with nothing on its way
        dist.barrier()
        base += steps
    return {"first commit": first, "times": times, "lags": lags, "waits": waits}


def _what(options: argparse.Namespace) -> str:
    if options.shared:
        return f"{options.mb} MB of model + Adam, the same on every rank, saved as shared state (once per node); torch.save by rank 0"
    return f"{options.mb} MB per rank"


def print_save_costs(options: argparse.Namespace, folder: str) -> None:
    gap = 10 * options.step_ms
    args = (options.mb, options.saves, folder, gap, options.shared)
    costs = raydist.run(save_costs, args=args, num_workers=4, placement_strategy="SPREAD")
    print(
        f"\n## blocking time of one save, {_what(options)} (median, rank 0; saves {gap / 1000:g} s of work apart)\n\n"
        "| method | seconds | vs torch.save |\n|---|---|---|"
    )
    for name, seconds in costs[0].items():
        print(f"| {name} | {seconds:.4f} | {seconds / costs[0]['torch.save']:.2f}x |")


def print_overhead(options: argparse.Namespace, folder: str) -> None:
    for text in options.state_overhead.split(","):
        print_overhead_at(options, folder, None if text.strip().lower() == "none" else float(text))


def print_overhead_at(options: argparse.Namespace, folder: str, budget: Optional[float]) -> None:
    steps = options.steps or (10 if options.quick else 30)
    args = (options.mb, steps, options.step_ms, folder, options.shared, options.idle_steps)
    result = raydist.run(overhead, args=args, num_workers=4, placement_strategy="SPREAD", state_overhead=budget)[0]
    times, lags = result["times"], result["lags"]
    print(
        f"\n## step time, {_what(options)} ({options.step_ms:g} ms of {'idle ' if options.idle_steps else ''}work + a barrier, "
        f"{steps} steps each), state_overhead={budget}\n\n"
        "The commit lag: how many steps the committed step trails the one being saved, read just before each save, "
        "from the case's first commit on (rank 0; a save every 10 steps trails by 10 when each commit comes before the next save).\n\n"
        "| saving | step s | overhead | of which in the save and optimizer.step() | commit lag, mean / most (steps) |\n|---|---|---|---|---|"
    )
    waits = result["waits"]
    for label, seconds in times.items():
        lag = f"{lags[label][0]:.1f} / {lags[label][1]}" if label in lags else "-"
        waited = f"{1000 * (waits[label] - waits['none']):+.1f} ms"
        print(f"| {label} | {seconds:.4f} | {100 * (seconds / times['none'] - 1):+.1f} % | {waited} | {lag} |")
    print(
        f"\nOnce per run, before these: the first save was committed {result['first commit']:.2f} s after it returned "
        "(its keeper and holders start; the loop's load_state began that); no save waits for it."
    )


def print_recovery(options: argparse.Namespace, cluster: Any) -> None:
    where = (
        ""
        if options.shared
        else "; a node lost: the node with two ranks that is not the driver's is removed, a third node as big takes its ranks"
    )
    print(
        f"\n## failure -> first step with the state restored (rank 0), {_what(options)}{where}\n\n"
        "| case | seconds (median, range) | resumed after step | faster than torchrun | to the function / build / load / first step (s) |\n|---|---|---|---|---|"
    )
    cases = options.cases.split(",") if options.cases else None
    for row in recovery_table(options.mb, cluster, options.store_gib, options.shared, options.reps, cases):
        print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--step-ms", type=float, default=200.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="save,overhead,recovery", help="which tables, comma-separated")
    parser.add_argument("--reps", type=int, default=1, help="recovery: rounds of every case, interleaved (medians)")
    parser.add_argument("--cases", default="", help="recovery: only the cases whose label holds one of these, comma-separated")
    parser.add_argument("--store-gib", type=float, default=3.0, help="object store per simulated node")
    parser.add_argument("--shared", action="store_true", help="save the model and optimizer as shared state (DDP's case) only")
    parser.add_argument(
        "--idle-steps", action="store_true", help="overhead: a step leaves the CPU free (a GPU's step), instead of busy on it"
    )
    parser.add_argument("--steps", type=int, default=0, help="overhead: steps per case (default 30, 10 with --quick)")
    parser.add_argument(
        "--state-overhead",
        default="0.05,none",
        help="overhead: the runs' state_overhead, comma-separated, a table each ('none': every step the ranks can send)",
    )
    options = parser.parse_args()
    import ray

    expose_to_workers()
    cluster = two_simulated_nodes(options.store_gib)
    print(machine_line())
    print(f"load average at the start: {os.getloadavg()}; object store {options.store_gib:g} GiB per node", flush=True)
    folder, parts = tempfile.mkdtemp(), options.parts.split(",")
    try:
        if "save" in parts:
            print_save_costs(options, folder)
        if "overhead" in parts:
            print_overhead(options, folder)
        if "recovery" in parts:
            print_recovery(options, cluster)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        print(f"\nAt the end: {load_line()}")
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
