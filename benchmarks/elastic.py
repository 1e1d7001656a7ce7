"""Restarts: from a failure to the first completed training step of the new
world, on a simulated 3-node cluster (``ray.cluster_utils.Cluster``, 2 CPU
slots per node, all on this machine), warm (survivors keep their
processes) against fresh (every attempt in new processes) and torchrun.

* node-warm / node-fresh: ``raydist.run(train, num_workers=(2, 6),
  max_restarts=1)`` runs 6 workers; a node with ranks on it is removed; the
  run restarts with the 4 that still fit (``restart_mode`` warm / fresh).
* crash-spare / crash-warm / crash-fresh: ``num_workers=4, max_restarts=1``
  (with ``spare_workers=1`` for crash-spare); rank 3 dies (``os._exit``)
  in the middle of training; the run restarts at size 4.
* crash-torchrun: the same crash under ``torchrun --standalone
  --nproc-per-node 4 --max-restarts 1`` (4 processes on this machine).
* fixed: ``num_workers=4, max_restarts=1`` (PACK: two nodes hold the ranks,
  the third is free); a node with ranks on it is removed; Ray re-places the
  lost bundles on the free node and the run restarts with 4 workers.
* drain: as node-warm, but the node is drained as a spot preemption would
  (Ray's drain API, reason PREEMPTION, deadline 60 s) instead of removed:
  its ranks get SIGTERM, leave at the next step boundary, and the run
  restarts with 4 workers on the other nodes (not counted against
  max_restarts).

``train`` is a small DDP loop (gloo, one CPU thread per worker). The clock
starts just before the node is removed (``Cluster.remove_node``, which kills
the node's processes), the drain is requested, or the crashing rank calls
``os._exit`` (it writes ``time.time()`` first), and stops when rank 0 of the
new world has finished its first optimizer step (written to a file with
``time.time()``; every process runs on this machine, so the clocks agree).
Each sample also splits that time at the moment rank 0's function started
in the new world: before it, raydist noticed the failure and restarted
(kept, replaced and initialised the workers); after it, the function built
its model and took one step. After each node loss the lost node is replaced
by a fresh one. The modes are interleaved, so drift on a small machine hits
them alike.

    python benchmarks/elastic.py [--reps 3] [--quick] [--modes ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

NODES = 3
CPUS_PER_NODE = 2
TARGET_S = 2.0  # node loss and crash with a spare, warm: failure to first step in the new world
TORCHRUN_FACTOR = 3.0  # warm restarts at least this much faster than torchrun's
DRAIN_DEADLINE_S = 60
CRASH_RANK = 3
ELASTIC = {"num_workers": (2, 6), "max_restarts": 1}
FIXED = {"num_workers": 4, "max_restarts": 1}
MODES: Dict[str, Dict[str, Any]] = {
    "node-warm": {"fault": "node", "options": ELASTIC},
    "node-fresh": {"fault": "node", "options": {**ELASTIC, "restart_mode": "fresh"}},
    "crash-spare": {"fault": "crash", "options": {**FIXED, "spare_workers": 1}},
    "crash-warm": {"fault": "crash", "options": FIXED},
    "crash-fresh": {"fault": "crash", "options": {**FIXED, "restart_mode": "fresh"}},
    "crash-torchrun": {"fault": "crash", "options": None},
    "fixed": {"fault": "node", "options": FIXED},
    "drain": {"fault": "drain", "options": {"num_workers": (2, 6), "max_restarts": 0}},
}
TITLES = {
    "node-warm": "node lost, elastic (2, 6), warm",
    "node-fresh": "node lost, elastic (2, 6), fresh processes",
    "crash-spare": "rank crash, 4 + 1 spare, warm",
    "crash-warm": "rank crash, 4, warm (no spare)",
    "crash-fresh": "rank crash, 4, fresh processes",
    "crash-torchrun": "rank crash, torchrun --max-restarts 1",
    "fixed": "node lost, fixed 4, warm",
    "drain": "node drained (preemption), elastic (2, 6), warm",
}
STEP_PAUSE_S = 0.05  # between steps of the first attempt, so that 6 waiting ranks leave the 2 cores to the rest


def train(marker_dir: str) -> int:
    """A DDP loop. First attempt: note where each rank runs, then train until
    the group is torn down (or, warned by SIGTERM, leave at the next step
    boundary with status 143, as a checkpointing script would). Later
    attempts: note when the function started and when the first step
    finished, take one more step, return the world size."""
    start = time.time()
    import ray
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    warned = {"flag": False}
    if attempt == 0:
        signal.signal(signal.SIGTERM, lambda signum, frame: warned.update(flag=True))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank)
    step = 0
    while True:
        x = torch.randn(32, 64, generator=data)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()  # DDP's gradient all-reduce: the step completes on every rank together
        optimizer.step()
        step += 1
        if attempt > 0:
            if rank == 0 and step == 1:
                note = {"fn_start": start, "first_step": time.time(), "world": world}
                Path(marker_dir, f"attempt-{attempt}.json").write_text(json.dumps(note))
            if step >= 2:
                return world
            continue
        if step == 1:
            node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
            Path(marker_dir, f"running-{rank}.json").write_text(json.dumps({"rank": rank, "node_id": node}))
        if rank == CRASH_RANK and Path(marker_dir, "crash").exists():
            Path(marker_dir, "crashed.json").write_text(json.dumps({"at": time.time()}))
            os._exit(1)  # a process death, as a segfault or the OOM killer would leave it
        stop = torch.tensor([float(warned["flag"])])
        dist.all_reduce(stop)
        if stop.item() > 0:
            sys.exit(143)
        time.sleep(STEP_PAUSE_S)


# -- the driver's side ---------------------------------------------------------------


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)  # polling files or Ray's view, with a deadline


def cluster_idle(nodes: int) -> bool:
    """``nodes`` alive, not draining, with every CPU free."""
    import ray

    from raydist.pool.ray_private import available_resources_per_node, draining_nodes

    alive = {n["NodeID"]: n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]}
    if len(alive) != nodes or set(alive) & set(draining_nodes()):
        return False
    free = available_resources_per_node()
    return all(free.get(node, {}).get("CPU", 0) >= cpus for node, cpus in alive.items())


def drain(address: str, node_id: str, deadline_s: int) -> None:
    """What ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`` does,
    in this process (the CLI would add its own start-up to the timing)."""
    import ray
    from ray.core.generated import autoscaler_pb2

    gcs = ray._raylet.GcsClient(address=address)
    accepted, why = gcs.drain_node(
        node_id,
        autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        "benchmark: spot preemption",
        int((time.time() + deadline_s) * 1000),
    )
    if not accepted:
        raise RuntimeError(f"drain of {node_id[:12]} refused: {why}")


def one_sample(cluster: Any, mode: str, marker_dir: Path) -> Dict[str, Any]:
    """Run ``train`` in ``mode``, make it fail once every rank trains, and
    time it to the new world's first step."""
    wait_until(lambda: cluster_idle(NODES), 60, f"{NODES} idle nodes")
    marker_dir.mkdir(parents=True)
    fault, options = MODES[mode]["fault"], MODES[mode]["options"]
    first_size = 4 if options is None or options["num_workers"] == 4 else 6
    outcome: Dict[str, Any] = {}
    target = _torchrun if options is None else _raydist
    thread = threading.Thread(target=target, args=(marker_dir, options, outcome), daemon=True)
    thread.start()
    wait_until(
        lambda: len(list(marker_dir.glob("running-*.json"))) >= first_size or not thread.is_alive(), 180, "the first attempt's ranks"
    )
    running = [json.loads(p.read_text()) for p in marker_dir.glob("running-*.json")]
    started = time.time()
    victim = _make_fault(cluster, fault, running, marker_dir)
    action_s = time.time() - started
    thread.join(240)
    if thread.is_alive():
        raise TimeoutError(f"{mode}: the run did not finish")
    if "error" in outcome:
        raise outcome["error"]
    if fault == "crash":
        started = json.loads((marker_dir / "crashed.json").read_text())["at"]
    note = json.loads((marker_dir / "attempt-1.json").read_text())
    if victim is not None:
        if fault == "drain":
            cluster.remove_node(victim)  # a drained node is gone by its deadline
        cluster.add_node(num_cpus=CPUS_PER_NODE)
        cluster.wait_for_nodes()
    return {
        "total": note["first_step"] - started,
        "to_fn": note["fn_start"] - started,
        "fn_to_step": note["first_step"] - note["fn_start"],
        "action": action_s,
        "before": len(running),
        "after": note["world"],
    }


