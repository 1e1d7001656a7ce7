"""Horovod on the worker group, the driver's side: horovod's own Gloo
rendezvous server, run by the driver and listening on its node IP only, with a
host plan built from the group's node layout and a request handler that
survives repeated hvd.init(). The workers' side is raydist.backends.horovod.worker.

Horovod scopes its gloo rendezvous by hostname (``local_<HOROVOD_HOSTNAME>``):
each worker's HOROVOD_HOSTNAME is its Ray node id, exactly as in the plan, so
several raylets sharing one IP are still told apart.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Type

import ray

from raydist.backends.horovod.worker import NODE_IP_VAR, import_horovod
from raydist.pool.records import WorkerInfo

if TYPE_CHECKING:  # horovod is imported only when a horovod group starts
    from http.server import BaseHTTPRequestHandler

    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousServer


def host_plan(workers: Sequence[WorkerInfo]) -> List["SlotInfo"]:
    """Horovod's slot for each rank, from raydist's layout."""
    from horovod.runner.common.util.hosts import SlotInfo

    # Cross-communicators group the ranks with the same local rank across nodes.
    cross_sizes = Counter(w.local_rank for w in workers)
    cross_ranks: Dict[int, int] = {}
    slots = []
    for worker in workers:
        cross_rank = cross_ranks.get(worker.local_rank, 0)
        cross_ranks[worker.local_rank] = cross_rank + 1
        slots.append(
            SlotInfo(
                hostname=worker.node_id,
                rank=worker.rank,
                local_rank=worker.local_rank,
                cross_rank=cross_rank,
                size=len(workers),
                local_size=worker.local_world_size,
                cross_size=cross_sizes[worker.local_rank],
            )
        )
    return slots


@functools.lru_cache(maxsize=None)
def scoped_rendezvous_handler() -> Type["BaseHTTPRequestHandler"]:
    """horovod's RendezvousHandler with a DELETE that clears only the scope that finished."""
    from horovod.runner.http.http_server import OK, RendezvousHandler

    class ScopedRendezvousHandler(RendezvousHandler):
        # horovod 0.28.1's DELETE, on completing any scope, empties the finished
        # lists of all scopes: a one-rank cross_<n> completing between two
        # ranks' local_<host> DELETEs leaves local_<host> uncleared, and the
        # next hvd.init() reads a peer's old address (gloo "Connection refused").
        def do_DELETE(self) -> None:
            parts = self.path.split("/")
            if len(parts) != 3 or parts[1] not in self.server.scope_size:
                super().do_DELETE()  # bad paths and ad-hoc scopes: horovod's handling is right
                return
            _, scope, key = parts
            with self.server.finished_list_lock:
                finished = self.server.finished_list[scope]
                if key not in finished:  # a DELETE the client retried counts once
                    finished.append(key)
                if len(finished) == self.server.scope_size[scope]:
                    with self.server.cache_lock:
                        self.server.cache.pop(scope, None)
                    del self.server.finished_list[scope]
            self.send_status_code(OK)

    return ScopedRendezvousHandler


def bound_rendezvous_server(host: str) -> "RendezvousServer":
    """horovod's RendezvousServer listening on ``host`` only: its own start()
    binds every interface, and the server has no authentication."""
    from horovod.runner.http.http_server import RendezvousHTTPServer, RendezvousServer
    from horovod.runner.util.threads import in_thread

    class BoundRendezvousServer(RendezvousServer):
        def start(self, handler_cls: Type["BaseHTTPRequestHandler"]) -> int:
            # Port 0: the OS picks a free port on that address.
            self._httpd = RendezvousHTTPServer((host, 0), handler_cls, self._verbose)
            self._listen_thread = in_thread(target=self._httpd.serve_forever)
            return int(self._httpd.server_address[1])

    return BoundRendezvousServer()


class HorovodRendezvous:
    """horovod's RendezvousServer on the driver's node IP, for one worker group."""

    # The server's request handler; None means scoped_rendezvous_handler().
    handler_cls: Optional[Type["BaseHTTPRequestHandler"]] = None

    def __init__(self, workers: Sequence[WorkerInfo]):
        self.address: str = ray.util.get_node_ip_address()
        self._server = bound_rendezvous_server(self.address)
        self.port: int = self._server.start(self.handler_cls or scoped_rendezvous_handler())
        self.plan = host_plan(workers)
        self._server.init(self.plan)

    def worker_envs(self) -> List[Dict[str, str]]:
        """Each rank's HOROVOD_* variables (raydist adds the torchrun ones)."""
        return [
            {
                "HOROVOD_RANK": str(slot.rank),
                "HOROVOD_SIZE": str(slot.size),
                "HOROVOD_LOCAL_RANK": str(slot.local_rank),
                "HOROVOD_LOCAL_SIZE": str(slot.local_size),
                "HOROVOD_CROSS_RANK": str(slot.cross_rank),
                "HOROVOD_CROSS_SIZE": str(slot.cross_size),
                "HOROVOD_HOSTNAME": slot.hostname,
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.address,
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.port),
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
            }
            for slot in self.plan
        ]

    def stop(self) -> None:
        self._server.stop()
        # horovod's stop() ends the serving thread but leaves the socket open.
        self._server._httpd.server_close()


class HorovodHooks:
    """The worker group's hooks for horovod (see raydist.pool.driver.hooks):
    one rendezvous server per start, stopped with the group."""

    entry: Any = None

    def __init__(self, config: Any = None) -> None:
        import_horovod()  # fail before any actor starts when it is missing
        self._rendezvous: Optional[HorovodRendezvous] = None

    def init_kwargs(self) -> Optional[Dict[str, Any]]:
        # Always: init_process_group is about torch.distributed, and a horovod
        # group has no other backend to leave to the code.
        return {"backend": "horovod"}

    def start(self, workers: Sequence[WorkerInfo]) -> List[Dict[str, str]]:
        self._rendezvous = HorovodRendezvous(workers)
        return [{**env, NODE_IP_VAR: worker.node_ip} for env, worker in zip(self._rendezvous.worker_envs(), workers)]

    def stop(self) -> None:
        rendezvous, self._rendezvous = self._rendezvous, None
        if rendezvous is not None:
            rendezvous.stop()
