"""The driver's side of ``save_state`` / ``load_state``: who owns a run's state.

A run (``raydist.run``, ``raydist run``) names its state once and gives the
name to every attempt's workers (``RAYDIST_STATE``): the keeper the first
saving rank creates under that name outlives any rank and any fresh
restart. A bare ``WorkerGroup`` names its own. Whoever named it releases it
at the end: the last committed step is written to ``state_dir`` first, then
the keeper and its holders are killed (nothing stays in memory).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from raydist.pool.cluster.seam import Cluster
from raydist.pool.records import STATE_NAMESPACE, STATE_SETTINGS_VAR

RELEASE_TIMEOUT = 300.0  # seconds to finish writing the last step to state_dir
DEATH_TIMEOUT = 30.0  # seconds for the cluster to report the killed keeper and holders dead


def new_state_name() -> str:
    return f"raydist-state-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class RunState:
    """The name of a run's state, and whether this owner releases it (a run
    for all its attempts' groups; a bare group for itself)."""

    name: str = field(default_factory=new_state_name)
    owned: bool = True

    @staticmethod
    def of(name: Optional[str]) -> "RunState":
        """A group's state: the run's ``name`` (released by the run), or its own."""
        return RunState() if name is None else RunState(name, owned=False)

    def env(self, cluster: Cluster, state_dir: Optional[str], keep: int, overhead: Optional[float]) -> Dict[str, str]:
        """The variable that tells every rank where the run's state lives (``state_dir``,
        ``keep``, ``overhead``: the run's options)."""
        settings = {"name": self.name, "driver_node": cluster.driver_node(), "state_dir": state_dir, "keep": keep, "overhead": overhead}
        return {STATE_SETTINGS_VAR: json.dumps(settings)}

    def abort(self, cluster: Cluster, attempt: int) -> None:
        """Attempt ``attempt`` failed: ranks waiting on one of its steps to commit go on
        (into the collective that fails them) instead of waiting for a dead rank."""
        keeper = cluster.find(self.name, STATE_NAMESPACE) if cluster.session() is not None else None
        if keeper is not None:  # (none: no rank saved)
            cluster.call(keeper, "abort", attempt)

    def release(self, cluster: Cluster) -> None:
        if self.owned:
            release_state(cluster, self.name)


def release_state(cluster: Cluster, name: str) -> None:
    """Write the last committed step out, then kill the keeper and its holders and
    return once the cluster reports them dead (as a group's workers are), so
    nothing of the run's state outlives it."""
    keeper = cluster.find(name, STATE_NAMESPACE) if cluster.session() is not None else None
    if keeper is None:
        return  # no rank saved: nothing was made
    holders: List[Any] = []
    try:
        cluster.get([cluster.call(keeper, "close")], timeout=RELEASE_TIMEOUT)
        holders = [holder for _, holder in cluster.get([cluster.call(keeper, "holders")], timeout=DEATH_TIMEOUT)[0]]
    except Exception:  # noqa: BLE001 - killed below regardless
        pass
    actors = [keeper, *holders]
    for actor in actors:
        cluster.kill(actor)
    # A call on a killed actor fails once the cluster knows it is dead.
    calls = [cluster.call(actor, "held_bytes") for actor in actors]
    cluster.wait(calls, num_returns=len(calls), timeout=DEATH_TIMEOUT)
