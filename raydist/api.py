"""``raydist.run``: one call on a fresh worker group, with restarts."""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Sequence

from raydist.pool.errors import WorkerGroupError
from raydist.pool.group import WorkerGroup, _check_num_workers, pickle_call
from raydist.pool.object_store import DEFAULT_THRESHOLD_BYTES


def run(
    fn: Callable[..., Any],
    *,
    num_workers: Optional[int] = None,
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    accelerator: str = "auto",
    resources_per_worker: Optional[Mapping[str, float]] = None,
    backend: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    placement_strategy: str = "PACK",
    timeout: Optional[float] = None,
    startup_timeout: float = 300.0,
    max_restarts: int = 0,
    retry_on_exception: bool = False,
    address: Optional[str] = None,
    init_process_group: bool = True,
    object_store_threshold: Optional[int] = DEFAULT_THRESHOLD_BYTES,
) -> List[Any]:
    """Run ``fn(*args, **kwargs)`` on ``num_workers`` Ray actors; return the results by rank.

    Each worker gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, ...) and, unless ``init_process_group=False``, an initialised
    torch.distributed process group (``backend`` defaults to the device's:
    nccl for GPUs, hccl for NPUs, gloo on CPU; ``"horovod"`` runs hvd.init()
    instead). ``raydist.get_context()`` inside ``fn`` returns the rank record.

    num_workers: None means one worker per accelerator in the cluster (like
        torchrun's ``--nproc-per-node auto``), or one per CPU when it has none.
    accelerator: "auto" (GPU if the cluster has GPUs, else NPU, else CPU),
        "gpu", "npu" or "cpu".
    resources_per_worker: extra or overriding Ray resources per worker, e.g.
        ``{"CPU": 4}``.
    placement_strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD.
    timeout: seconds for the call; on expiry WorkerGroupTimeout names the
        ranks that had not finished.
    startup_timeout: seconds to wait for a busy cluster to free resources; a
        request the cluster can never meet fails at once.
    max_restarts: rebuild the group and re-run ``fn`` this many times after a
        worker process dies (or after any failure with ``retry_on_exception``).
    address: Ray cluster to connect to when Ray is not initialised (else
        RAY_ADDRESS, else a local Ray is started).
    object_store_threshold: objects at least this big travel through Ray's
        object store in raydist's object collectives (None: never).

    Raises WorkerGroupError (rank, node, pid and traceback of each failure),
    WorkerGroupTimeout, or InfeasibleResourcesError; nothing is left running.
    """
    _check_num_workers(num_workers)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a non-negative int, got {max_restarts!r}")
    pickle_call(fn, args, kwargs or {})  # fail on unpicklable input before any actor starts
    attempts: List[WorkerGroupError] = []
    for attempt in range(max_restarts + 1):
        try:
            with WorkerGroup(
                num_workers,
                accelerator=accelerator,
                resources_per_worker=resources_per_worker,
                backend=backend,
                env=env,
                placement_strategy=placement_strategy,
                startup_timeout=startup_timeout,
                address=address,
                init_process_group=init_process_group,
                object_store_threshold=object_store_threshold,
                restart_count=attempt,
                max_restarts=max_restarts,
            ) as group:
                return group.run(fn, args, kwargs, timeout=timeout)
        except WorkerGroupError as error:
            retryable = error.crashed or retry_on_exception
            if not retryable or attempt == max_restarts:
                if attempts:
                    raise WorkerGroupError(error.failures, attempts=attempts) from error
                raise
            attempts.append(error)
    raise AssertionError("unreachable")
