"""``GroupWatcher``: the poll that acts on node drains and new capacity
while a group lives, run on the cluster's timer (``Cluster.after``). Its
decisions (``look``) are plain; the sizing rules are in ``raydist.pool.rules.sizing``."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from raydist.pool.cluster.seam import Cluster, Timer
from raydist.pool.records import WorkerInfo
from raydist.pool.rules.text import deadline_text, ranks_text

logger = logging.getLogger("raydist")

# How often the watcher looks at drains and free capacity.
WATCH_INTERVAL_S = 1.0


class GroupWatcher:
    """Polls the cluster while a group lives. When one of its nodes starts draining,
    it warns the ranks there at once (``warn``), once per node; with a
    ``room`` probe (``restart_to_grow``), it stops the group (``stop_group``)
    when the cluster could host more of its workers."""

    def __init__(
        self,
        workers: Sequence[WorkerInfo],
        warn: Callable[[List[int], float], None],
        stop_group: Callable[[], None],
        room: Optional[Callable[[], int]] = None,
        interval: float = WATCH_INTERVAL_S,
        cluster: Optional[Cluster] = None,  # polled for drains, and whose timer runs the polls (None: ``look`` by hand)
    ):
        self._ranks_by_node: Dict[str, List[int]] = {}
        for worker in workers:
            self._ranks_by_node.setdefault(worker.node_id, []).append(worker.rank)
        self._warn = warn
        self._stop_group = stop_group
        self._room = room
        self._interval = interval
        self._cluster = cluster
        self.drained: Dict[str, float] = {}  # node id -> deadline (seconds since the epoch)
        self.grow_by = 0  # set when it stopped the group to restart larger
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the next poll is scheduled, or cancelled, once
        self._next: Optional[Timer] = None

    def start(self) -> "GroupWatcher":
        self._schedule()
        return self

    def stop(self) -> None:
        """Stop polling; returns at once (a poll under way ends at its next look)."""
        self._stop.set()
        with self._lock:
            if self._next is not None:
                self._next.cancel()

    def wait_stopped(self, timeout: float) -> None:
        """After ``stop()``: wait, at most ``timeout`` s, for a poll under way to end."""
        with self._lock:
            last = self._next
        if last is not None:  # (the poll under way is the last timer's: once stopped, it schedules none)
            last.join(timeout)

    def _now(self) -> float:
        return self._cluster.time() if self._cluster is not None else time.time()

    def _schedule(self) -> None:
        with self._lock:
            if self._cluster is not None and not self._stop.is_set():
                self._next = self._cluster.after(self._interval, self._poll, "raydist-group-watcher")

    def _poll(self) -> None:
        assert self._cluster is not None
        try:
            self.look(self._cluster.draining_nodes())
        except Exception as error:  # noqa: BLE001 - a watcher must not die of one bad poll
            if self._stop.is_set():
                return
            logger.debug("raydist: group watcher poll failed: %s", error)
        self._schedule()

    def look(self, drains: Mapping[str, float]) -> None:
        """One poll: warn the ranks on newly draining nodes; stop the group when it can grow."""
        for node_id, deadline in drains.items():
            if node_id in self._ranks_by_node and node_id not in self.drained and not self._stop.is_set():
                self.drained[node_id] = deadline
                ranks = self._ranks_by_node[node_id]
                logger.warning(
                    "raydist: node %s is draining (%s): warning %s", node_id[:12], deadline_text(deadline, self._now()), ranks_text(ranks)
                )
                self._warn(ranks, deadline)
        if self._room is not None and not self._stop.is_set():
            more = self._room()
            if more > 0:
                self._stop.set()  # one restart is enough
                self.grow_by = more
                logger.warning("raydist: room for %d more worker(s): stopping the group to restart it larger", more)
                self._stop_group()
