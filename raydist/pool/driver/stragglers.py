"""``StragglerWatch``: the poll (on the cluster's timer) that reads the ranks' flight recorders while
a group lives and names a rank that reaches collectives consistently late
(the rule is ``raydist.pool.rules.stragglers``); with ``hang_timeout``, it
also tells the run when ranks have not reached a collective the others wait
in for that long (``raydist.pool.rules.hangs.not_arrived``), once per hang;
with ``straggler_action="replace"``, when a straggler has stayed late for
``straggler_windows`` windows in a row (``lengthen_streaks``), and again
after as many more if it is still there.

The calls themselves carry nothing extra: every ``POLL_INTERVAL_S`` the
watch asks each node's agent, which asks its workers' diagnostics threads
(about 1 ms per rank, off the training thread's GIL-free collective waits).
What it reads also feeds the run's summary (each rank's seconds waiting in
collectives for the last rank to arrive; when the world's first collective
came) and, with the timeline on, each collective as a moment on its rank's
row (gloo's recorder has when a rank entered a collective, not when it left).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from raydist.pool.cluster.seam import Cluster, Timer
from raydist.pool.records import CollectiveEntry, WorkerInfo
from raydist.pool.rules.hangs import NotArrived, not_arrived
from raydist.pool.rules.stragglers import Straggler, Streak, find_stragglers, lengthen_streaks
from raydist.pool.timeline import Timeline

if TYPE_CHECKING:
    from raydist.pool.driver.agents import NodeAgents

logger = logging.getLogger("raydist")

POLL_INTERVAL_S = 0.5
REPORT_EVERY_S = 300.0  # a rank still late is named again after this long
KEPT_ENTRIES = 128  # per rank, across polls
CLOCK_SAMPLES = 3
CLOCK_TIMEOUT_S = 1.0  # a round trip slower than this tells nothing of a clock's offset
HangSeen = Callable[[int, NotArrived, float], None]  # (attempt, the hang, seconds it lasted)
SlowSeen = Callable[[int, Straggler, int], None]  # (attempt, the straggler, windows it stayed late)


class StragglerWatch:
    """Polls the ranks' recorders; ``stragglers`` is the latest verdict."""

    def __init__(
        self,
        workers: Sequence[WorkerInfo],
        agents: "NodeAgents",
        cluster: Cluster,
        interval: float = POLL_INTERVAL_S,
        timeline: Optional[Timeline] = None,
        attempt: int = 0,
        since: Optional[float] = None,
        hang_timeout: Optional[float] = None,
        on_hang: Optional[HangSeen] = None,
        slow: Optional[Tuple[float, int]] = None,
        on_slow: Optional[SlowSeen] = None,
    ):
        self._workers = list(workers)
        # A kept process's recorder still holds its last world's collectives: only this world's count.
        self._since_ns = None if since is None else int(since * 1e9)
        self._timeline = timeline if timeline is not None and timeline.on else None
        self._attempt = attempt
        self.waits: Dict[int, float] = {w.rank: 0.0 for w in self._workers}  # seconds waiting for the last rank to arrive
        self.first_at: Optional[float] = None  # when the first collective was entered (seconds since the epoch)
        self._counted: set = set()  # collectives whose waits are summed
        self._agents = agents
        self._cluster = cluster
        self._interval = interval
        self._history: Dict[int, Dict[Tuple[str, int], CollectiveEntry]] = {w.rank: {} for w in self._workers}
        self._offsets: Optional[Dict[int, int]] = None  # read at the first poll
        self._named_at: Dict[int, float] = {}
        self.stragglers: List[Straggler] = []
        self.first_named: Dict[int, Straggler] = {}  # each rank's verdict when it was first named
        self._hang_timeout, self._on_hang = hang_timeout, on_hang
        self._hang_since: Dict[Tuple[str, int, Tuple[int, ...]], float] = {}  # a hang seen -> when first (cluster clock)
        self._slow, self._on_slow = slow, on_slow  # (threshold in seconds, windows in a row) to tell
        self._streaks: Dict[int, Streak] = {}
        self._seen = 0  # collectives every rank recorded, in all (the streaks' clock)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the next poll is scheduled, or cancelled, once
        self._next: Optional[Timer] = None

    def start(self) -> "StragglerWatch":
        self._schedule()
        return self

    def stop(self) -> None:
        """Stop polling; returns at once (a poll under way ends within an ask's slice)."""
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
        found = self._agents.ask(self._workers, ranks, "collectives", timeout=5.0, start_missing=False, stopping=self._stop.is_set)
        for rank, entries in found.items():
            kept = self._history[rank]
            for entry in entries or ():  # type: ignore[attr-defined]
                if self._since_ns is not None and entry.created_ns - (self._offsets or {}).get(rank, 0) < self._since_ns:
                    continue
                key = (entry.group, entry.seq)
                if key not in kept:
                    self._saw(rank, entry)
                kept[key] = entry
            for key in sorted(kept, key=lambda k: kept[k].created_ns)[:-KEPT_ENTRIES]:
                del kept[key]
        self._count_waits()
        if self._on_hang is not None:
            self._check_hang(read=set(found) == set(ranks) and all(entries is not None for entries in found.values()))
        verdict = find_stragglers({r: list(h.values()) for r, h in self._history.items()}, self._offsets or {})
        self.stragglers = verdict
        for straggler in verdict:
            self._name(straggler)
        self._check_slow(verdict)
        return verdict

    def _check_slow(self, verdict: List[Straggler]) -> None:
        """Tell the run of a straggler late for ``windows`` windows in a row; its
        streak starts again (a replacement the run declined is asked again later)."""
        if self._slow is None or self._on_slow is None:
            return
        threshold, windows = self._slow
        self._streaks = lengthen_streaks(self._streaks, verdict, self._seen, threshold)
        for straggler in verdict:
            streak = self._streaks.get(straggler.rank)
            if streak is not None and streak.windows >= windows:
                del self._streaks[straggler.rank]
                self._on_slow(self._attempt, straggler, streak.windows)

    def _check_hang(self, read: bool) -> None:
        """Tell the run of ranks that have not reached a collective for ``hang_timeout``
        (once per hang). Only on a poll that read every rank: an unanswered one may be anywhere."""
        found = not_arrived({rank: list(kept.values()) for rank, kept in self._history.items()}) if read else None
        if found is None:
            self._hang_since.clear()
            return
        now = self._cluster.monotonic()
        since = self._hang_since.setdefault(found.key, now)
        for key in [k for k in self._hang_since if k != found.key]:
            del self._hang_since[key]
        if self._hang_timeout is not None and now - since >= self._hang_timeout and self._on_hang is not None:
            on_hang, self._on_hang = self._on_hang, None  # once: the run acts on it, or has ended this world
            on_hang(self._attempt, found, now - since)

    def _saw(self, rank: int, entry: CollectiveEntry) -> None:
        """A collective seen for the first time on ``rank``."""
        at = (entry.created_ns - (self._offsets or {}).get(rank, 0)) / 1e9
        self.first_at = at if self.first_at is None else min(self.first_at, at)
        if self._timeline is not None:
            worker = self._workers[rank]
            shapes = ", ".join("x".join(map(str, shape)) for shape in entry.shapes)
            self._timeline.instant(
                entry.op, "collective", at, rank, worker.node_id, attempt=self._attempt, seq=entry.seq, group=entry.group, shapes=shapes
            )

    def _count_waits(self) -> None:
        """Add each collective every rank has now recorded, once: a rank waited from its
        entry until the last rank's."""
        offsets, history = self._offsets or {}, self._history
        first = history[self._workers[0].rank] if self._workers else {}
        for key in [k for k in first if k not in self._counted]:
            times = {rank: kept[key].created_ns - offsets.get(rank, 0) for rank, kept in history.items() if key in kept}
            if len(times) < len(history):
                continue
            self._counted.add(key)
            self._seen += 1
            last = max(times.values())
            for rank, entered in times.items():
                self.waits[rank] += (last - entered) / 1e9
        self._counted &= set(first)  # the ones trimmed from the history are not seen again

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
                if self._stop.is_set():
                    break
                sent = time.time_ns()
                remote = self._agents.clock(node, timeout=CLOCK_TIMEOUT_S)
                back = time.time_ns()
                if remote is not None:
                    samples.append((back - sent, remote - (sent + back) // 2))
            if samples:
                by_node[node] = min(samples)[1]
        return {w.rank: by_node.get(w.node_id, 0) for w in self._workers}
