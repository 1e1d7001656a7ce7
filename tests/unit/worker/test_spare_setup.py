"""A spare that takes a rank imports nothing in its set-up.

Every rank's initialisation waits for the slowest to join the rendezvous: a
spare that still imported its set-up's modules (its spec's configuration
classes, the backend's worker class) when its call came held up the whole
world of a warm restart by tens of milliseconds (65-95 ms on 2 busy cores).
"""

from __future__ import annotations

import pickle
import socket
import subprocess
import sys

from raydist.config.options import RunConfig
from raydist.pool.records import WorkerInfo, WorkerSpec

# A process standing by as a spare, then set up as rank 0 of a world of one
# (raydist's own process group): the modules its set-up imported.
SPARE = """
import pickle, sys
from raydist.pool.worker.actor import RayWorker
worker = RayWorker(None)
worker.stand_by({}, "cpu")
before = set(sys.modules)
worker.setup(pickle.loads(bytes.fromhex(sys.argv[1])))  # the spec is read in the call, as Ray does
print("imported:", " ".join(sorted(set(sys.modules) - before)), file=sys.stderr)
worker.teardown()
"""


def _spec() -> WorkerSpec:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    info = WorkerInfo(
        rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, num_nodes=1, node_id="node",
        node_ip="127.0.0.1", pid=0, device_ids=(), visible_device_ids=(), device_index=None, actor_index=0,
    )  # fmt: skip
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return WorkerSpec(worker=info, env=env, config=RunConfig(), device_type="cpu", init_kwargs={})


def test_a_spares_set_up_imports_nothing() -> None:
    spec = pickle.dumps(_spec())
    result = subprocess.run([sys.executable, "-c", SPARE, spec.hex()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = next(line for line in result.stderr.splitlines() if line.startswith("imported:"))
    assert imported.split()[1:] == [], imported  # (before: raydist.config's modules, the backend's worker class, ...)
