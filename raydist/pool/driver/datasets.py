"""A call's Ray Data datasets, split for the attempt that runs it.

A split belongs to one call and one attempt: made when the call is sent (one
``streaming_split`` per split dataset, the ranks' nodes as locality
hints), released when the call ends; an attempt's open splits are attached
to it (``OpenSplits``) and stop with it (a warm restart, a shutdown). Releasing
stops the split's coordinator actor, which owns the blocks it streams:
ranks still waiting in its epoch barrier fail at once instead of waiting
for a reader that died, and no block stays pinned. A retried call (after a
restart, warm or fresh) gets a fresh split of its new attempt.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from raydist.pool.cluster.seam import Cluster
from raydist.pool.driver.attempt import Attempt
from raydist.pool.records import WorkerInfo
from raydist.pool.rules.datasets import DataConfig, check_dataset_names, no_cpus_for_data, split_names

__all__ = ["DATASETS", "CallData", "OpenSplits", "WorldSplit", "check_datasets", "warn_without_cpus"]

logger = logging.getLogger("raydist")

DATASETS = "datasets"  # the name an attempt's open splits are attached under

MISSING_RAY_DATA = "datasets= needs Ray Data, which is not installed: pip install 'raydist[data]' (or 'ray[data]')"


@dataclass(frozen=True)
class CallData:
    """A call's datasets, checked, and how they are split."""

    datasets: Mapping[str, Any]
    config: DataConfig = field(default_factory=DataConfig)
    blocks: "ReadBlocks" = field(default_factory=lambda: ReadBlocks())

    def streams(self) -> bool:
        """Whether some dataset is read as the ranks go (Ray Data's tasks then run beside them)."""
        return not self.config.exactly_once or len(split_names(list(self.datasets), self.config)) < len(self.datasets)

    def read(self) -> None:
        """Read each ``exactly_once`` dataset into blocks, once (in the caller's
        thread as the call is sent: the run's loop never waits for Ray Data)."""
        if self.config.exactly_once:
            for name in split_names(list(self.datasets), self.config):
                self.blocks.of(name, self.datasets[name])


class ReadBlocks:
    """Each ``exactly_once`` dataset read into blocks once for its call (every
    attempt reads the same blocks, so a position means the same rows): Arrow
    tables in Ray's object store, held by the driver, with their row counts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: Dict[str, List[Tuple[Any, int, int]]] = {}

    def of(self, name: str, dataset: Any) -> List[Tuple[Any, int, int]]:
        with self._lock:
            if name not in self._read:
                from raydist.pool.worker.positional import read_blocks

                self._read[name] = read_blocks(dataset)
            return self._read[name]


def check_datasets(datasets: Optional[Mapping[str, Any]] = None, dataset_config: Optional[DataConfig] = None) -> Optional[CallData]:
    """``datasets=`` and ``dataset_config=`` checked before anything starts; None without datasets."""
    config = dataset_config
    if config is not None and not isinstance(config, DataConfig):
        raise TypeError(f"dataset_config must be a raydist.DataConfig, got {type(config).__name__}")
    if not datasets:
        if datasets is not None and not isinstance(datasets, Mapping):
            raise TypeError(f"datasets must be a dict of name -> ray.data.Dataset, got {type(datasets).__name__}")
        return None
    config = config or DataConfig()
    check_dataset_names(datasets, config)
    try:
        from ray.data import Dataset  # the one part of Ray this module knows: the user's datasets are Ray Data's
    except ImportError as error:
        raise ImportError(MISSING_RAY_DATA) from error
    for name, dataset in datasets.items():
        if not isinstance(dataset, Dataset):
            raise TypeError(f"datasets[{name!r}] must be a ray.data.Dataset, got {type(dataset).__name__}")
    return CallData(dict(datasets), config)


class WorldSplit:
    """One call's datasets for one attempt: each rank's iterators by name."""

    def __init__(self, per_rank: List[Dict[str, Any]], coordinators: List[Any], owner: "OpenSplits"):
        self.per_rank = per_rank
        self._coordinators = coordinators
        self._owner = owner

    def send(self, actors: Sequence[Any]) -> None:
        """Queue each rank's iterators before its call (a worker runs calls in order)."""
        for actor, iterators in zip(actors, self.per_rank):
            self._owner.cluster.call(actor, "set_dataset_shards", iterators)

    def stop(self) -> None:
        """Stop the split's coordinators (once); the iterators fail from then on."""
        coordinators, self._coordinators = self._coordinators, []
        self.per_rank = []
        self._owner.forget(self)
        cluster = self._owner.cluster
        if cluster.session() != self._owner.session:
            return  # its cluster is gone, and the coordinators with it (a kill now would start a new one)
        for actor in coordinators:
            cluster.kill(actor)


