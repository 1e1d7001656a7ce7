"""Spare workers: started ahead of time, outside the world, ready to take a
dead rank's place in a warm restart.

A spare is a worker actor in its own bundle of the group's placement group
(so spares count in placement and in infeasibility messages) that has
reported where it runs and imported torch with its device pinned
(``RayWorker.stand_by``). A spare that joins a world is replaced in the
background, in a free bundle, by a thread that ends once the new spare is
ready (or could not start within ``startup_timeout``). The thread first waits
``REFILL_DELAY_S``, its bundle reserved: a new spare's start (Ray's worker,
torch's imports: about 5 CPU-seconds) would otherwise compete with the new
world's own first seconds (its model build, state load, first step) on the
node's cores. With ``run_ahead``, a spare that stood by is told the run's
call, which it runs up to its first ``load_state`` (``worker.run_ahead``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Collection, List, Mapping, Optional, Sequence, Set

from raydist.core.accelerators import Accelerator
from raydist.pool.cluster.seam import Cluster, Reservation, Timer, Worker
from raydist.pool.records import Placement
from raydist.pool.rules.layout import standby_env
from raydist.pool.rules.restart_plan import Seat

logger = logging.getLogger("raydist")

# Seconds a used spare's replacement waits before it starts. On a 2-core node,
# the crash-with-a-spare recovery (failure -> first step with the state restored,
# benchmarks/state.py) took 1.16 s instead of 1.62 s (medians of 6), and 3.26 s
# instead of 3.96 s (medians of 5, interleaved, a third of the cores' time stolen).
# A second failure within this window gets a new process instead of a spare.
REFILL_DELAY_S = 5.0


@dataclass
class Spare:
    actor: Worker
    placement: Placement  # where it runs; ``index`` is its bundle


class SparePool:
    """A group's spares: the ready ones, and those still starting."""

    def __init__(
        self,
        cluster: Cluster,
        wanted: int,
        pg: Optional[Reservation],
        bundle: dict,
        accelerator: Accelerator,
        timeout: float,
        placed: Callable[[Sequence[Placement]], None] = lambda placements: None,
        healthy: Optional[Callable[[Worker, Placement, Mapping[str, str]], bool]] = None,
    ):
        self.wanted = wanted
        self._cluster = cluster
        self._pg, self._bundle, self._accelerator, self._timeout = pg, bundle, accelerator, timeout
        self._placed = placed  # told of each new spare's process (its files are removed with the group)
        self._healthy = healthy  # the pre-flight check of a new spare (with health_check): False drops it
        self._lock = threading.Lock()
        self._ready: List[Spare] = []
        self._starting: dict = {}  # bundle -> actor (None: reserved, waiting REFILL_DELAY_S)
        self._closed = threading.Event()  # set by close()
        self._timers: List[Timer] = []  # every refill's (cancelled by close(), joined by wait_closed())
        self._ahead: Any = None  # the call spares run ahead to its load_state (run_ahead), as sent
        self._ahead_given: Set[int] = set()  # bundles of the spares that run it

    def run_ahead(self, call: Any) -> None:
        """Spares run ``call`` (bytes, or the cluster's shared copy) ahead to its first
        ``load_state``: each ready one now, each new one once it stood by."""
        with self._lock:
            if call is not self._ahead:
                self._ahead, self._ahead_given = call, set()
            spares = [s for s in self._ready if s.placement.index not in self._ahead_given]
            self._ahead_given.update(s.placement.index for s in spares)
        for spare in spares:
            self._cluster.call(spare.actor, "run_ahead", call)

    def adopt(self, spares: Sequence[Spare], workers: Sequence[Placement]) -> None:
        """Spares started with the group: pin their devices now (not waited for)."""
        for spare in spares:
            env = standby_env(spare.placement, [s.placement for s in spares], workers, self._accelerator)
            self._cluster.call(spare.actor, "stand_by", env, self._accelerator.device_type)
        with self._lock:
            self._ready.extend(spares)

    @property
    def ready(self) -> List[Spare]:
        with self._lock:
            return list(self._ready)

    def seats(self) -> List[Seat]:
        return [Seat(s.placement.index, s.placement.node_id) for s in self.ready]

    def bundles(self) -> Set[int]:
        """Every bundle a spare holds or is starting in."""
        with self._lock:
            return {s.placement.index for s in self._ready} | set(self._starting)

    def take(self, positions: Sequence[int]) -> List[Spare]:
        """Remove the ready spares at ``positions`` (as ``seats()`` listed them) to join a world."""
        with self._lock:
            taken = [self._ready[i] for i in positions]
            self._ready = [s for i, s in enumerate(self._ready) if i not in set(positions)]
        return taken

    def drop_on(self, nodes: Collection[str]) -> List[Worker]:
        """Forget spares on ``nodes`` (lost or draining); their actors, to kill."""
        with self._lock:
            gone = [s for s in self._ready if s.placement.node_id in nodes]
            self._ready = [s for s in self._ready if s.placement.node_id not in nodes]
        return [s.actor for s in gone]

    def refill(self, seats: Sequence[Seat], workers: Callable[[], List[Placement]]) -> None:
        """Start spares in ``seats`` until ``wanted`` are ready or starting, each in the background."""
        with self._lock:
            missing = self.wanted - len(self._ready) - len(self._starting)
            chosen = list(seats)[: max(0, missing)]
            self._starting.update((seat.bundle, None) for seat in chosen)  # reserved meanwhile
        for seat in chosen:
            timer = self._cluster.after(REFILL_DELAY_S, partial(self._start_one, seat, workers), "raydist-spare")
            with self._lock:
                self._timers.append(timer)

    def _start_one(self, seat: Seat, workers: Callable[[], List[Placement]]) -> None:
        if self._closed.is_set():
            return  # closed meanwhile: nothing was started
        cluster = self._cluster
        actor = cluster.start_worker(self._pg, seat.bundle, self._bundle, self._accelerator.ray_resource)
        with self._lock:
            if self._closed.is_set():
                cluster.kill(actor)
                return
            self._starting[seat.bundle] = actor
        spare: Optional[Spare] = None
        try:
            placement = cluster.get([cluster.call(actor, "describe", seat.bundle)], timeout=self._timeout)[0]
            self._placed([placement])
            env = standby_env(placement, [s.placement for s in self.ready], workers(), self._accelerator)
            cluster.get([cluster.call(actor, "stand_by", env, self._accelerator.device_type)], timeout=self._timeout)
            if self._healthy is None or self._healthy(actor, placement, env):
                spare = Spare(actor, placement)
                with self._lock:
                    ahead = self._ahead
                    if ahead is not None:
                        self._ahead_given.add(seat.bundle)
                if ahead is not None:
                    cluster.call(actor, "run_ahead", ahead)
        except Exception as error:  # noqa: BLE001 - a spare that cannot start is left out, not fatal
            if not self._closed.is_set():  # else the group was shut down meanwhile and killed it
                logger.warning("raydist: a new spare worker could not start in bundle %d: %s", seat.bundle, error)
        with self._lock:
            self._starting.pop(seat.bundle, None)
            if spare is not None and not self._closed.is_set():
                self._ready.append(spare)
                return
        cluster.kill(actor)

    def close(self) -> List[Worker]:
        """Stop refilling; every spare actor (ready or starting), to kill."""
        with self._lock:
            self._closed.set()
            actors = [s.actor for s in self._ready] + [a for a in self._starting.values() if a is not None]
            self._ready, self._starting, timers = [], {}, self._timers
        for timer in timers:
            timer.cancel()
        return actors

    def wait_closed(self, timeout: float) -> None:
        """After ``close()``: wait, at most ``timeout`` s in all, for the spares
        being started to end (their calls fail fast once their actors are killed)."""
        with self._lock:
            timers = list(self._timers)
        deadline = time.monotonic() + timeout
        for timer in timers:
            timer.join(max(0.0, deadline - time.monotonic()))
