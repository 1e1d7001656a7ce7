"""``raydist.run``: one call on a fresh worker group, with restarts."""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Sequence

from raydist.config import RunConfig, check_call, make_config
from raydist.pool.errors import WorkerGroupError
from raydist.pool.group import WorkerGroup, pickle_call


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

    Raises WorkerGroupError (rank, node, pid and traceback of each failure),
    WorkerGroupTimeout, WorkerStartupTimeout, InfeasibleResourcesError or
    ConnectionError; nothing is left running.
    """
    config = make_config(config, options)
    args, kwargs = check_call(fn, args, kwargs)
    pickle_call(fn, args, kwargs)  # fail on unpicklable input before any actor starts
    attempts: List[WorkerGroupError] = []
    for attempt in range(config.max_restarts + 1):
        try:
            with WorkerGroup(config=config, restart_count=attempt) as group:
                return group.run(fn, args, kwargs)
        except WorkerGroupError as error:
            retryable = error.crashed or config.retry_on_exception
            if not retryable or attempt == config.max_restarts:
                if attempts:
                    raise WorkerGroupError(error.failures, attempts=attempts) from error
                raise
            attempts.append(error)
    raise AssertionError("unreachable")
