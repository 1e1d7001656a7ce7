"""``raydist.run``: one call on a fresh worker group, with restarts."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from raydist.config import RunConfig, check_call, make_config
from raydist.pool.elastic import RestartReason, restart_line
from raydist.pool.errors import WorkerGroupError, WorkerGroupRestart
from raydist.pool.group import WorkerGroup, pickle_call
from raydist.pool.placement import wait_until_released
from raydist.pool.logs import RunLogs

logger = logging.getLogger("raydist")


def run(
    fn: Callable[..., Any],
    *,
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    config: Optional[RunConfig] = None,
    **options: Any,
) -> List[Any]:
    """Run ``fn(*args, **kwargs)`` on every worker; return the results by rank.

    Options are ``raydist.RunConfig``'s fields, as keywords
    (``run(fn, num_workers=4, backend="gloo")``) or as ``config=``. Each
    worker gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, ...) and, unless ``init_process_group=False``, an
    initialised torch.distributed process group; ``raydist.get_context()``
    inside ``fn`` returns the rank record. Every option and the call itself
    are checked before Ray is touched.

    Restarts (each logged in one line): after a worker dies, up to
    ``max_restarts`` (after any failure with ``retry_on_exception``); after a
    preemption (a rank's node drained) and, with ``restart_to_grow``, to use
    new capacity, without counting. An elastic group (``num_workers=(min,
    max)``) restarts with the workers that fit then.

    Raises WorkerGroupError (rank, node, pid and traceback of each failure;
    earlier attempts listed), WorkerGroupTimeout, WorkerStartupTimeout,
    InfeasibleResourcesError or ConnectionError; nothing is left running.
    """
    config = make_config(config, options)
    args, kwargs = check_call(fn, args, kwargs)
    pickle_call(fn, args, kwargs)  # fail on unpicklable input before any actor starts
    logs = RunLogs(config)  # one run id and log directory for every attempt, as torchrun has
    attempts: List[BaseException] = []  # earlier attempts' errors
    node_order: List[str] = []  # the last attempt's nodes: survivors keep their ranks' order
    counted = size = 0
    held: Dict[str, Dict[str, float]] = {}  # what the last attempt's workers held, per node
    while True:
        if held:
            wait_until_released(held)  # so that the new size (or placement) counts them
        try:
            with WorkerGroup(config=config, restart_count=len(attempts), logs=logs, node_order=node_order) as group:
                if attempts:
                    logger.warning("raydist: attempt %d started with world size %d (was %d)", len(attempts), group.num_workers, size)
                node_order, size, held = group.node_order, group.num_workers, group.held_resources
                return group.run(fn, args, kwargs)
        except WorkerGroupRestart as restart:
            error: BaseException = restart
            reason: Optional[RestartReason] = RestartReason("scale-up", restart.reason, counted=False)
        except WorkerGroupError as failed:
            error, reason = failed, restart_reason(failed, config.retry_on_exception)
            if reason is not None and _driver_node() in failed.preempted_nodes:
                # Ray starts no new actors anywhere while the driver's own node drains.
                logger.error("raydist: the driver's node is being drained: no restart; run the driver on a node that stays")
                reason = None
            if reason is None or (reason.counted and counted >= config.max_restarts):
                if attempts:
                    raise WorkerGroupError(failed.failures, attempts=attempts, preempted_nodes=failed.preempted_nodes) from failed
                raise
        counted += reason.counted
        attempts.append(error)
        logger.warning(restart_line(reason, size, len(attempts), config.max_restarts, counted))


def _driver_node() -> Optional[str]:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def restart_reason(error: WorkerGroupError, retry_on_exception: bool) -> Optional[RestartReason]:
    """Why a failed group may run again, or None when it may not."""
    root = error.root_cause
    if error.preempted_nodes:
        nodes = ", ".join(node[:12] for node in error.preempted_nodes)
        return RestartReason("preemption", f"node(s) {nodes} drained by Ray", counted=False)
    if error.crashed:
        kind = "node lost" if "node died" in (root.died or "") else "failure"
        return RestartReason(kind, f"rank {root.rank} on node {root.node_id[:12]}: {root.died}", counted=True)
    if retry_on_exception:
        last = root.describe().strip().splitlines()[-1] if root.describe().strip() else "failed"
        return RestartReason("failure", f"rank {root.rank}: {last}", counted=True)
    return None
