"""Horovod on the raydist worker group (horovod built by scripts/install-horovod.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, List, Optional

import psutil
import pytest
import ray
import torch
from conftest import REPO, assert_nothing_left, repeats

import raydist
from raydist.backends.horovod.driver import HorovodRendezvous
from raydist.backends.horovod.worker import interface_for_ip
from raydist.pool.records import Placement, WorkerInfo
from raydist.pool.rules.layout import assign_ranks

hvd = pytest.importorskip("horovod.torch", reason="horovod is installed by `make test`")
pytestmark = pytest.mark.timeout(240)


def horovod_view() -> Dict[str, Any]:
    info = raydist.get_context()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return {
        "hvd": (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()),
        "info": info,
        "sum": total.item(),
        "broadcast": raydist.broadcast_object({"root": info.rank} if info.rank == 1 else None, src=1),
        "all_gather": raydist.all_gather_object(info.rank * 2),
        "gloo_iface": os.environ.get("HOROVOD_GLOO_IFACE"),
    }


def rendezvous_threads() -> int:
    return sum(1 for t in threading.enumerate() if "serve_forever" in repr(getattr(t, "_target", "")))


@pytest.mark.usefixtures("ray_local")
def test_horovod_ranks_allreduce_and_object_collectives() -> None:
    num_workers = 3  # odd, on one node (two nodes of two: test_two_node_layout_matches_horovod_local_and_cross_ranks)
    results = raydist.run(horovod_view, num_workers=num_workers, backend="horovod")
    for rank, result in enumerate(results):
        assert result["hvd"] == (rank, num_workers, rank, num_workers, 0, 1)
        assert result["info"].horovod and result["info"].backend == "horovod"
        assert result["sum"] == num_workers * (num_workers + 1) / 2
        assert result["broadcast"] == {"root": 1}
        assert result["all_gather"] == [r * 2 for r in range(num_workers)]
        # gloo is bound to the interface of the worker's node IP (one node here: the driver's).
        assert result["gloo_iface"] == interface_for_ip(ray.util.get_node_ip_address())


def collectives_use_horovod() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() and raydist.get_context().horovod


@pytest.mark.soak  # make test: test_warm_restarts::test_horovod_shuts_down_and_initialises_again_in_the_same_processes inits again in one group
@pytest.mark.usefixtures("ray_local")
def test_one_group_runs_several_horovod_calls_and_shuts_down_cleanly() -> None:
    before = rendezvous_threads()
    with raydist.WorkerGroup(2, backend="horovod") as group:
        assert rendezvous_threads() == before + 1
        for call in range(3):
            sums = group.run(lambda c: hvd.allreduce(torch.tensor([float(c)]), op=hvd.Sum).item(), args=(call,))
            assert sums == [2.0 * call] * 2
        # No torch process group: the object collectives can only have gone through horovod.
        assert group.run(collectives_use_horovod) == [True, True]
    assert rendezvous_threads() == before
    assert_nothing_left()


def reinit_and_allreduce(iterations: int) -> List[float]:
    """hvd.shutdown() + hvd.init() + one allreduce, ``iterations`` times: every
    init is a fresh rendezvous through the same server."""
    sums = []
    for i in range(iterations):
        hvd.shutdown()
        hvd.init()
        sums.append(hvd.allreduce(torch.tensor([float(hvd.rank() + 1 + i)]), op=hvd.Sum).item())
    return sums


@pytest.mark.usefixtures("ray_local")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_workers", [2, 3])
@repeats(
    0, 200
)  # soak only: make test re-initialises horovod in the same processes (test_warm_restarts::test_horovod_shuts_down_and_initialises_again_in_the_same_processes)
def test_horovod_reinit_200_times_without_a_failed_rendezvous(num_workers: int, repeat: int) -> None:
    # With horovod's stock handler a stale local_<host> scope makes some init
    # connect to a peer's previous address; here every init must succeed.
    iterations = repeat
    results = raydist.run(reinit_and_allreduce, args=(iterations,), num_workers=num_workers, backend="horovod", timeout=240)
    expected = [num_workers * (num_workers + 1) / 2 + num_workers * i for i in range(iterations)]
    assert results == [expected] * num_workers


def one_node_workers(count: int) -> List[WorkerInfo]:
    placements = [Placement(index=i, node_id="node-a", node_ip="127.0.0.1", pid=0, accelerator_ids=(), free_port=0) for i in range(count)]
    return assign_ranks(placements, "node-a")


def http(server: HorovodRendezvous, method: str, path: str, body: Optional[bytes] = None) -> int:
    request = urllib.request.Request(f"http://{server.address}:{server.port}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@pytest.fixture
def rendezvous() -> Iterator[HorovodRendezvous]:
    server = HorovodRendezvous(one_node_workers(2))
    yield server
    server.stop()


@pytest.mark.timeout(30)
def test_rendezvous_listens_on_the_driver_ip_only(rendezvous: HorovodRendezvous) -> None:
    assert rendezvous.address == ray.util.get_node_ip_address()
    # The live socket, as the OS reports it: one listener, on that address.
    listening = [
        (conn.laddr.ip, conn.laddr.port)
        for conn in psutil.Process().net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == rendezvous.port
    ]
    assert listening == [(rendezvous.address, rendezvous.port)]
    assert rendezvous.address not in ("0.0.0.0", "::", "")
    assert http(rendezvous, "PUT", "/adhoc/key", b"v") == 200
    assert http(rendezvous, "GET", "/adhoc/key") == 200


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stock", [False, True], ids=["raydist-handler", "stock-handler"])
def test_a_finished_scope_does_not_reset_another_scopes_progress(stock: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The order that breaks horovod's handler, replayed request by request:
    # rank 0 leaves local_<host> and then its one-rank cross_0 before rank 1
    # leaves local_<host>.
    if stock:
        from horovod.runner.http.http_server import RendezvousHandler

        monkeypatch.setattr(HorovodRendezvous, "handler_cls", RendezvousHandler)
    server = HorovodRendezvous(one_node_workers(2))
    try:
        local = "/local_node-a"
        for rank in ("0", "1"):
            assert http(server, "PUT", f"{local}/rank_{rank}", b"address of round 1") == 200
        assert http(server, "PUT", "/cross_0/rank_0", b"address of round 1") == 200
        assert http(server, "DELETE", f"{local}/0") == 200
        assert http(server, "DELETE", "/cross_0/0") == 200
        assert http(server, "DELETE", f"{local}/1") == 200
        stale = http(server, "GET", f"{local}/rank_0") == 200
        assert stale == stock  # stock: round 2 would read round 1's address
        assert http(server, "GET", "/cross_0/rank_0") == 404
    finally:
        server.stop()


@pytest.mark.soak  # the example end to end (its parts run in make test)
@pytest.mark.usefixtures("ray_local")
def test_horovod_example_trains() -> None:
    # Attached to the session's Ray (as a user with RAY_ADDRESS set): a private Ray's start is not under test here.
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    completed = subprocess.run(
        [sys.executable, "examples/horovod_raydist.py", "--num-workers", "2", "--steps", "10"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "final loss" in completed.stdout
    assert_nothing_left(within=15)  # the example's driver exit ends its actors asynchronously


@pytest.mark.soak  # horovod on a second node layout (its ranks on one node run in make test)
@pytest.mark.nodes({"num_cpus": 2}, {"num_cpus": 2}, {"num_cpus": 2})  # the elastic tests' shape: a warm cluster
@pytest.mark.usefixtures("cluster")
def test_two_node_layout_matches_horovod_local_and_cross_ranks() -> None:
    results = raydist.run(horovod_view, num_nodes=2, workers_per_node=2, backend="horovod")
    node_of = {}
    for rank, result in enumerate(results):
        info = result["info"]
        assert result["hvd"] == (rank, 4, info.local_rank, 2, info.node_rank, 2)
        node_of[rank] = info.node_rank
    assert sorted(node_of.values()) == [0, 0, 1, 1]
    assert results[0]["sum"] == 10.0
