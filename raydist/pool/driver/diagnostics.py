"""What the driver reads from a live group's ranks: grouped Python stacks,
where each rank is in its collectives (flight recorders), the straggler
verdict; and the relay that brings a rank's pdb to this terminal."""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Sequence

import ray

from raydist.config import RunConfig
from raydist.pool.driver.debug_relay import DebugRelay
from raydist.pool.driver.startup import Members
from raydist.pool.driver.stragglers import StragglerWatch
from raydist.pool.rules.explain import format_stacks
from raydist.pool.rules.hangs import where_collectives_are
from raydist.pool.rules.stragglers import Straggler


class GroupDiagnostics:
    """One group's diagnostics; ``members`` gives the group's members once built (None after)."""

    def __init__(self, config: RunConfig, members: Callable[[], Optional[Members]]):
        self._config = config
        self._members = members
        # breakpoint() on any rank reaches this driver's terminal through the relay.
        self.relay = DebugRelay(ray.util.get_node_ip_address())
        self.watch: Optional[StragglerWatch] = None

    def env(self) -> Mapping[str, str]:
        """What every rank needs (the relay's address and token)."""
        return self.relay.env()

    def start(self) -> None:
        """Once the group is up, and again after each warm restart: watch the
        current world for stragglers (with the flight recorder on)."""
        self.pause()  # the old world's ranks, pids and recorder history go with it
        members = self._members()
        if self._config.flight_recorder and members is not None:
            self.watch = StragglerWatch(members.workers, members.agents).start()

    def pause(self) -> None:
        """Stop watching (the world is about to change); ``start`` watches the next one."""
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.stop()

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()  # kept: its last verdict still answers stragglers()
        self.relay.stop()

    def stacks(self, ranks: Sequence[int]) -> str:
        """``ranks``' Python stacks, grouped, the odd ones out marked."""
        members = self._members()
        if members is None:
            return ""
        found = members.agents.ask(members.workers, list(ranks), "stacks")
        return format_stacks({rank: found.get(rank) for rank in ranks})  # type: ignore[misc]

    def collectives(self, known: Mapping[int, Any]) -> str:
        """Where every rank is in its collectives; ``known``: ranks whose entries came with their failure."""
        members = self._members()
        if not self._config.flight_recorder or members is None:
            return ""
        size = len(members.workers)
        others = [rank for rank in range(size) if rank not in known]
        found = members.agents.ask(members.workers, others, "collectives") if others else {}
        return where_collectives_are({rank: known.get(rank, found.get(rank)) for rank in range(size)})

    def stragglers(self, refresh: bool) -> List[Straggler]:
        if self.watch is None:
            return []
        return self.watch.poll() if refresh else list(self.watch.stragglers)
