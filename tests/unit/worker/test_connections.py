"""A process group's TCP side: MASTER_PORT held from the moment it is chosen,
and the connections a group opens, noted for teardown: raydist's own
group's, and a group the user's code creates (a torchrun script's)."""

from __future__ import annotations

import datetime
import socket
from pathlib import Path
from typing import FrozenSet, List, Tuple

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d

from raydist.pool.worker import connections
from raydist.pool.worker.connections import Connection, hold_store, reserve_port


def test_a_group_the_code_creates_has_its_connections_noted_and_shut_down() -> None:
    noted: List[Tuple[object, FrozenSet[Connection]]] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        create = connections._noting(lambda: socket.create_connection(("127.0.0.1", port)), lambda *made: noted.append(made))
        client = create()
        peer, _ = server.accept()
        with client, peer:
            group, opened = noted[0]
            assert group is client  # what it created, held by the worker (group_refs)
            assert [remote[1] for _, _, remote in opened] == [port]  # the one connection it opened
            assert connections.shut_down(opened) == 1
            assert peer.recv(1) == b""  # the peer reads end-of-file at once


def test_init_process_group_and_new_group_are_noted_once_however_they_are_reached(tmp_path: Path) -> None:
    originals = {name: getattr(distributed_c10d, name) for name in ("init_process_group", "new_group")}
    made: List[object] = []
    try:
        connections.note_groups_created(lambda group, opened: made.append(group))
        first = dist.init_process_group
        connections.note_groups_created(lambda group, opened: None)  # a kept worker set up again
        assert dist.init_process_group is first is distributed_c10d.init_process_group
        assert dist.new_group is distributed_c10d.new_group is not originals["new_group"]
        assert first.__wrapped__ is originals["init_process_group"]  # type: ignore[attr-defined]
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store?rank=0&world_size=1")
        subgroup = dist.new_group([0])
        assert made == [dist.group.WORLD, subgroup]  # init_process_group's own: the default group it made
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for name, original in originals.items():
            setattr(dist, name, original)
            setattr(distributed_c10d, name, original)


def test_a_new_master_port_is_never_one_the_group_used_before() -> None:
    held = [reserve_port() for _ in range(100)]  # ports the kernel hands out now
    used = {sock.getsockname()[1] for sock in held}
    try:
        fresh = [reserve_port(avoid=used) for _ in range(20)]
        assert not {sock.getsockname()[1] for sock in fresh} & used
        for sock in fresh:
            sock.close()
        with pytest.raises(RuntimeError, match="no free port"):
            reserve_port(avoid=frozenset(range(65536)))
    finally:
        for sock in held:
            sock.close()


def test_a_reserved_port_cannot_be_taken_and_rank_0s_init_shares_the_held_store() -> None:
    reserved = reserve_port()
    port = reserved.getsockname()[1]
    with socket.socket() as other:  # another run on the node, as TCPStore binds (SO_REUSEADDR)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError):
            other.bind(("", port))
    held = hold_store(reserved, "127.0.0.1", 10)
    timeout = datetime.timedelta(seconds=10)
    # What init_process_group's env:// rendezvous builds on rank 0: served by the held store, no bind.
    rank0 = dist.TCPStore("127.0.0.1", port, 2, True, timeout, wait_for_workers=False, multi_tenant=True)
    peer = dist.TCPStore("127.0.0.1", port, 2, False, timeout)
    peer.set("from", "rank 1")
    assert rank0.get("from") == b"rank 1" and held.get("from") == b"rank 1"
