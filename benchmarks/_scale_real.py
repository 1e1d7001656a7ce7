"""The real curve of ``benchmarks/scale.py``: raydist on real Ray and torch
for as many workers as this machine holds, each point beside its floor,
measured in the same run.

A simulated cluster of ``NODES`` raylets (``ray.cluster_utils.Cluster``),
workers of half a CPU. Per size N:

* start: ``raydist.run(noop)`` whole; floor: N bare actors spawn, import
  torch, join a gloo group, barrier, die (``cold_start.make_time_floor``).
* warm call: the median ``WorkerGroup.run(noop)``; floor: the median
  ``ray.get`` of a no-op on N bare actors.
* state step: the slowest rank's median time blocked in ``save_state`` of
  ``STATE_MB`` per rank (kept in memory on two nodes), a step's work
  (``STEP_S``) between saves; floor: every one of N bare actors
  ``torch.save``-ing the same tensor to local disk at the same moments (the
  slowest one's median). "state step (DCP)": the same raydist figure beside
  the part of ``torch.distributed.checkpoint.async_save`` that blocks, every
  rank of a raydist group at once (each waits for its previous save first,
  as DCP asks; the slowest rank's median).
* recovery: rank 1 dies; seconds from its death to rank 0 past the first
  barrier of the next world: ``raydist.run(max_restarts=1, spare_workers=1)``
  beside ``torchrun --standalone --max-restarts 1`` of the same function.

Every process shares this machine's cores, so past the core count the
curve measures the machine as much as raydist; the ratio to the floor is
the figure to read.
"""

from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

NODES = 4
CPUS_PER_NODE = 5  # 32 half-CPU workers and a spare fit on 4 nodes of 5
HALF_CPU = {"CPU": 0.5}
CALLS = 30  # warm calls per size (after 3 not counted)
STATE_MB = 16
SAVES = 6  # save_state steps per size (the first not counted: the keeper starts)
STEP_S = 0.5  # a step's work between saves (idle here, as a rank waiting on its GPU): a save's copy overlaps it
RUN_TIMEOUT_S = 600

PHASES = ("start", "warm call", "state step", "state step (DCP)", "recovery")


def noop() -> None:
    return None


def _mark(marks: str, name: str) -> None:
    with open(os.path.join(marks, name), "w") as file:
        file.write(repr(time.time()))


def crash_then_barrier(marks: str) -> None:
    """Attempt 0: every rank meets, then rank 1 dies. Attempt 1: the first
    barrier of the new world, and rank 0 notes when it passed it."""
    import torch.distributed as dist

    if not dist.is_initialized():  # under torchrun: the script initialises itself
        from _state_recovery import _init_process_group

        _init_process_group()
    rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.barrier()
    if attempt == 0:
        if rank == 1:
            _mark(marks, "crash")
            os._exit(1)
        dist.barrier()  # until the failure ends this world
    elif rank == 0:
        _mark(marks, "first")


def _recovery(marks: str) -> float:
    read = lambda name: float(open(os.path.join(marks, name)).read())  # noqa: E731
    return read("first") - read("crash")


def save_steps(how: str) -> float:
    """This rank's median seconds blocked per save of ``STATE_MB``: ``how`` is
    "save_state", "torch.save" or "dcp" (``async_save``, in a raydist group)."""
    import shutil

    import torch

    import raydist

    tensor = torch.zeros(STATE_MB * 2**20 // 4)
    if how == "dcp":  # one checkpoint folder for the group, as DCP expects (every rank on this machine)
        folder = os.path.join(tempfile.gettempdir(), f"scale-state-dcp-{os.environ['MASTER_PORT']}")
        os.makedirs(folder, exist_ok=True)
    else:
        folder = tempfile.mkdtemp(prefix="scale-state-")
    if how == "save_state":
        raydist.load_state(weights={"t": tensor})
    pending: List[Any] = []
    if how == "dcp":
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        # async_save ends with collectives of its own in a thread: a group of its own keeps them apart.
        group = dist.new_group(backend="gloo")
    blocked = []
    try:
        for step in range(SAVES):
            time.sleep(STEP_S)
            tensor += 1
            if pending:  # one async_save in flight at a time, as DCP asks: waited for outside the timing
                pending.pop().result()
            start = time.perf_counter()
            if how == "torch.save":
                torch.save({"t": tensor}, os.path.join(folder, f"step_{step}.pt"))
            elif how == "dcp":
                pending.append(dcp.async_save({"t": tensor}, checkpoint_id=os.path.join(folder, f"step_{step}"), process_group=group))
            else:
                raydist.save_state(step, weights={"t": tensor})
            blocked.append(time.perf_counter() - start)
        if pending:
            pending.pop().result()
        if how == "dcp":
            dist.barrier()  # every rank has written before the folder goes
    finally:
        if how != "dcp" or int(os.environ["RANK"]) == 0:
            shutil.rmtree(folder, ignore_errors=True)
    return statistics.median(blocked[1:])


class BareWorker:
    """A bare actor: the floor of a warm call and of a state step."""

    def ping(self) -> int:
        return os.getpid()

    def save_steps(self) -> float:
        return save_steps("torch.save")


def _median_call(call: Callable[[], Any]) -> float:
    for _ in range(3):
        call()
    samples = []
    for _ in range(CALLS):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _torchrun_recovery(n: int, marks: str) -> float:
    bench = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(marks, "recover.py")
    with open(script, "w") as file:
        file.write(f"import sys; sys.path.insert(0, {bench!r}); import _scale_real; _scale_real.crash_then_barrier({marks!r})\n")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), "--max-restarts", "1", script]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"torchrun exited {result.returncode}: {result.stderr[-3000:]}")
    return _recovery(marks)


