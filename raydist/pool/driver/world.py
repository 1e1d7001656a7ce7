"""One attempt's world: who holds which rank, and everything that watches them.

A ``World`` is built whole by ``GroupBuilder`` (at the start, and by each
warm restart), never changed, and replaced whole by the next attempt. What
belongs to it ends with it (``end``): its drain watcher, its straggler
watch, its pdb relay, its output routes, and whatever was ``attach``-ed to
it. The group's cluster holdings that outlive a world (placement group,
spares, node agents) are ``startup.Holdings``.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Protocol, Sequence, Tuple

from raydist.errors import COLLECTIVES_HEADER
from raydist.pool.driver.agents import NodeAgents
from raydist.pool.driver.debug_relay import DebugRelay
from raydist.pool.driver.output import GroupOutput
from raydist.pool.driver.stragglers import StragglerWatch
from raydist.pool.driver.watcher import GroupWatcher
from raydist.pool.records import WorkerInfo
from raydist.pool.rules.explain import format_stacks
from raydist.pool.rules.hangs import where_collectives_are
from raydist.pool.rules.logs import RankRoute
from raydist.pool.rules.stragglers import Straggler
from raydist.pool.worker.markers import Printed

if TYPE_CHECKING:
    from raydist.core.initialize import DistInfo


class Attachment(Protocol):
    """A per-attempt thing kept with a world (a data shard feed, a state
    snapshot): stopped when that world ends."""

    def stop(self) -> None: ...


class _Ending:
    """A world's one-time end (its fields are frozen; this is not)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.output_closed = False
        self.ended = False


@dataclass(frozen=True)
class World:
    """One attempt's ranks and their watchers (see the module docstring)."""

    attempt: int  # TORCHELASTIC_RESTART_COUNT of this world
    actors: Tuple[Any, ...]  # by rank
    workers: Tuple[WorkerInfo, ...]  # by rank
    contexts: Tuple[Optional["DistInfo"], ...]  # by rank; None where the code initialises itself
    routes: Tuple[RankRoute, ...]  # by rank: where its output goes
    output: GroupOutput
    agents: NodeAgents  # the group's node agents (shared by its worlds): the reads go through them
    relay: Optional[DebugRelay] = None  # pdb on any rank reaches the driver's terminal
    drains: Optional[GroupWatcher] = None  # node drains (and room to grow)
    watch: Optional[StragglerWatch] = None  # None with flight_recorder=False
    flight_recorder: bool = True
    attached: Mapping[str, Attachment] = field(default_factory=dict)
    _ending: _Ending = field(default_factory=_Ending, compare=False, repr=False)

    @property
    def size(self) -> int:
        return len(self.workers)

    def attach(self, name: str, thing: Attachment) -> "World":
        """This world with ``thing`` kept under ``name``, stopped when the world ends."""
        return dataclasses.replace(self, attached={**self.attached, name: thing}, _ending=self._ending)

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
        if self.watch is None:
            return []
        return self.watch.poll() if refresh and not self.ended else list(self.watch.stragglers)

    @property
    def drained(self) -> Mapping[str, float]:
        return dict(self.drains.drained) if self.drains is not None else {}

    @property
    def grow_by(self) -> int:
        return self.drains.grow_by if self.drains is not None else 0

    # -- end ---------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self._ending.ended

    def settle_output(self, call: int, results: Sequence[Any], failed_ranks: Sequence[int] = ()) -> List[Any]:
        """Call ``call``'s values once its output arrived (see ``GroupOutput.settle``)."""
        if self._ending.output_closed:  # the group was shut down after the call finished
            return [value.value if isinstance(value, Printed) else value for value in results]
        return self.output.settle(call, results, failed_ranks)

    def close_output(self, call: Optional[int] = None, results: Sequence[Any] = (), failed_ranks: Sequence[int] = ()) -> None:
        """The last call's lines (``call``, if given), then this attempt's files closed; once."""
        with self._ending.lock:
            if self._ending.output_closed:
                return
            self._ending.output_closed = True
        try:
            if call is not None:
                self.output.settle(call, results, failed_ranks)
        finally:
            self.output.close()

    def stop_watching(self) -> None:
        """Stop every watcher of this world (returns at once); what they saw is kept."""
        with self._ending.lock:
            self._ending.ended = True
        for watcher in (self.drains, self.watch, *self.attached.values()):
            if watcher is not None:
                watcher.stop()
        if self.relay is not None:
            self.relay.stop()

    def end(self) -> None:
        """Everything of this world stopped and closed; safe to call more than once."""
        self.stop_watching()
        self.close_output()