class OpenSplits:
    """An attempt's splits not yet released (all stopped when the attempt ends)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._lock = threading.Lock()
        self._open: List[WorldSplit] = []
        self.session = cluster.session()

    def open(self, data: Optional[CallData], workers: Sequence[WorkerInfo], actors: Sequence[Any]) -> Optional[WorldSplit]:
        """Split ``data`` for the world ``workers`` (ordered by rank) and queue
        each rank's part on its actor; None without data."""
        if data is None:
            return None
        hints = [worker.node_id for worker in workers]
        per_rank: List[Dict[str, Any]] = [{} for _ in workers]
        coordinators: List[Any] = []
        split = set(split_names(list(data.datasets), data.config))
        try:
            for name, dataset in data.datasets.items():
                if name in split and data.config.exactly_once:
                    iterators = positional_shards(name, data.blocks.of(name, dataset), len(workers), data.config)
                elif name in split:
                    iterators = dataset.streaming_split(len(workers), equal=data.config.equal, locality_hints=hints)
                    coordinators.extend(_coordinator_of(iterators))
                else:
                    iterators = [dataset.iterator()] * len(workers)
                for rank, iterator in enumerate(iterators):
                    per_rank[rank][name] = iterator
        except BaseException:
            WorldSplit([], coordinators, self).stop()
            raise
        attempt = WorldSplit(per_rank, coordinators, self)
        with self._lock:
            self._open.append(attempt)
        attempt.send(actors)
        return attempt

    def forget(self, attempt: WorldSplit) -> None:
        with self._lock:
            if attempt in self._open:
                self._open.remove(attempt)

    def stop(self) -> None:
        with self._lock:
            worlds = list(self._open)
        for attempt in worlds:
            attempt.stop()


def warn_without_cpus(cluster: Cluster, held: Mapping[str, Mapping[str, float]], workers: int) -> None:
    """Log why reading would hang when no CPU is left for Ray Data's tasks."""
    try:
        free = sum(amounts.get("CPU", 0.0) for amounts in cluster.free_resources().values())
        total = sum(node.resources.get("CPU", 0.0) for node in cluster.alive_nodes())
    except Exception:  # noqa: BLE001 - only a warning: never fail a call over it
        return
    warning = no_cpus_for_data(free, total, sum(amounts.get("CPU", 0.0) for amounts in held.values()), workers)
    if warning is not None:
        logger.warning(warning)


def positional_shards(name: str, blocks: List[Tuple[Any, int, int]], world_size: int, config: DataConfig) -> List[Any]:
    """Each rank's shard of an ``exactly_once`` dataset, read from position 0 (``load_state`` moves it)."""
    from raydist.pool.worker.positional import PositionalShard

    return [PositionalShard(blocks, name, rank, world_size, config.shuffle, config.seed) for rank in range(world_size)]


def _coordinator_of(iterators: Sequence[Any]) -> List[Any]:
    """The split's ``SplitCoordinator`` actor: Ray Data has no public call to
    stop a split (its coordinator otherwise lives as long as the driver)."""
    actor = getattr(iterators[0], "_coord_actor", None) if iterators else None
    return [actor] if actor is not None else []


def split_for_world(
    cluster: Cluster,
    attempt: Optional[Attempt],
    data: Optional[CallData],
    held: Callable[[], Mapping[str, Any]],
    attach: Callable[[str, OpenSplits], None],
) -> Optional[WorldSplit]:
    """On the run's loop, as the call is sent: ``data`` split for ``attempt``, kept with
    that attempt (its open splits stop when it ends); None without data."""
    if data is None or attempt is None:
        return None
    splits = attempt.attached(DATASETS)
    if not isinstance(splits, OpenSplits):
        if data.streams():  # an exactly_once dataset was read as the call was sent
            warn_without_cpus(cluster, held(), attempt.size)  # once per attempt
        splits = OpenSplits(cluster)
        attach(DATASETS, splits)
    return splits.open(data, attempt.workers, attempt.actors)
