"""The connections a process group opens, noted for teardown: raydist's own
group's, and a group the user's code creates (a torchrun script's)."""

from __future__ import annotations

import socket
from typing import FrozenSet, List

import torch.distributed as dist
from torch.distributed import distributed_c10d

from raydist.pool.worker import connections
from raydist.pool.worker.connections import Connection


def test_a_group_the_code_creates_has_its_connections_noted_and_shut_down() -> None:
    noted: List[FrozenSet[Connection]] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        create = connections._noting(lambda: socket.create_connection(("127.0.0.1", port)), noted.append)
        client = create()
        peer, _ = server.accept()
        with client, peer:
            assert [remote[1] for _, _, remote in noted[0]] == [port]  # the one connection it opened
            assert connections.shut_down(noted[0]) == 1
            assert peer.recv(1) == b""  # the peer reads end-of-file at once


def test_init_process_group_and_new_group_are_noted_once_however_they_are_reached() -> None:
    originals = {name: getattr(distributed_c10d, name) for name in ("init_process_group", "new_group")}
    try:
        connections.note_groups_created(lambda opened: None)
        first = dist.init_process_group
        connections.note_groups_created(lambda opened: None)  # a kept worker set up again
        assert dist.init_process_group is first is distributed_c10d.init_process_group
        assert dist.new_group is distributed_c10d.new_group is not originals["new_group"]
        assert first.__wrapped__ is originals["init_process_group"]  # type: ignore[attr-defined]
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
            setattr(distributed_c10d, name, original)
