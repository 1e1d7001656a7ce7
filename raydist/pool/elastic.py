"""Elastic worker groups: how many workers to start, how ranks survive a
restart, and a watcher that acts on node drains and new capacity.

The rules are pure functions (tested without Ray); ``GroupWatcher`` is the
thread that applies them to a live group.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Sequence

if TYPE_CHECKING:
    from raydist.pool.layout import WorkerInfo

logger = logging.getLogger("raydist")

# How often the watcher looks at drains and free capacity.
WATCH_INTERVAL_S = 1.0


def workers_that_fit(bundle: Mapping[str, float], free_per_node: Sequence[Mapping[str, float]], strategy: str) -> int:
    """How many workers of ``bundle`` fit in ``free_per_node`` under ``strategy``
    (all bundles are equal, so counting per node is exact)."""
    fits = [int(min(free.get(name, 0.0) // amount for name, amount in bundle.items())) for free in free_per_node]
    if strategy == "STRICT_PACK":
        return max(fits, default=0)
    if strategy == "STRICT_SPREAD":
        return sum(1 for fit in fits if fit >= 1)
    return sum(fits)


def elastic_size(min_workers: int, max_workers: int, fit_now: int) -> Optional[int]:
    """As many workers as fit now, up to ``max_workers``; None below ``min_workers``."""
    size = min(max_workers, fit_now)
    return size if size >= min_workers else None


@dataclass(frozen=True)
class RestartReason:
    """Why a group is restarted, for the one line each restart logs."""

    kind: str  # "failure", "node lost", "preemption", "scale-up"
    detail: str
    counted: bool  # against max_restarts


def restart_line(reason: RestartReason, old_size: int, attempt: int, max_restarts: int, restarts_used: int) -> str:
    """One line per restart: why, the old world size, and which attempt of how many counted."""
    budget = f"restart {restarts_used} of {max_restarts}" if reason.counted else "not counted against max_restarts"
    return (
        f"raydist: {reason.kind}: {reason.detail}; world size was {old_size}; "
        f"starting attempt {attempt} ({budget})"
    )


class GroupWatcher:
    """Polls Ray while a group lives. When one of its nodes starts draining,
    it warns the ranks there at once (``warn``), once per node; with a
    ``room`` probe (``restart_to_grow``), it stops the group (``stop_group``)
    when the cluster could host more of its workers."""

    def __init__(
        self,
        workers: Sequence["WorkerInfo"],
        warn: Callable[[List[int], float], None],
        stop_group: Callable[[], None],
        room: Optional[Callable[[], int]] = None,
        interval: float = WATCH_INTERVAL_S,
    ):
        self._ranks_by_node: Dict[str, List[int]] = {}
        for worker in workers:
            self._ranks_by_node.setdefault(worker.node_id, []).append(worker.rank)
        self._warn = warn
        self._stop_group = stop_group
        self._room = room
        self._interval = interval
        self.drained: Dict[str, float] = {}  # node id -> deadline (seconds since the epoch)
        self.grow_by = 0  # set when it stopped the group to restart larger
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raydist-group-watcher", daemon=True)

    def start(self) -> "GroupWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling; returns at once (the thread ends at its next look)."""
        self._stop.set()

    def _run(self) -> None:
        from raydist.pool import ray_private

        while not self._stop.wait(self._interval):
            try:
                self._look(ray_private.draining_nodes())
            except Exception as error:  # noqa: BLE001 - a watcher must not die of one bad poll
                if self._stop.is_set():
                    return
                logger.debug("raydist: group watcher poll failed: %s", error)

    def _look(self, drains: Mapping[str, float]) -> None:
        for node_id, deadline in drains.items():
            if node_id in self._ranks_by_node and node_id not in self.drained and not self._stop.is_set():
                self.drained[node_id] = deadline
                ranks = self._ranks_by_node[node_id]
                logger.warning("raydist: node %s is draining (%s): warning %s", node_id[:12], deadline_text(deadline), _ranks(ranks))
                self._warn(ranks, deadline)
        if self._room is not None and not self._stop.is_set():
            more = self._room()
            if more > 0:
                self._stop.set()  # one restart is enough
                self.grow_by = more
                logger.warning("raydist: room for %d more worker(s): stopping the group to restart it larger", more)
                self._stop_group()


def _ranks(ranks: Sequence[int]) -> str:
    from raydist.pool.diagnostics import ranks_text

    return ranks_text(ranks)


def deadline_text(deadline: float) -> str:
    return "no deadline" if math.isinf(deadline) else f"deadline in {max(0.0, deadline - time.time()):.0f} s"

