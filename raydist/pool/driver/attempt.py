"""``Attempt``: one attempt of a run, from its ranks' set-up to its end.

An attempt is numbered by the run's one counter (``Attempts.number``: the
``TORCHELASTIC_RESTART_COUNT`` its ranks see). ``GroupBuilder`` makes one
once its ranks are set up (at the start, after a fresh restart, and in each
warm restart), then ``start`` starts what watches them (the drain watcher,
the straggler watch); ``end`` ends everything the attempt started, once:
its watchers, its pdb relay, what was attached to it (a call's dataset
split) and its output files (``GroupOutput``). Its ranks never change: a
restart makes a new ``Attempt``. The placement group, the spares and the
node agents are the run's (``startup.Holdings``): a warm restart keeps them
for the next attempt.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Protocol, Sequence, Set

from raydist.errors import COLLECTIVES_HEADER, WorkerFailure, WorkerGroupClosed
from raydist.pool.driver.agents import NodeAgents
from raydist.pool.driver.debug_relay import DebugRelay
from raydist.pool.driver.output import GroupOutput
from raydist.pool.driver.stragglers import StragglerWatch
from raydist.pool.driver.summary import RunSummary
from raydist.pool.driver.watcher import GroupWatcher
from raydist.pool.records import WorkerInfo
from raydist.pool.rules.explain import format_stacks
from raydist.pool.rules.hangs import where_collectives_are
from raydist.pool.rules.logs import RankRoute
from raydist.pool.rules.stragglers import Straggler
from raydist.pool.timeline import Timeline

if TYPE_CHECKING:
    from raydist.core.initialize import DistInfo


class Attachment(Protocol):
    """A per-attempt thing kept with an attempt (a data shard feed): stopped when the attempt ends."""

    def stop(self) -> None: ...


class Attempt:
    """One attempt's ranks and what it started for them (see the module docstring)."""

    def __init__(
        self,
        number: int,
        actors: Sequence[Any],
        workers: Sequence[WorkerInfo],
        contexts: Sequence[Optional["DistInfo"]],
        routes: Sequence[RankRoute],
        output: GroupOutput,
        agents: NodeAgents,
        relay: Optional[DebugRelay],
        timeline: Timeline,
        summary: RunSummary,
        flight_recorder: bool = True,
    ):
        self.number = number  # TORCHELASTIC_RESTART_COUNT of its ranks
        self.actors = tuple(actors)  # by rank
        self.workers = tuple(workers)  # by rank
        self.contexts = tuple(contexts)  # by rank; None where the code initialises itself
        self.routes = tuple(routes)  # by rank: where its output goes
        self.output = output
        self.agents = agents  # the run's node agents: the reads go through them
        self.timeline = timeline  # the run's (it outlives the attempt): this attempt's rows go there
        self.summary = summary  # the run's, too
        self.flight_recorder = flight_recorder
        self._relay = relay  # pdb on any rank reaches the driver's terminal
        self._drains: Optional[GroupWatcher] = None  # node drains (and room to grow)
        self._watch: Optional[StragglerWatch] = None  # None with flight_recorder=False
        self._attached: Dict[str, Attachment] = {}
        self._killed: Dict[int, str] = {}  # ranks raydist killed (a hang, a straggler) -> why (``note_killed``)
        self._replaced: Set[int] = set()  # of those, the stragglers: their death is a replacement, not a failure
        self._lock = threading.Lock()  # attach() comes from the loop, stop from the loop or a failed start
        self._watching_ended = False

    @property
    def size(self) -> int:
        return len(self.workers)

    def start(self, drains: GroupWatcher, watch: Optional[StragglerWatch]) -> None:
        """Start watching the ranks (once they are set up); once."""
        assert self._drains is None and self._watch is None, f"attempt {self.number} started twice"
        self._drains, self._watch = drains.start(), watch.start() if watch is not None else None

    def attach(self, name: str, thing: Attachment) -> None:
        """Keep ``thing`` under ``name`` until the attempt ends; WorkerGroupClosed once it has."""
        with self._lock:
            if self._watching_ended:
                raise WorkerGroupClosed("this WorkerGroup has no running world to attach to")
            self._attached[name] = thing

    def attached(self, name: str) -> Optional[Attachment]:
        with self._lock:
            return self._attached.get(name)

    # -- reads -------------------------------------------------------------

    def stacks(self, ranks: Sequence[int]) -> str:
        """``ranks``' Python stacks, grouped, the odd ones out marked."""
        found = self.agents.ask(self.workers, list(ranks), "stacks")
        return format_stacks({rank: found.get(rank) for rank in ranks})  # type: ignore[misc]

    def collectives(self, known: Mapping[int, Any]) -> str:
        """Where every rank is in its collectives; ``known``: ranks whose entries came with their failure."""
        if not self.flight_recorder:
            return ""
        others = [rank for rank in range(self.size) if rank not in known]
        found = self.agents.ask(self.workers, others, "collectives") if others else {}
        return where_collectives_are({rank: known.get(rank, found.get(rank)) for rank in range(self.size)})

    def where_ranks_are(self) -> str:
        """Every rank's stack, then where each is in its collectives (``WorkerGroup.stacks``)."""
        stacks = self.stacks(range(self.size))
        collectives = self.collectives({})
        return f"{stacks}\n{COLLECTIVES_HEADER}\n{collectives}" if collectives else stacks

    def stragglers(self, refresh: bool) -> List[Straggler]:
        watch = self._watch
        if watch is None:
            return []
        return watch.poll() if refresh and not self.ended else list(watch.stragglers)

    @property
    def watch(self) -> Optional[StragglerWatch]:
        """The straggler watch (None before ``start``, or with flight_recorder=False)."""
        return self._watch

    @property
    def drained(self) -> Mapping[str, float]:
        drains = self._drains
        return dict(drains.drained) if drains is not None else {}

    @property
    def grow_by(self) -> int:
        drains = self._drains
        return drains.grow_by if drains is not None else 0

    # -- a hang or a straggler acted on ---------------------------------------

    def note_killed(self, ranks: Sequence[int], why: str, replaced: bool = False) -> None:
        """``ranks`` are being killed by raydist (``why``): their deaths say so;
        ``replaced``: stragglers put aside for spares (their death is not a failure)."""
        with self._lock:
            self._killed.update({rank: why for rank in ranks})
            if replaced:
                self._replaced.update(ranks)

    def explain_killed(self, failures: Sequence[WorkerFailure]) -> List[WorkerFailure]:
        """``failures`` with each death raydist caused said as such."""
        with self._lock:
            killed = dict(self._killed)
        return [dataclasses.replace(f, died=killed[f.rank]) if f.crashed and f.rank in killed else f for f in failures]

    @property
    def replaced(self) -> Set[int]:
        """The stragglers raydist killed to replace them."""
        with self._lock:
            return set(self._replaced)

    # -- the end -----------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self._watching_ended

    def settle_output(self, call: int, results: Sequence[Any], failed_ranks: Sequence[int] = ()) -> List[Any]:
        """Call ``call``'s values once its output arrived (see ``GroupOutput.settle``)."""
        return self.output.settle(call, results, failed_ranks)

    def stop_watching(self) -> None:
        """Stop everything that watches the ranks (returns at once), once; what
        the straggler watch saw is kept, and told to the run's summary."""
        with self._lock:
            if self._watching_ended:
                return
            self._watching_ended = True
            attached = list(self._attached.values())
        for watcher in (self._drains, self._watch, *attached):
            if watcher is not None:
                watcher.stop()
        if self._relay is not None:
            self._relay.stop()
        watch = self._watch
        if watch is not None:
            self.summary.collectives(self.number, watch.waits, watch.first_at, list(watch.first_named.values()))

    def wait_watching_ended(self, timeout: float) -> None:
        """After ``stop_watching()``: wait, at most ``timeout`` s in all, for a poll
        under way to end (the run's end: no poll may reach the cluster after it)."""
        deadline = time.monotonic() + timeout
        for watcher in (self._drains, self._watch):
            if watcher is not None:
                watcher.wait_stopped(max(0.0, deadline - time.monotonic()))

    def close_output(self, call: Optional[int] = None, results: Sequence[Any] = (), failed_ranks: Sequence[int] = ()) -> None:
        """The last call's lines (``call``, if given), then this attempt's files closed; once."""
        self.output.close(call, results, failed_ranks)

    def end(self) -> None:
        """Everything this attempt started, stopped and closed; safe to call more than once."""
        self.stop_watching()
        self.close_output()
