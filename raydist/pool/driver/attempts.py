"""``Attempts``: a run's one attempt counter, its restart budget and its
history, and the one place the restart policy is asked.

The controller (``raydist.pool.driver.controller``) gathers the facts of a
failure; ``decide`` puts them to the policy (``raydist.pool.rules.policy``,
injectable), ``count`` charges a restart and says so in one log line, and
``final`` is the error a run ends with (listing the attempts before it)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Collection, List, Optional, Tuple

from raydist.errors import RaydistError, WorkerGroupError
from raydist.pool.cluster.seam import Cluster
from raydist.pool.driver.startup import Holdings
from raydist.pool.rules.hangs import NotArrived
from raydist.pool.rules.policy import Decision, Facts, RestartReason, decide, replace_hung, replace_straggler, restart_line
from raydist.pool.rules.restart_plan import restart_summary
from raydist.pool.rules.stragglers import Straggler

logger = logging.getLogger("raydist")

Policy = Callable[[BaseException, Facts], Decision]


@dataclass(frozen=True)
class RestartOptions:
    """The run's options that its restarts read."""

    max_restarts: int
    retry_on_exception: bool
    warm_restarts: bool
    survivor_timeout: float  # for the restart's log line


class Attempts:
    def __init__(self, options: RestartOptions, fresh_restarts: bool, cluster: Cluster, policy: Optional[Policy] = None):
        self._options = options
        self._cluster = cluster  # its metrics get the restarts
        self.fresh_restarts = fresh_restarts  # a run starts new attempts; a WorkerGroup raises instead
        self._policy = policy or decide  # injectable: the engine tests pass their own
        self.number = 0  # the attempt that runs or starts (TORCHELASTIC_RESTART_COUNT)
        self.restarts_used = 0  # counted against max_restarts
        self.history: List[BaseException] = []  # the errors the run restarted after, oldest first

    def decide(
        self, error: BaseException, holdings: Optional[Holdings], *, started: bool, warm_failed: bool = False, stopping: bool = False
    ) -> Decision:
        """The policy's answer to ``error`` on ``cluster`` (``started``: the
        attempt had started; ``warm_failed``: the warm restart it chose could
        not finish; ``stopping``: a stop was asked meanwhile)."""
        config = self._options
        facts = Facts(
            restarts_left=config.max_restarts - self.restarts_used,
            retry_on_exception=config.retry_on_exception,
            driver_node=self._cluster.driver_node() if self._cluster.session() is not None else None,
            started=started,
            warm_restarts=config.warm_restarts,
            node_layout=holdings is not None and holdings.request.node_layout,
            fresh_allowed=self.fresh_restarts,
            warm_failed=warm_failed,
            stopping=stopping,
        )
        decision = self._policy(error, facts)
        if decision.why_not:
            logger.error("raydist: %s", decision.why_not)
        return decision

    def hung(self, hang: NotArrived, stopping: bool) -> Tuple[int, ...]:
        """The policy's answer to a hang: the ranks to kill (their death is then decided on as a failure)."""
        return replace_hung(hang, stopping)

    def straggler(self, straggler: Straggler, node: str, holdings: Holdings, excluded: Collection[str], stopping: bool) -> Tuple[int, ...]:
        """The policy's answer to a lasting straggler on ``node``: the ranks to kill (their death is then a replacement)."""
        return replace_straggler(straggler, node, holdings.spares.seats(), excluded, stopping)

    def count(self, decision: Decision, error: BaseException, old_size: int) -> None:
        """The next attempt begins after ``error``: counted, logged, remembered."""
        assert decision.reason is not None
        self.restarts_used += int(decision.reason.counted)
        self.history.append(error)
        self.number += 1
        self._cluster.record("raydist_restarts", 1, {"kind": decision.action.value})
        logger.warning(restart_line(decision.reason, old_size, self.number, self._options.max_restarts, self.restarts_used))

    @property
    def next(self) -> int:
        """The number the next attempt gets (a warm restart builds it before it is counted)."""
        return self.number + 1

    def restarted_after(self, error: BaseException) -> bool:
        return any(error is earlier for earlier in self.history)

    def scaled(self, stopped: BaseException, more: int, old_size: int) -> None:
        """The next attempt begins, larger (``stopped``: what the calls cut short
        get): not a failure, not counted."""
        self.history.append(stopped)
        self.number += 1
        self._cluster.record("raydist_restarts", 1, {"kind": "resize"})
        reason = RestartReason("scale-up", f"the cluster has room for {more} more worker(s)", counted=False)
        logger.warning(restart_line(reason, old_size, self.number, self._options.max_restarts, self.restarts_used))

    def final(self, error: RaydistError) -> RaydistError:
        """The error the run ends with: a run that restarted before lists its earlier attempts."""
        if self.history and isinstance(error, WorkerGroupError) and self.fresh_restarts:
            return WorkerGroupError(error.failures, attempts=self.history, preempted_nodes=error.preempted_nodes)
        return error

    def started(self, size: int, old_size: int, failed: BaseException, now: float) -> None:
        """Say that a fresh attempt started, and how long after the failure ``failed``."""
        logger.warning("raydist: attempt %d started with world size %d (was %d)", self.number, size, old_size)
        failures = failed.failures if isinstance(failed, WorkerGroupError) else []
        seconds = now - min([f.timestamp for f in failures] + [now])
        self._cluster.record("raydist_recovery_seconds", seconds, {})
        logger.warning(restart_summary(None, [], old_size, size, seconds, self._options.survivor_timeout))
