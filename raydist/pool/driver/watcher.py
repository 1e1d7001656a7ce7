"""``GroupWatcher``: the thread that acts on node drains and new capacity
while a group lives. Its decisions (``look``) need no Ray; only the thread's
poll does (the sizing rules are in ``raydist.pool.rules.sizing``)."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Dict, List, Mapping, Optional, Sequence

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
        draining: Callable[[], Mapping[str, float]] = dict,  # the cluster's draining nodes (Cluster.draining_nodes)
    ):
        self._ranks_by_node: Dict[str, List[int]] = {}
        for worker in workers:
            self._ranks_by_node.setdefault(worker.node_id, []).append(worker.rank)
        self._warn = warn
        self._stop_group = stop_group
        self._room = room
        self._interval = interval
        self._draining = draining
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
        while not self._stop.wait(self._interval):
            try:
                self.look(self._draining())
            except Exception as error:  # noqa: BLE001 - a watcher must not die of one bad poll
                if self._stop.is_set():
                    return
                logger.debug("raydist: group watcher poll failed: %s", error)

    def look(self, drains: Mapping[str, float]) -> None:
        """One poll: warn the ranks on newly draining nodes; stop the group when it can grow."""
        for node_id, deadline in drains.items():
            if node_id in self._ranks_by_node and node_id not in self.drained and not self._stop.is_set():
                self.drained[node_id] = deadline
                ranks = self._ranks_by_node[node_id]
                logger.warning("raydist: node %s is draining (%s): warning %s", node_id[:12], deadline_text(deadline), ranks_text(ranks))
                self._warn(ranks, deadline)
        if self._room is not None and not self._stop.is_set():
            more = self._room()
            if more > 0:
                self._stop.set()  # one restart is enough
                self.grow_by = more
                logger.warning("raydist: room for %d more worker(s): stopping the group to restart it larger", more)
                self._stop_group()
