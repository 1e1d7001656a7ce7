"""A driver that shuts Ray down right after a run that lost a node, then goes on.

Its own simulated cluster: the driver's node and one more. The rank on the
other node says it is running, the node is removed, the run (no restarts)
fails, and the driver calls ``ray.shutdown()`` at once: a poll of the run
still in a Ray call then would end this process. Prints one line per round
and "the driver went on" at the end. ``argv[1]``: how many rounds.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict

import ray
from ray.cluster_utils import Cluster

import raydist


def wait_on_the_other_node(marks: str) -> None:
    import torch.distributed as dist

    if os.environ["GROUP_RANK"] == "1":
        Path(marks, "running").touch()
        time.sleep(600)  # until its node is removed
    dist.barrier()  # the other node's rank never arrives: it is lost meanwhile


def one_round(cluster: Cluster, number: int) -> None:
    worker_node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    marks = tempfile.mkdtemp()
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            raydist.run(wait_on_the_other_node, args=(marks,), num_nodes=2, workers_per_node=1, accelerator="cpu", max_restarts=0)
        except Exception as error:  # noqa: BLE001 - checked below
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    while not Path(marks, "running").exists():  # a file on this machine: every simulated node is here
        assert time.monotonic() < deadline and thread.is_alive(), "the rank on the other node never ran"
        time.sleep(0.05)
    cluster.remove_node(worker_node)
    thread.join(120)
    assert isinstance(outcome.get("error"), raydist.WorkerGroupError), f"round {number}: the run did not fail so: {outcome}"
    ray.shutdown()  # at once, as a script that is done with Ray does
    print(f"round {number}: shut down after: {outcome['error'].root_cause.died}", flush=True)


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        for number in range(int(sys.argv[1])):
            one_round(cluster, number)
    finally:
        cluster.shutdown()
    print("the driver went on", flush=True)


if __name__ == "__main__":
    main()