def measure_size(n: int, log: Callable[[str], None]) -> Dict[str, Dict[str, float]]:
    """One point of each phase at ``n`` workers: {phase: {"seconds", "floor_seconds"}}."""
    import ray
    from _common import wait_for_quiet_cpu
    from cold_start import make_time_floor

    import raydist

    point: Dict[str, Dict[str, float]] = {}

    wait_for_quiet_cpu()
    start = time.perf_counter()
    raydist.run(noop, num_workers=n, resources_per_worker=HALF_CPU)
    seconds = time.perf_counter() - start
    wait_for_quiet_cpu()
    point["start"] = {"seconds": seconds, "floor_seconds": make_time_floor()(n)}

    with raydist.WorkerGroup(n, resources_per_worker=HALF_CPU) as group:
        warm = _median_call(lambda: group.run(noop))
        state = max(group.run(save_steps, args=("save_state",)))
        dcp = max(group.run(save_steps, args=("dcp",)))
    actors = [ray.remote(num_cpus=0.5)(BareWorker).remote() for _ in range(n)]
    try:
        ray.get([actor.ping.remote() for actor in actors])
        bare = _median_call(lambda: ray.get([actor.ping.remote() for actor in actors]))
        floor_state = max(ray.get([actor.save_steps.remote() for actor in actors]))
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
    point["warm call"] = {"seconds": warm, "floor_seconds": bare}
    point["state step"] = {"seconds": state, "floor_seconds": floor_state}
    point["state step (DCP)"] = {"seconds": state, "floor_seconds": dcp}

    with tempfile.TemporaryDirectory(prefix="scale-rd-") as marks:
        wait_for_quiet_cpu()
        raydist.run(crash_then_barrier, args=(marks,), num_workers=n, max_restarts=1, spare_workers=1, resources_per_worker=HALF_CPU)
        recovered = _recovery(marks)
    with tempfile.TemporaryDirectory(prefix="scale-tr-") as marks:
        wait_for_quiet_cpu()
        floor_recovery = _torchrun_recovery(n, marks)
    point["recovery"] = {"seconds": recovered, "floor_seconds": floor_recovery}
    for phase, figures in point.items():
        log(f"  N={n} {phase}: {figures['seconds']:.3f} s (floor {figures['floor_seconds']:.3f} s)")
    return point


def real_curve(sizes: List[int], log: Callable[[str], None] = print) -> Dict[str, Dict[str, List[float]]]:
    """Every phase at every size on a fresh simulated cluster:
    {phase: {"workers": [...], "seconds": [...], "floor_seconds": [...]}}."""
    import ray
    from _common import expose_to_workers
    from ray.cluster_utils import Cluster

    expose_to_workers()  # before the raylets start: their workers import this module
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": CPUS_PER_NODE, "include_dashboard": False})
    for _ in range(NODES - 1):
        cluster.add_node(num_cpus=CPUS_PER_NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
    curve: Dict[str, Dict[str, List[float]]] = {phase: {"workers": [], "seconds": [], "floor_seconds": []} for phase in PHASES}
    try:
        from cold_start import make_time_floor

        import raydist

        raydist.run(noop, num_workers=2, resources_per_worker=HALF_CPU)  # warm-up, not counted: file caches, each raylet's first workers
        make_time_floor()(2)
        for n in sizes:
            for phase, figures in measure_size(n, log).items():
                curve[phase]["workers"].append(n)
                curve[phase]["seconds"].append(figures["seconds"])
                curve[phase]["floor_seconds"].append(figures["floor_seconds"])
    finally:
        ray.shutdown()
        cluster.shutdown()
    return curve


def main(argv: Optional[List[str]] = None) -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args(argv)
    print(json.dumps(real_curve(args.sizes)))


if __name__ == "__main__":
    main()
