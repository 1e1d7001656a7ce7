"""WorkerGroup: a pool of workers, one per rank, with a live process group.

A facade over a ``RunController`` (``raydist.pool.driver.controller``) that
may restart in place but never starts a new attempt itself: its threads'
calls, futures, phase and workers. Every call is sent by the run's one
control loop, so calls from several threads run in the same order on every
rank and their collectives cannot pair across calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence

from raydist.config import RunConfig, make_config
from raydist.pool.cluster.seam import Cluster
from raydist.pool.driver.attempt import Attachment
from raydist.pool.driver.calls import WorkerFuture, prepare_call
from raydist.pool.driver.controller import RunController
from raydist.pool.driver.datasets import CallData, check_datasets
from raydist.pool.driver.summary import RunSummary
from raydist.pool.records import GroupPhase, Placement, WorkerInfo
from raydist.pool.rules.datasets import DataConfig
from raydist.pool.rules.stragglers import Straggler

if TYPE_CHECKING:  # the driver never needs torch: a run's start-up stays light
    from raydist.core.initialize import DistInfo

__all__ = ["WorkerFuture", "WorkerGroup", "WorkerInfo"]


class WorkerGroup:
    """A pool of workers, one per rank, kept alive across calls.

    ``WorkerGroup(4, backend="gloo")`` or ``WorkerGroup(config=RunConfig(...))``:
    the keyword options are ``raydist.RunConfig``'s fields; ``cluster``: where the
    workers run (default: Ray). Use as a context manager; ``run`` and ``submit``
    execute a function on every rank with torch.distributed initialised, from any
    number of threads. A failure a warm restart answers still raises (its
    ``restarted_in_place`` True), with the dead ranks already replaced in place."""

    def __init__(
        self, num_workers: Optional[int] = None, *, config: Optional[RunConfig] = None, cluster: Optional[Cluster] = None, **options: Any
    ):
        if num_workers is not None:
            options["num_workers"] = num_workers
        checked = make_config(config, options)
        if checked.run_ahead:
            raise ValueError(
                "run_ahead is for raydist.run and raydist run, whose call is sent again after a restart; "
                "a WorkerGroup's next call is the caller's to send"
            )
        self._run = RunController(cluster or _ray_cluster(), checked, fresh_restarts=False)

    # -- what the group is -------------------------------------------------

    @property
    def config(self) -> RunConfig:
        return self._run.config

    @property
    def workers(self) -> List[WorkerInfo]:
        """Each rank's placement: rank, local rank, node rank, node id/IP, pid, devices."""
        attempt = self._run.attempt
        return list(attempt.workers) if attempt else []

    @property
    def contexts(self) -> List[Optional["DistInfo"]]:
        """Each rank's initialization record (None where the process group was left to the code)."""
        attempt = self._run.attempt
        return list(attempt.contexts) if attempt else []

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def phase(self) -> GroupPhase:
        return self._run.life.phase

    @property
    def closed(self) -> bool:
        return self._run.life.closing

    @property
    def restart_count(self) -> int:
        """The attempt the group runs (TORCHELASTIC_RESTART_COUNT); a warm restart raises it."""
        return self._run.attempts.number

    @property
    def restarts_used(self) -> int:
        """Restarts of this group counted against max_restarts, warm ones included."""
        return self._run.attempts.restarts_used

    @property
    def spares(self) -> List[Placement]:
        """Where each ready spare worker runs (node, pid, devices); not in the world."""
        holdings = self._run.holdings
        return [spare.placement for spare in holdings.spares.ready] if holdings else []

    @property
    def held_resources(self) -> Dict[str, Dict[str, float]]:
        """What the group's workers and spares hold on each node (node id -> amounts)."""
        return dict(self._run.held_resources())

    @property
    def node_order(self) -> List[str]:
        """The group's node ids in node-rank order."""
        return list(dict.fromkeys(worker.node_id for worker in self.workers))

    @property
    def drained_nodes(self) -> Dict[str, float]:
        """Nodes of this group that Ray started draining, with their deadlines."""
        attempt = self._run.attempt
        return dict(attempt.drained) if attempt else {}

    # -- calls -------------------------------------------------------------

    def submit(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None,
        datasets: Optional[Mapping[str, Any]] = None,
        dataset_config: Optional[DataConfig] = None,
    ) -> WorkerFuture:
        """Start ``fn(*args, **kwargs)`` on every rank; returns at once. ``datasets``, ``dataset_config``: as in ``raydist.run``."""
        return self.submit_prepared(prepare_call(self._run.cluster, fn, args, kwargs), check_datasets(datasets, dataset_config))

    def submit_prepared(self, call: bytes, data: Optional[CallData] = None) -> WorkerFuture:
        """Start a call made by ``prepare_call`` on every rank (``data``: its datasets, split for this world)."""
        return self._run.send(call, data)

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        datasets: Optional[Mapping[str, Any]] = None,
        dataset_config: Optional[DataConfig] = None,
    ) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank; the values by rank. ``timeout``: the group's ``timeout`` option."""
        return self.submit(fn, args, kwargs, datasets, dataset_config).result(timeout)

    def stacks(self) -> str:
        """Where every rank is now: Python stacks grouped by location, the odd
        ones out marked, and where each rank is in its collectives (from the
        flight recorders: which rank did not enter the collective the others
        wait in, or entered another). The group keeps running."""
        self._run.check_usable()
        attempt = self._run.attempt
        assert attempt is not None
        return attempt.where_ranks_are()

    def stragglers(self, refresh: bool = False) -> List[Straggler]:
        """The ranks that reach collectives consistently later than the others
        (over the last collectives the flight recorders hold), as of the last
        look (every 0.5 s; ``refresh``: look now); [] on an even run or with
        ``flight_recorder=False``."""
        if refresh:
            self._run.check_usable()
        attempt = self._run.attempt
        return attempt.stragglers(refresh) if attempt else []

    def summary(self) -> RunSummary:
        """Where the group's time went so far: each attempt's world and how it
        ended, each rank's start, init and call times and its waits (in
        collectives, for data, for state), the slowest rank. ``str()`` of it is the table."""
        return self._run.summary

    def attach(self, name: str, thing: Attachment) -> None:
        """Keep ``thing`` with the group's current world: stopped when that world
        ends (the next warm restart, or the shutdown), as its watchers are."""
        self._run.attach(name, thing)

    # -- teardown ----------------------------------------------------------

    def shutdown(self, graceful: bool = True) -> None:
        """Leave the process group (if ``graceful``), kill the actors, free the placement group.

        Returns when the actors are dead. Safe to call more than once and
        from any thread; a call after an interrupted one finishes its work.
        Never starts a Ray (after ``ray.shutdown()`` the workers are gone with it).
        """
        self._run.shutdown(graceful)

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown(graceful=exc_info[0] is None)

    def __del__(self) -> None:  # a group dropped without shutdown() is freed when collected
        if getattr(self, "_run", None) is not None and not self.closed:
            try:
                self.shutdown(graceful=False)
            except Exception:  # noqa: BLE001 - best effort at interpreter or collection time
                pass


def _ray_cluster() -> Cluster:
    """The Ray this process connects to (imported here: the engine itself imports without Ray)."""
    from raydist.pool.cluster.ray_cluster import RayCluster

    return RayCluster()
