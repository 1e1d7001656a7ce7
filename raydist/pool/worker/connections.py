"""A process group's TCP side: a MASTER_PORT not used before, held from the
moment it is chosen, and the connections the group opened, closed for sure
at teardown.

gloo has no abort, and destroying a process group closes its connections
only once nothing references it any more; after a failed call, something
often does (DDP's reducer, reachable from the call's frames through C++
references Python's collector cannot see). Peers blocked in a collective
with this rank would then wait for the process group's timeout (30 min by
default). So the worker notes which connections appeared while the process
group started, and shuts each one down at teardown, if the same file
descriptor still holds the same connection (never one Ray opened since).
A process group the user's code creates itself (a torchrun script's
``init_process_group``, a ``new_group``) is noted the same way, through
``note_groups_created``.
"""

from __future__ import annotations

import functools
import socket
from typing import AbstractSet, Any, Callable, FrozenSet, Tuple

Connection = Tuple[int, Tuple[object, ...], Tuple[object, ...]]  # (fd, local address, remote address)


def reserve_port(avoid: AbstractSet[int] = frozenset()) -> socket.socket:
    """A socket bound to a free port other than those in `avoid` (the kernel
    may hand back a port it gave before, and a restart must not reuse an
    earlier attempt's MASTER_PORT: a straggler of that world could reach the
    new store). Bound, the port is this process's: no other run on the node
    can take it before the store listens on it (``hold_store``)."""
    for _ in range(64):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("", 0))
        if int(sock.getsockname()[1]) not in avoid:
            return sock
        sock.close()
    raise RuntimeError(f"no free port outside the {len(avoid)} the group used before")


def hold_store(reserved: socket.socket, host: str, timeout_s: float = 300.0) -> Any:
    """Rank 0's rendezvous store, listening on the port it reserved. Shared
    (``multi_tenant``): the ``init_process_group`` that follows, raydist's or
    the script's own (``env://``, ``tcp://``), finds it in this process and
    uses it rather than binding the port again."""
    import datetime

    from torch.distributed import TCPStore

    reserved.listen()
    port = int(reserved.getsockname()[1])
    listen_fd = reserved.detach()  # the store owns the socket now
    store = functools.partial(
        TCPStore,
        host,
        port,
        world_size=None,  # the ranks' own clients say how many there are
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout_s),  # this object's own client (torch's default)
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=listen_fd,
    )
    try:
        return store()
    except NotImplementedError:  # an older torch (2.4): its libuv store cannot take a listening socket
        return store(use_libuv=False)


def tcp_connections() -> FrozenSet[Connection]:
    """This process's TCP sockets (listening ones have no remote address)."""
    import psutil

    try:
        found = psutil.Process().net_connections(kind="tcp")
    except (psutil.Error, OSError):  # no /proc view: nothing to close later, teardown as usual
        return frozenset()
    return frozenset((c.fd, tuple(c.laddr or ()), tuple(c.raddr or ())) for c in found if c.fd >= 0)


def shut_down(opened: FrozenSet[Connection]) -> int:
    """Shut down every connection of ``opened`` that is still open as it
    was; how many. Peers reading from them get end-of-file at once."""
    current = tcp_connections()
    closed = 0
    for fd, _, remote in opened & current:
        if not remote:
            continue  # a listening socket: gloo's accept thread aborts the process if it is shut down
        try:
            duplicate = socket.socket(fileno=socket.dup(fd))  # ours to close; the shutdown reaches the connection
        except OSError:
            continue
        with duplicate:
            try:
                duplicate.shutdown(socket.SHUT_RDWR)
                closed += 1
            except OSError:  # already shut down, or never connected
                pass
    return closed


def note_groups_created(created: Callable[[Any, FrozenSet[Connection]], None]) -> None:
    """From now on, hand ``created`` each process group the user's code
    creates (``torch.distributed.init_process_group`` and ``new_group``,
    however the code reaches them) with the connections it opened: a
    script's own group, left half-referenced by its failed call, would
    otherwise hold a peer's warm restart for ``survivor_timeout``; and the
    group itself is held so that it is freed last (``group_refs``)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    for name in ("init_process_group", "new_group"):
        original = getattr(distributed_c10d, name)
        if getattr(original, "_raydist_noted", False):
            continue  # once per process: a kept worker is set up again at each warm restart
        noted = _noting(original, created, lambda: distributed_c10d.GroupMember.WORLD)
        for module in (dist, distributed_c10d):
            setattr(module, name, noted)


def _noting(
    create: Callable[..., Any],
    created: Callable[[Any, FrozenSet[Connection]], None],
    default_group: Callable[[], Any] = lambda: None,
) -> Callable[..., Any]:
    """``create`` noted: the group it returns (``init_process_group``
    returns none: then the default group it made) and its connections."""

    @functools.wraps(create)
    def noted(*args: Any, **kwargs: Any) -> Any:
        before = tcp_connections()
        group = None
        try:
            group = create(*args, **kwargs)
            return group
        finally:
            created(group if group is not None else default_group(), tcp_connections() - before)

    noted._raydist_noted = True  # type: ignore[attr-defined]
    return noted