def _raydist(marker_dir: Path, options: Dict[str, Any], outcome: Dict[str, Any]) -> None:
    import raydist

    try:
        outcome["worlds"] = raydist.run(train, args=(str(marker_dir),), **options)
    except BaseException as error:  # noqa: BLE001 - reported by the sample
        outcome["error"] = error


def _torchrun(marker_dir: Path, options: Any, outcome: Dict[str, Any]) -> None:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        "--max-restarts",
        "1",
        os.path.abspath(__file__),
        "--torchrun-worker",
        str(marker_dir),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    if result.returncode != 0:
        outcome["error"] = RuntimeError(f"torchrun exited {result.returncode}: {result.stderr[-2000:]}")


def _make_fault(cluster: Any, fault: str, running: List[Dict[str, Any]], marker_dir: Path) -> Any:
    """Crash rank CRASH_RANK, or remove / drain a node with ranks that is not
    the driver's; the node taken away (None for a crash)."""
    import ray

    if fault == "crash":
        (marker_dir / "crash").touch()
        return None
    head = ray.get_runtime_context().get_node_id()
    victim_id = next(r["node_id"] for r in sorted(running, key=lambda r: r["rank"]) if r["node_id"] != head)
    victim = next(node for node in cluster.worker_nodes if node.node_id == victim_id)
    if fault == "drain":
        drain(cluster.address, victim_id, DRAIN_DEADLINE_S)
    else:
        cluster.remove_node(victim)
    return victim


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="samples per mode (default 3)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--quick", action="store_true", help="one sample per mode")
    parser.add_argument("--verbose", action="store_true", help="show raydist's restart lines")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps = 1

    from _common import header

    header("elastic")
    samples = collect(args.modes, args.reps, args.verbose)
    report(samples, args.reps)


