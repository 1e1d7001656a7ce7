"""``StragglerWatch``: the poll (on the cluster's timer) that reads the ranks' flight recorders while
a group lives and names a rank that reaches collectives consistently late
(the rule is ``raydist.pool.rules.stragglers``).

The calls themselves carry nothing extra: every ``POLL_INTERVAL_S`` the
watch asks each node's agent, which asks its workers' diagnostics threads
(about 1 ms per rank, off the training thread's GIL-free collective waits).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from raydist.pool.cluster.seam import Cluster, Timer
from raydist.pool.records import CollectiveEntry, WorkerInfo
from raydist.pool.rules.stragglers import Straggler, find_stragglers

if TYPE_CHECKING:
    from raydist.pool.driver.agents import NodeAgents

logger = logging.getLogger("raydist")

POLL_INTERVAL_S = 0.5
REPORT_EVERY_S = 300.0  # a rank still late is named again after this long
KEPT_ENTRIES = 128  # per rank, across polls
CLOCK_SAMPLES = 3


class StragglerWatch:
    """Polls the ranks' recorders; ``stragglers`` is the latest verdict."""

    def __init__(self, workers: Sequence[WorkerInfo], agents: "NodeAgents", cluster: Cluster, interval: float = POLL_INTERVAL_S):
        self._workers = list(workers)
        self._agents = agents
        self._cluster = cluster
        self._interval = interval
        self._history: Dict[int, Dict[Tuple[str, int], CollectiveEntry]] = {w.rank: {} for w in self._workers}
        self._offsets: Optional[Dict[int, int]] = None  # read at the first poll
        self._named_at: Dict[int, float] = {}
        self.stragglers: List[Straggler] = []
        self.first_named: Dict[int, Straggler] = {}  # each rank's verdict when it was first named
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the next poll is scheduled, or cancelled, once
        self._next: Optional[Timer] = None

    def start(self) -> "StragglerWatch":
        self._schedule()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._next is not None:
                self._next.cancel()

    def _schedule(self) -> None:
        with self._lock:
            if not self._stop.is_set():
                self._next = self._cluster.after(self._interval, self._poll_now, "raydist-straggler-watch")

    def _poll_now(self) -> None:
        if not self._agents.connected:
            return
        if self._offsets is None:
            try:
                self._offsets = self._clock_offsets()
            except Exception as error:  # noqa: BLE001 - without offsets, one node's clock is assumed
                logger.debug("raydist: straggler watch could not read the nodes' clocks: %s", error)
                self._offsets = {}
        try:
            self.poll()
        except Exception as error:  # noqa: BLE001 - a watch must not die of one bad poll
            if self._stop.is_set():
                return
            logger.debug("raydist: straggler poll failed: %s", error)
        self._schedule()

    def poll(self) -> List[Straggler]:
        """Read every rank's recorder once, update the verdict, name new stragglers."""
        ranks = [w.rank for w in self._workers]
        found = self._agents.ask(self._workers, ranks, "collectives", timeout=5.0, start_missing=False)
        for rank, entries in found.items():
            kept = self._history[rank]
            for entry in entries or ():  # type: ignore[attr-defined]
                kept[(entry.group, entry.seq)] = entry
            for key in sorted(kept, key=lambda k: kept[k].created_ns)[:-KEPT_ENTRIES]:
                del kept[key]
        verdict = find_stragglers({r: list(h.values()) for r, h in self._history.items()}, self._offsets or {})
        self.stragglers = verdict
        for straggler in verdict:
            self._name(straggler)
        return verdict

    def _name(self, straggler: Straggler) -> None:
        now = self._cluster.monotonic()
        last = self._named_at.get(straggler.rank)
        self.first_named.setdefault(straggler.rank, straggler)
        if last is not None and now - last < REPORT_EVERY_S:
            return
        self._named_at[straggler.rank] = now
        worker = self._workers[straggler.rank]
        logger.warning("raydist: %s", straggler.line(f"node {worker.node_id[:12]} ({worker.node_ip})"))

    def _clock_offsets(self) -> Dict[int, int]:
        """Each rank's clock minus the driver's (ns), per node, from the
        fastest of a few round trips to its agent; 0 on the driver's node."""
        by_node: Dict[str, int] = {}
        for node in dict.fromkeys(w.node_id for w in self._workers):
            if self._agents.actor_on(node) is None:  # the driver's node, answered in this process
                continue
            samples = []
            for _ in range(CLOCK_SAMPLES):
                sent = time.time_ns()
                remote = self._agents.clock(node, timeout=5.0)
                back = time.time_ns()
                if remote is not None:
                    samples.append((back - sent, remote - (sent + back) // 2))
            if samples:
                by_node[node] = min(samples)[1]
        return {w.rank: by_node.get(w.node_id, 0) for w in self._workers}
