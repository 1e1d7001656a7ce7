"""One call on a worker group, restarted as the restart policy says.

Every attempt shares one run id and log directory (as torchrun's attempts
do). With warm restarts the group restarts itself in place (see
``raydist.pool.driver.restart``) and the call is sent again to the same
group. Otherwise (``restart_mode="fresh"``, a growth, or a warm restart
that failed) the group is torn down, and the next one waits until the old
group's resources show free, so that an elastic size counts them, and gets
the old node order, so that surviving nodes keep their ranks. Each restart
logs why, and what it did.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from raydist.config import RunConfig
from raydist.errors import RaydistError, WorkerGroupError
from raydist.pool.cluster.seam import Cluster
from raydist.pool.driver.datasets import CallData
from raydist.pool.driver.group import WorkerGroup
from raydist.pool.driver.log_files import RunLogs
from raydist.pool.driver.startup import RunAttempt
from raydist.pool.driver.state import new_state_name, release_state
from raydist.pool.rules.policy import Decision, decide_restart, restart_line
from raydist.pool.rules.restart_plan import restart_summary

logger = logging.getLogger("raydist")


@dataclass
class Attempts:
    """What the run remembers between attempts."""

    errors: List[BaseException] = field(default_factory=list)  # earlier attempts' errors, oldest first
    counted: int = 0  # restarts counted against max_restarts
    size: int = 0  # the last started attempt's world size
    started: bool = False  # whether the latest attempt's group started
    state_name: str = field(default_factory=new_state_name)  # save_state's copies outlive every attempt's group
    node_order: List[str] = field(default_factory=list)  # the last attempt's nodes, in node-rank order
    held: Dict[str, Dict[str, float]] = field(default_factory=dict)  # what its workers held, per node
    failed_at: Optional[float] = None  # when the last attempt failed (the cluster's time())


def run_with_restarts(cluster: Cluster, config: RunConfig, call: bytes, data: Optional[CallData] = None) -> List[Any]:
    """``call`` (from ``prepare_call``) on a group started from ``config`` on
    ``cluster``; the values by rank. ``data``: its datasets, split afresh for each attempt's world."""
    logs = RunLogs(config)
    attempts = Attempts()
    group: Optional[WorkerGroup] = None
    try:
        while True:
            try:
                if group is None or group.closed:
                    attempts.started = False
                    group = _start(cluster, config, logs, attempts)
                    attempts.started = True
                return group.submit_prepared(call, data).result()
            except RaydistError as error:
                if error.restarted_in_place and group is not None:  # the group said how
                    attempts.errors.append(error)
                    attempts.counted = group.restarts_used
                    attempts.node_order, attempts.size, attempts.held = group.node_order, group.num_workers, group.held_resources
                    continue
                _fresh_restart_or_raise(cluster, config, error, attempts)
    finally:
        if group is not None:
            group.shutdown()
        release_state(cluster, attempts.state_name)


def _start(cluster: Cluster, config: RunConfig, logs: RunLogs, attempts: Attempts) -> WorkerGroup:
    """The next attempt's group, in fresh processes."""
    if attempts.held:
        cluster.wait_released(attempts.held)  # so that the new size (or placement) counts them
    number = len(attempts.errors)
    group = WorkerGroup(
        config=config, cluster=cluster, attempt=RunAttempt(number, logs, attempts.node_order, attempts.counted, attempts.state_name)
    )
    if number:
        logger.warning("raydist: attempt %d started with world size %d (was %d)", number, group.num_workers, attempts.size)
        seconds = cluster.time() - (attempts.failed_at or cluster.time())
        logger.warning(restart_summary(None, [], attempts.size, group.num_workers, seconds, config.survivor_timeout))
    attempts.node_order, attempts.size, attempts.held = group.node_order, group.num_workers, group.held_resources
    return group


def _fresh_restart_or_raise(cluster: Cluster, config: RunConfig, error: RaydistError, attempts: Attempts) -> None:
    """Count and log a restart in fresh processes, or raise (listing every attempt).
    A call's failure comes with the group's decision; a start's is decided here."""
    decision = (
        error.decision
        if isinstance(error.decision, Decision)
        else decide_restart(
            error,
            retry_on_exception=config.retry_on_exception,
            restarts_left=config.max_restarts - attempts.counted,
            driver_node=cluster.driver_node() if cluster.session() is not None else None,
        )
    )
    if decision.why_not:
        logger.error("raydist: %s", decision.why_not)
    if decision.restart is None:
        if attempts.errors and isinstance(error, WorkerGroupError):
            raise WorkerGroupError(error.failures, attempts=attempts.errors, preempted_nodes=error.preempted_nodes) from error
        raise error
    attempts.counted += decision.restart.counted
    attempts.errors.append(error)
    failures = error.failures if isinstance(error, WorkerGroupError) else []
    attempts.failed_at = min([f.timestamp for f in failures] + [cluster.time()])
    old_size = attempts.size if attempts.started else 0
    logger.warning(restart_line(decision.restart, old_size, len(attempts.errors), config.max_restarts, attempts.counted))