def collect(modes: List[str], reps: int, verbose: bool = False) -> Dict[str, List[Dict[str, Any]]]:
    """``reps`` samples of each mode, interleaved, on one simulated cluster."""
    import tempfile

    import ray
    from _common import expose_to_workers
    from ray.cluster_utils import Cluster

    if verbose:
        logging.basicConfig(format="%(asctime)s %(message)s")
    else:
        logging.getLogger("raydist").setLevel(logging.ERROR)  # the restart lines are expected here
    expose_to_workers()  # before the raylets start: their workers import this module
    started = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": CPUS_PER_NODE, "include_dashboard": False})
    for _ in range(NODES - 1):
        cluster.add_node(num_cpus=CPUS_PER_NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
    print(f"  {NODES}-node cluster up in {time.perf_counter() - started:.1f} s", flush=True)
    samples: Dict[str, List[Dict[str, Any]]] = {mode: [] for mode in modes}
    try:
        with tempfile.TemporaryDirectory(prefix="raydist-elastic-") as tmp:
            for rep in range(reps):
                for mode in modes:
                    sample = one_sample(cluster, mode, Path(tmp, f"{mode}-{rep}"))
                    samples[mode].append(sample)
                    print(
                        f"  {mode} #{rep + 1}: {sample['total']:.2f} s to the first step "
                        f"(restarted at {sample['to_fn']:.2f} s; world {sample['before']} -> {sample['after']})",
                        flush=True,
                    )
    finally:
        ray.shutdown()
        cluster.shutdown()
    return samples


def report(samples: Dict[str, List[Dict[str, Any]]], reps: int) -> None:
    from _common import fmt_ratio, fmt_s, load_line, median, print_table, verdict

    rows = []
    for mode, runs in samples.items():
        rows.append(
            [
                TITLES[mode],
                f"{runs[0]['before']} -> {runs[0]['after']}",
                fmt_s(median([r["total"] for r in runs])),
                fmt_s(min(r["total"] for r in runs)),
                fmt_s(median([r["to_fn"] for r in runs])),
                fmt_s(median([r["fn_to_step"] for r in runs])),
                len(runs),
            ]
        )
    print_table(
        f"Failure to the first training step of the new world, simulated {NODES}-node cluster "
        f"({CPUS_PER_NODE} CPU slots each; median of {reps})",
        ["run", "world", "median", "min", "to fn start (median)", "fn start to step (median)", "samples"],
        rows,
    )
    med = {mode: median([r["total"] for r in runs]) for mode, runs in samples.items()}
    goals = []
    for mode in ("node-warm", "crash-spare"):
        if mode in med:
            goals.append([TITLES[mode], fmt_s(med[mode]), f"<= {TARGET_S:g} s", verdict(med[mode] <= TARGET_S)])
    for mode, other in (
        ("node-warm", "node-fresh"),
        ("crash-spare", "crash-fresh"),
        ("crash-warm", "crash-fresh"),
        ("crash-spare", "crash-torchrun"),
        ("crash-warm", "crash-torchrun"),
    ):
        if mode in med and other in med:
            ratio = med[other] / med[mode] if med[mode] > 0 else None
            goal = verdict(ratio >= TORCHRUN_FACTOR) if other == "crash-torchrun" and ratio is not None else "-"
            goals.append(
                [
                    f"{TITLES[other]} / {TITLES[mode]}",
                    fmt_ratio(med[other], med[mode]),
                    f">= {TORCHRUN_FACTOR:g}x" if other == "crash-torchrun" else "-",
                    goal,
                ]
            )
    print_table("Goals (on a quiet 2-core machine)", ["what", "figure", "goal", "verdict"], goals)
    print(f"({load_line()} at the end)", flush=True)


def _torchrun_worker(marker_dir: str) -> None:
    """One rank under torchrun: the same loop, in a process group torchrun's environment describes."""
    import torch.distributed as dist

    # A store prefix per attempt: with torchrun 2.13's agent store, a plain
    # init_process_group("gloo") in attempt 1 read attempt 0's gloo addresses
    # here ("Connection refused" in connectFullMesh) and the restart failed.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", store=dist.PrefixStore(f"bench-attempt-{attempt}", store), rank=rank, world_size=world)
    try:
        train(marker_dir)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--torchrun-worker":
        _torchrun_worker(sys.argv[2])
    else:
        main()
