"""One call on fresh worker groups, restarted as the restart policy says.

Every attempt shares one run id and log directory (as torchrun's attempts
do); a restart waits until the old group's resources show free, so that an
elastic size counts them, and passes the old node order on, so that
surviving nodes keep their ranks. Each restart logs one line, and the new
world size once the next group is up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from raydist.config import RunConfig
from raydist.errors import RaydistError, WorkerGroupError
from raydist.pool.cluster.placement import wait_until_released
from raydist.pool.driver.group import WorkerGroup
from raydist.pool.driver.log_files import RunLogs
from raydist.pool.rules.policy import decide_restart, restart_line

logger = logging.getLogger("raydist")


@dataclass
class Attempts:
    """What the run remembers between attempts."""

    errors: List[BaseException] = field(default_factory=list)  # earlier attempts' errors, oldest first
    counted: int = 0  # restarts counted against max_restarts
    size: int = 0  # the last started attempt's world size
    started: bool = False  # whether the latest attempt's group started
    node_order: List[str] = field(default_factory=list)  # the last attempt's nodes, in node-rank order
    held: Dict[str, Dict[str, float]] = field(default_factory=dict)  # what its workers held, per node


def run_with_restarts(config: RunConfig, call: bytes) -> List[Any]:
    """``call`` (from ``prepare_call``) on a group started from ``config``; the values by rank."""
    logs = RunLogs(config)
    attempts = Attempts()
    while True:
        if attempts.held:
            wait_until_released(attempts.held)  # so that the new size (or placement) counts them
        try:
            return _attempt(config, call, logs, attempts)
        except RaydistError as error:
            decision = decide_restart(
                error,
                retry_on_exception=config.retry_on_exception,
                restarts_left=config.max_restarts - attempts.counted,
                driver_node=_driver_node(),
            )
            if decision.why_not:
                logger.error("raydist: %s", decision.why_not)
            if decision.restart is None:
                if attempts.errors and isinstance(error, WorkerGroupError):
                    raise WorkerGroupError(error.failures, attempts=attempts.errors, preempted_nodes=error.preempted_nodes) from error
                raise
            attempts.counted += decision.restart.counted
            attempts.errors.append(error)
            old_size = attempts.size if attempts.started else 0
            logger.warning(restart_line(decision.restart, old_size, len(attempts.errors), config.max_restarts, attempts.counted))


def _attempt(config: RunConfig, call: bytes, logs: RunLogs, attempts: Attempts) -> List[Any]:
    number = len(attempts.errors)
    attempts.started = False
    with WorkerGroup(config=config, restart_count=number, logs=logs, node_order=attempts.node_order) as group:
        if number:
            logger.warning("raydist: attempt %d started with world size %d (was %d)", number, group.num_workers, attempts.size)
        attempts.node_order, attempts.size, attempts.held = group.node_order, group.num_workers, group.held_resources
        attempts.started = True
        return group.submit_prepared(call).result()


def _driver_node() -> Optional[str]:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
