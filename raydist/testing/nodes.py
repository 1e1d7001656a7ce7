"""The fake cluster's nodes and placements: what is alive, draining, free,
and where each reserved bundle sits (``FakeCluster`` asks it; its processes
live in ``raydist.testing.fake``). Bundles go first-fit in node order,
on distinct nodes under the node layout; a lost node's bundles are placed
again wherever there is room, as Ray re-places them."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from raydist.errors import InfeasibleResourcesError, WorkerGroupClosed
from raydist.pool.records import ClusterNode
from raydist.pool.rules.sizing import NodeSelection, Request, elastic_size
from raydist.testing.workers import node_ip

DRIVER_NODE = "driver-node"  # where the driver runs: no room for workers


@dataclass(eq=False)
class FakeNode:
    node_id: str
    resources: Dict[str, float]
    alive: bool = True
    drain_deadline: Optional[float] = None


@dataclass(eq=False)
class FakeReservation:
    number: int
    bundle: Dict[str, float]
    nodes: Dict[int, Optional[str]]  # bundle -> node (None: waiting for room)
    node_layout: bool = False
    freed: bool = False
    selection: NodeSelection = field(default_factory=NodeSelection)  # the nodes its bundles may go to (Ray's label selector)


class FakeNodes:
    def __init__(self, nodes: Mapping[str, Mapping[str, float]]):
        self.nodes = {DRIVER_NODE: FakeNode(DRIVER_NODE, {})} | {n: FakeNode(n, dict(r)) for n, r in nodes.items()}
        self.reservations: List[FakeReservation] = []
        self._numbers = itertools.count()

    def alive(self) -> List[ClusterNode]:
        return [ClusterNode(n.node_id, node_ip(n.node_id), dict(n.resources)) for n in self.nodes.values() if n.alive]

    def draining(self) -> Dict[str, float]:
        return {n.node_id: n.drain_deadline for n in self.nodes.values() if n.alive and n.drain_deadline is not None}

    def usable(self) -> List[ClusterNode]:
        """Where new bundles may go: alive, not draining, not the driver's."""
        draining = self.draining()
        return [node for node in self.alive() if node.node_id not in draining and node.node_id != DRIVER_NODE]

    def free(self) -> Dict[str, Dict[str, float]]:
        """Each alive node's resources less the bundles placed on it."""
        free = {n.node_id: dict(n.resources) for n in self.nodes.values() if n.alive}
        for reservation in self.reservations:
            for node in reservation.nodes.values():
                if not reservation.freed and node in free:
                    for name, amount in reservation.bundle.items():
                        free[node][name] = free[node].get(name, 0.0) - amount
        return free

    def room_for(self, request: Request, taken: Sequence[str] = ()) -> int:
        return request.room(self.free(), self.usable(), taken)

    def reserve(
        self, request: Request, timeout: float, now: Callable[[], float], sleep: Callable[[float], None], stopping: Callable[[], bool]
    ) -> FakeReservation:
        """The request's bundles once they fit (InfeasibleResourcesError at once when
        they never can, or after ``timeout`` seconds of the cluster's clock)."""
        reason = request.infeasibility(self.usable())
        if reason is not None:
            raise InfeasibleResourcesError(reason)
        deadline = now() + timeout
        while (reservation := self.reserve_now(request)) is None:
            if now() >= deadline:
                raise InfeasibleResourcesError(f"gave up after {timeout:g} s waiting for room (fake cluster)")
            if stopping():
                raise WorkerGroupClosed("this WorkerGroup was shut down while it waited for room")
            sleep(min(1.0, deadline - now()))
        return reservation

    def reserve_now(self, request: Request) -> Optional[FakeReservation]:
        """The request's bundles, placed, if they fit now (an elastic size: as many as fit)."""
        low, high = request.sizes
        size = high if low == high else elastic_size(low, high, self.room_for(request))
        if size is None or self.room_for(request) < size:
            return None
        reservation = FakeReservation(
            next(self._numbers), dict(request.bundle), {b: None for b in range(size)}, request.node_layout, selection=request.selection
        )
        self.reservations.append(reservation)
        self.place(reservation)
        return reservation

    def occupy(self, node_id: str, resources: Mapping[str, float]) -> FakeReservation:
        """A placement that is not the engine's, on one node."""
        reservation = FakeReservation(next(self._numbers), dict(resources), {0: node_id})
        self.reservations.append(reservation)
        return reservation

    def release(self, reservation: FakeReservation) -> None:
        reservation.freed = True

    def release_all(self) -> None:
        for reservation in self.reservations:
            reservation.freed = True

    def place(self, reservation: FakeReservation) -> None:
        """Put each unplaced bundle on the first node with room (one pass over
        the nodes: the bundles are alike, so a node without room for one now
        has none for the next; under the node layout, one bundle a node)."""
        if reservation.freed:
            return
        free, candidates = self.free(), [node for node in self.usable() if reservation.selection.allows(node)]
        used = set(reservation.nodes.values())
        index = 0
        for bundle in [b for b, node in reservation.nodes.items() if node is None]:
            while index < len(candidates):
                node_id = candidates[index].node_id
                room = free.get(node_id, {})
                fits = all(room.get(name, 0.0) + 1e-9 >= amount for name, amount in reservation.bundle.items())
                if fits and not (reservation.node_layout and node_id in used):
                    reservation.nodes[bundle] = node_id
                    used.add(node_id)
                    for name, amount in reservation.bundle.items():
                        room[name] = room.get(name, 0.0) - amount
                    break
                index += 1

    def lose(self, node_id: str) -> None:
        """The node is gone; its bundles are placed again where there is room."""
        self.nodes[node_id].alive = False
        for reservation in self.reservations:
            lost = [bundle for bundle, node in reservation.nodes.items() if node == node_id]
            for bundle in lost:
                reservation.nodes[bundle] = None
            if lost:
                self.place(reservation)

    def add(self, node_id: str, resources: Mapping[str, float]) -> None:
        self.nodes[node_id] = FakeNode(node_id, dict(resources))
        for reservation in self.reservations:
            self.place(reservation)
