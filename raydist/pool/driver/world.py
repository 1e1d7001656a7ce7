"""One attempt's world: who holds which rank, and everything that watches them.

A ``World`` is built once by ``GroupBuilder`` (at the start, and by each
restart), never changed, and replaced whole by the next attempt. What
belongs to it ends with it (``end``): its ``Watchers`` (drain watcher,
straggler watch, pdb relay, and whatever was attached to it) and its
output (``GroupOutput``, which closes once). The group's cluster holdings that outlive a world (placement group,
spares, node agents) are ``startup.Holdings``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from raydist.errors import COLLECTIVES_HEADER, WorkerGroupClosed
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
    """A per-attempt thing kept with a world (a data shard feed, a state
    snapshot): stopped when that world ends."""

    def stop(self) -> None: ...


class Watchers:
    """What watches one world and ends with it: its pdb relay, its drain
    watcher and straggler watch (started once the world is up), and whatever
    was attached to it. Stopped once; nothing is attached after."""

    def __init__(self, relay: Optional[DebugRelay] = None):
        self.relay = relay  # pdb on any rank reaches the driver's terminal
        self.drains: Optional[GroupWatcher] = None  # node drains (and room to grow)
        self.watch: Optional[StragglerWatch] = None  # None with flight_recorder=False
        self._attached: Dict[str, Attachment] = {}
        self._lock = threading.Lock()
        self.ended = False

    def start(self, drains: Optional[GroupWatcher], watch: Optional[StragglerWatch]) -> None:
        self.drains, self.watch = drains, watch

    def attach(self, name: str, thing: Attachment) -> None:
        """Keep ``thing`` under ``name`` until the world ends; WorkerGroupClosed once it has."""
        with self._lock:
            if self.ended:
                raise WorkerGroupClosed("this WorkerGroup has no running world to attach to")
            self._attached[name] = thing

    def attached(self, name: str) -> Optional[Attachment]:
        with self._lock:
            return self._attached.get(name)

    def stop(self) -> None:
        """Stop every watcher (returns at once); what they saw is kept."""
        with self._lock:
            self.ended = True
            attached = list(self._attached.values())
        for watcher in (self.drains, self.watch, *attached):
            if watcher is not None:
                watcher.stop()
        if self.relay is not None:
            self.relay.stop()


@dataclass(frozen=True)
class World:
    """One attempt's ranks and what watches them (see the module docstring)."""

    attempt: int  # TORCHELASTIC_RESTART_COUNT of this world
    actors: Tuple[Any, ...]  # by rank
    workers: Tuple[WorkerInfo, ...]  # by rank
    contexts: Tuple[Optional["DistInfo"], ...]  # by rank; None where the code initialises itself
    routes: Tuple[RankRoute, ...]  # by rank: where its output goes
    output: GroupOutput
    agents: NodeAgents  # the group's node agents (shared by its worlds): the reads go through them
    watchers: Watchers = field(default_factory=Watchers)
    flight_recorder: bool = True
    timeline: Timeline = field(default_factory=lambda: Timeline(None))  # the run's (it outlives the world)
    summary: RunSummary = field(default_factory=RunSummary)  # the run's, too

    @property
    def size(self) -> int:
        return len(self.workers)

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
        watch = self.watchers.watch
        if watch is None:
            return []
        return watch.poll() if refresh and not self.ended else list(watch.stragglers)

    @property
    def drained(self) -> Mapping[str, float]:
        drains = self.watchers.drains
        return dict(drains.drained) if drains is not None else {}

    @property
    def grow_by(self) -> int:
        drains = self.watchers.drains
        return drains.grow_by if drains is not None else 0

    # -- end ---------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self.watchers.ended

    def settle_output(self, call: int, results: Sequence[Any], failed_ranks: Sequence[int] = ()) -> List[Any]:
        """Call ``call``'s values once its output arrived (see ``GroupOutput.settle``)."""
        return self.output.settle(call, results, failed_ranks)

    def close_output(self, call: Optional[int] = None, results: Sequence[Any] = (), failed_ranks: Sequence[int] = ()) -> None:
        """The last call's lines (``call``, if given), then this attempt's files closed; once."""
        self.output.close(call, results, failed_ranks)

    def stop_watching(self) -> None:
        """Stop every watcher of this world (returns at once); what they saw is kept, and told to the run's summary."""
        self.watchers.stop()
        watch = self.watchers.watch
        if watch is not None:
            self.summary.collectives(self.attempt, watch.waits, watch.first_at, list(watch.first_named.values()))

    def end(self) -> None:
        """Everything of this world stopped and closed; safe to call more than once."""
        self.stop_watching()
        self.close_output()
