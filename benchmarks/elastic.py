"""Elastic restarts: from losing (or draining) a node to the first completed
training step in the new world, on a simulated 3-node cluster
(``ray.cluster_utils.Cluster``, 2 CPU slots per node, all on this machine).

* elastic: ``raydist.run(train, num_workers=(2, 6), max_restarts=1)`` runs 6
  workers; a node with ranks on it is removed; the run restarts with the 4
  that still fit.
* fixed: ``num_workers=4, max_restarts=1`` (PACK: two nodes hold the ranks,
  the third is spare, so the fixed-size restart can succeed too); a node
  with ranks on it is removed; the run restarts with 4 workers.
* drain: as elastic, but the node is drained as a spot preemption would
  (Ray's drain API, reason PREEMPTION, deadline 60 s) instead of removed:
  its ranks get SIGTERM, leave at the next step boundary, and the run
  restarts with 4 workers on the other nodes (not counted against
  max_restarts).

``train`` is a small DDP loop (gloo, one CPU thread per worker). The clock
starts just before the node is removed (``Cluster.remove_node``, which kills
the node's processes) or the drain is requested, and stops when rank 0 of
the new world has finished its first optimizer step (written to a file with
``time.time()``; every process runs on this machine, so the clocks agree).
Each sample also splits that time at the moment rank 0's function started
in the new world: before it, raydist noticed the failure, tore the group
down and started and initialised the new workers; after it, the function
built its model and took one step. After each sample the lost node is
replaced by a fresh one. The modes are interleaved, so drift on a small
machine hits them alike.

    python benchmarks/elastic.py [--reps 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

NODES = 3
CPUS_PER_NODE = 2
TARGET_S = 10.0  # elastic: node removal to first step in the new world
DRAIN_DEADLINE_S = 60
MODES = {
    "elastic": {"num_workers": (2, 6), "max_restarts": 1},
    "fixed": {"num_workers": 4, "max_restarts": 1},
    "drain": {"num_workers": (2, 6), "max_restarts": 0},
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
            node = ray.get_runtime_context().get_node_id()
            Path(marker_dir, f"running-{rank}.json").write_text(json.dumps({"rank": rank, "node_id": node}))
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

    from raydist.pool.cluster.ray_private import available_resources_per_node, draining_nodes

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
    """Run ``train`` in ``mode``, take a node away once every rank trains,
    and time it to the new world's first step."""
    import ray

    import raydist

    wait_until(lambda: cluster_idle(NODES), 60, f"{NODES} idle nodes")
    marker_dir.mkdir(parents=True)
    options = MODES[mode]
    first_size = 6 if mode != "fixed" else 4
    outcome: Dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["worlds"] = raydist.run(train, args=(str(marker_dir),), **options)
        except BaseException as error:  # noqa: BLE001 - reported by the sample
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    wait_until(lambda: len(list(marker_dir.glob("running-*.json"))) >= first_size or not thread.is_alive(), 180,
               "the first attempt's ranks")
    running = sorted((json.loads(p.read_text()) for p in marker_dir.glob("running-*.json")), key=lambda r: r["rank"])
    head = ray.get_runtime_context().get_node_id()
    victim_id = next(r["node_id"] for r in running if r["node_id"] != head)
    victim = next(node for node in cluster.worker_nodes if node.node_id == victim_id)
    started = time.time()
    if mode == "drain":
        drain(cluster.address, victim_id, DRAIN_DEADLINE_S)
    else:
        cluster.remove_node(victim)
    action_s = time.time() - started
    thread.join(240)
    if thread.is_alive():
        raise TimeoutError(f"{mode}: the run did not finish")
    if "error" in outcome:
        raise outcome["error"]
    note = json.loads((marker_dir / "attempt-1.json").read_text())
    if mode == "drain":
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
        "worlds": outcome["worlds"],
    }


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="samples per mode (default 3)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--quick", action="store_true", help="one sample per mode")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps = 1

    import logging
    import tempfile

    import ray
    from ray.cluster_utils import Cluster

    from _common import expose_to_workers, fmt_ratio, fmt_s, header, load_line, median, print_table, verdict

    header("elastic")
    logging.getLogger("raydist").setLevel(logging.ERROR)  # the restart lines are expected here
    expose_to_workers()  # before the raylets start: their workers import this module
    started = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": CPUS_PER_NODE, "include_dashboard": False})
    for _ in range(NODES - 1):
        cluster.add_node(num_cpus=CPUS_PER_NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
    print(f"  {NODES}-node cluster up in {time.perf_counter() - started:.1f} s", flush=True)
    samples: Dict[str, List[Dict[str, Any]]] = {mode: [] for mode in args.modes}
    try:
        with tempfile.TemporaryDirectory(prefix="raydist-elastic-") as tmp:
            for rep in range(args.reps):
                for mode in args.modes:
                    sample = one_sample(cluster, mode, Path(tmp, f"{mode}-{rep}"))
                    samples[mode].append(sample)
                    print(
                        f"  {mode} #{rep + 1}: {sample['total']:.2f} s to the first step "
                        f"(restarted at {sample['to_fn']:.2f} s; world {sample['before']} -> {sample['after']}; "
                        f"node {'drain' if mode == 'drain' else 'removal'} took {sample['action']:.2f} s)",
                        flush=True,
                    )
    finally:
        ray.shutdown()
        cluster.shutdown()

    titles = {
        "elastic": "elastic (2, 6), node removed",
        "fixed": "fixed 4, max_restarts=1, node removed",
        "drain": "elastic (2, 6), node drained (preemption)",
    }
    rows = []
    for mode in args.modes:
        runs = samples[mode]
        rows.append([
            titles[mode], f"{runs[0]['before']} -> {runs[0]['after']}",
            fmt_s(median([r["total"] for r in runs])), fmt_s(min(r["total"] for r in runs)),
            fmt_s(median([r["to_fn"] for r in runs])), fmt_s(median([r["fn_to_step"] for r in runs])), len(runs),
        ])
    print_table(
        f"Node lost or drained to the first training step of the new world, simulated {NODES}-node cluster "
        f"({CPUS_PER_NODE} CPU slots each; median of {args.reps})",
        ["run", "world", "median", "min", "to fn start (median)", "fn start to step (median)", "samples"],
        rows,
    )
    elastic = median([r["total"] for r in samples["elastic"]]) if "elastic" in samples else None
    fixed = median([r["total"] for r in samples["fixed"]]) if "fixed" in samples else None
    print_table(
        "Elastic restart",
        ["elastic median", f"<= {TARGET_S:.0f} s", "fixed / elastic"],
        [[fmt_s(elastic), verdict(None if elastic is None else elastic <= TARGET_S), fmt_ratio(fixed, elastic)]],
    )
    print(f"({load_line()} at the end)", flush=True)


if __name__ == "__main__":
    main()
