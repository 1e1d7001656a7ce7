"""Horovod on the worker group: horovod's own Gloo rendezvous server, run by
the driver, with a host plan built from the group's node layout.

Horovod scopes its gloo rendezvous by hostname (``local_<HOROVOD_HOSTNAME>``):
each worker's HOROVOD_HOSTNAME is its Ray node id, exactly as in the plan, so
several raylets sharing one IP are still told apart.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import psutil
import ray

from raydist.pool.layout import WorkerInfo

if TYPE_CHECKING:  # horovod is imported only when a horovod group starts
    from horovod.runner.common.util.hosts import SlotInfo


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


class HorovodRendezvous:
    """horovod's RendezvousServer on the driver's node, for one worker group."""

    def __init__(self, workers: Sequence[WorkerInfo]):
        from horovod.runner.http.http_server import RendezvousServer

        self._server = RendezvousServer()
        self.port: int = self._server.start()
        self.address: str = ray.util.get_node_ip_address()
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


def interface_for_ip(ip: str) -> Optional[str]:
    """The network interface that holds ``ip`` (horovod's gloo binds to an interface)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(address.address == ip for address in addresses):
            return name
    return None
