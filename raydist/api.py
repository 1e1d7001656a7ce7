"""``raydist.run``: one call on a fresh worker group, with restarts."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from raydist.config import RunConfig, make_config
from raydist.pool.cluster.ray_cluster import RayCluster
from raydist.pool.driver.calls import prepare_call
from raydist.pool.driver.controller import RunController, run_call
from raydist.pool.driver.datasets import check_datasets
from raydist.pool.driver.summary import RunResults
from raydist.pool.rules.datasets import DataConfig


def run(
    fn: Callable[..., Any],
    *,
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    config: Optional[RunConfig] = None,
    datasets: Optional[Mapping[str, Any]] = None,
    dataset_config: Optional[DataConfig] = None,
    **options: Any,
) -> RunResults:
    """Run ``fn(*args, **kwargs)`` on every worker; return the results by rank
    (a list, whose ``summary`` says where the run's time went: ``RunSummary``).

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

    ``datasets``: Ray Data datasets by name; each rank reads its part with
    ``raydist.get_dataset_shard(name)`` (``dataset_config``: which are split,
    row-equal or every row). Each attempt gets a split of its own world.

    Raises WorkerGroupError (rank, node, pid and traceback of each failure;
    earlier attempts listed; its ``summary`` the run's), WorkerGroupTimeout, WorkerStartupTimeout,
    InfeasibleResourcesError or ConnectionError; nothing is left running.
    """
    config = make_config(config, options)
    data = check_datasets(datasets, dataset_config)
    cluster = RayCluster()
    call = prepare_call(cluster, fn, args, kwargs)  # checked and pickled once, before Ray is touched; every attempt sends these bytes
    return run_call(RunController(cluster, config, fresh_restarts=True), call, data)
