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

import ray

from raydist.config import RunConfig
from raydist.pool.worker.state_client import NAMESPACE, SETTINGS_VAR

RELEASE_TIMEOUT = 300.0  # seconds to finish writing the last step to state_dir
DEATH_TIMEOUT = 30.0  # seconds for Ray to report the killed keeper and holders dead


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

    def env(self, config: RunConfig) -> Dict[str, str]:
        return state_env(config, self.name)

    def abort(self, attempt: int) -> None:
        abort_state(self.name, attempt)

    def release(self) -> None:
        release_state(self.name, self.owned)


def state_env(config: RunConfig, name: str) -> Dict[str, str]:
    """The variable that tells every rank where the run's state lives."""
    settings = {
        "name": name,
        "driver_node": ray.get_runtime_context().get_node_id(),
        "state_dir": config.state_dir,
        "keep": config.state_keep,
    }
    return {SETTINGS_VAR: json.dumps(settings)}


def abort_state(name: str, world: int) -> None:
    """Attempt ``world`` failed: ranks waiting on one of its steps to commit go on
    (into the collective that fails them) instead of waiting for a dead rank."""
    if not ray.is_initialized():
        return
    try:
        ray.get_actor(name, namespace=NAMESPACE).abort.remote(world)
    except Exception:  # noqa: BLE001 - no rank saved (ValueError), or Ray is going: the failure is what matters
        pass


def release_state(name: str, owned: bool = True) -> None:
    """Write the last committed step out, then kill the keeper and its holders and
    return once Ray reports them dead (as a group's workers are), so nothing of the
    run's state outlives it; nothing when the caller does not own the state (a
    group of a run)."""
    if not owned or not ray.is_initialized():
        return
    try:
        keeper = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return  # no rank saved: nothing was made
    holders: List[Any] = []
    try:
        ray.get(keeper.close.remote(), timeout=RELEASE_TIMEOUT)
        holders = [holder for _, holder in ray.get(keeper.holders.remote(), timeout=DEATH_TIMEOUT)]
    except Exception:  # noqa: BLE001 - killed below regardless
        pass
    actors = [keeper, *holders]
    for actor in actors:
        ray.kill(actor, no_restart=True)
    # A call on a killed actor fails once Ray knows it is dead.
    ray.wait([actor.held_bytes.remote() for actor in actors], num_returns=len(actors), timeout=DEATH_TIMEOUT)
