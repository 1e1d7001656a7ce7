"""A rank's Ray Data shards: ``get_dataset_shard`` and ``split_dataset``.

The driver splits a call's ``datasets=`` for the call's world and queues
each rank's iterators on its actor before the call (``set_shards``); they
are gone when the call ends (``end_call``), so a later call, or the next
attempt after a restart, never reads an older world's split. Each shard
re-cuts Ray Data's batches to exact sizes (``rules.batches.rechunk``): over
a row-equal split every rank then runs the same number of steps.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from raydist.pool.rules.batches import rechunk
from raydist.pool.rules.datasets import no_cpu_ever_for_data
from raydist.pool.worker.metrics import data_waited

__all__ = ["DatasetShard", "end_call", "get_dataset_shard", "set_shards", "split_dataset", "timed"]

_shards: Dict[str, "DatasetShard"] = {}
_coordinators: List[Any] = []  # split coordinators this rank made in split_dataset during the call
_held_blocks: Optional[Any] = None  # positional.HeldBlocks: the exactly-once readers of split_dataset (made on first use)


class DatasetShard:
    """This rank's part of a dataset: Ray Data's ``DataIterator`` whose
    ``iter_batches`` / ``iter_torch_batches`` give batches of exactly
    ``batch_size`` rows (the last one shorter unless ``drop_last``). Other
    attributes (``iter_rows``, ``stats``, ...) are the iterator's own."""

    def __init__(self, iterator: Any, name: str = "", checked: bool = False):
        self.iterator = iterator
        self.name = name
        self.checked = checked  # whether Ray Data was seen to have room to run

    def __repr__(self) -> str:
        return f"DatasetShard({self.name!r})" if self.name else "DatasetShard()"

    def __getattr__(self, attribute: str) -> Any:
        if attribute == "iterator":  # not set yet (unpickling)
            raise AttributeError(attribute)
        return getattr(self.iterator, attribute)

    def iter_batches(self, *, batch_size: Optional[int] = 256, drop_last: bool = False, **options: Any) -> Iterator[Any]:
        """Ray's ``iter_batches`` (same options), in batches of exactly
        ``batch_size`` rows; ``batch_size=None`` gives Ray's blocks as they come."""
        if not self.checked:
            never = _why_data_can_never_run()
            if never is not None:
                raise RuntimeError(never)
            self.checked = True
        batches = self.iterator.iter_batches(batch_size=batch_size, drop_last=False if batch_size else drop_last, **options)
        return timed(batches if batch_size is None else rechunk(batches, batch_size, drop_last), self.name)

    def iter_torch_batches(
        self,
        *,
        batch_size: Optional[int] = 256,
        dtypes: Any = None,
        device: Union[str, Any] = "auto",
        collate_fn: Optional[Callable[[Dict[str, Any]], Any]] = None,
        drop_last: bool = False,
        **options: Any,
    ) -> Iterator[Any]:
        """Ray's ``iter_torch_batches``: exact-size numpy batches made tensors
        (``dtypes`` one dtype or one per column), or given to ``collate_fn``;
        ``device="auto"`` is this rank's device."""
        import torch

        target = _rank_device() if device == "auto" else torch.device(device)
        for batch in self.iter_batches(batch_size=batch_size, drop_last=drop_last, batch_format="numpy", **options):
            if collate_fn is not None:
                yield collate_fn(batch)
            elif isinstance(batch, dict):
                yield {key: _tensor(value, dtypes.get(key) if isinstance(dtypes, dict) else dtypes, target) for key, value in batch.items()}
            else:
                yield _tensor(batch, dtypes, target)


def timed(batches: Iterable[Any], name: str) -> Iterator[Any]:
    """``batches``, each wait for the next one recorded (the run's summary and timeline)."""
    iterator = iter(batches)
    while True:
        started = time.time()
        try:
            batch = next(iterator)
        except StopIteration:
            return
        finally:
            data_waited(started, time.time(), name)
        yield batch


def _rank_device() -> Any:
    import torch

    from raydist.core.initialize import get_context

    try:
        return torch.device(get_context().device)
    except RuntimeError:
        return torch.device("cpu")


def _tensor(array: Any, dtype: Any, device: Any) -> Any:
    import torch

    if not getattr(getattr(array, "flags", None), "writeable", True):
        array = array.copy()  # a read-only view of Arrow's buffers (exactly_once shards): torch needs its own

    return torch.as_tensor(array, dtype=dtype, device=device)


def set_shards(iterators: Mapping[str, Any]) -> None:
    """This call's iterators (or whole shards: ``PositionalShard``), by dataset name (sent by the driver before the call)."""
    _shards.clear()
    _shards.update({name: it if isinstance(it, DatasetShard) else DatasetShard(it, name) for name, it in iterators.items()})


def end_call(failed: bool = False) -> None:
    """The call ended (``failed``: it raised): forget its shards; stop the
    streaming splits it made itself; let its exactly-once readers go."""
    _shards.clear()
    if _held_blocks is not None:
        _held_blocks.end_call(failed)
    coordinators = list(_coordinators)
    _coordinators.clear()
    if coordinators:
        import ray

        for actor in coordinators:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass


def get_dataset_shard(name: str) -> DatasetShard:
    """This rank's shard of the dataset given as ``datasets={name: ...}`` to
    the running call (``raydist.run``, ``WorkerGroup.run`` / ``submit``)."""
    shard = _shards.get(name)
    if shard is None:
        given = ", ".join(map(repr, sorted(_shards))) or "none"
        raise KeyError(
            f"no dataset {name!r} was given to this call (given: {given}); pass datasets={{{name!r}: ds}} "
            "to raydist.run / WorkerGroup.run, or split a dataset inside the call with raydist.split_dataset"
        )
    return shard


def split_dataset(dataset: Any, *, equal: bool = True, exactly_once: bool = False, shuffle: bool = False, seed: int = 0) -> DatasetShard:
    """A collective: every rank calls it, and gets its part of rank 0's
    ``dataset`` (``streaming_split`` over the world, the ranks' nodes as
    locality hints). ``equal``: the same number of rows on every rank (so
    the same number of batches); ``False`` takes every row. The split is
    stopped when the call (or the script) ends.

    ``exactly_once`` (``shuffle``, ``seed``): as ``DataConfig``'s: the dataset
    is read into blocks first (by an actor rank 0 starts, which owns them until
    the call ends), and each rank reads its rows by position, resumable from
    ``load_state``. Every rank must pass the same options."""
    import ray
    import ray.cloudpickle

    from raydist.pool.rules.datasets import DataConfig

    config = DataConfig(equal=equal, exactly_once=exactly_once, shuffle=shuffle, seed=seed)  # checked alike on every rank
    if not ray.is_initialized():
        raise RuntimeError("raydist.split_dataset runs inside a raydist worker (raydist.run, WorkerGroup, raydist run)")
    rank, world_size, all_gather, scatter = _collectives()
    nodes = all_gather(ray.get_runtime_context().get_node_id())
    parts: Optional[List[Any]] = None
    if rank == 0:
        never = _why_data_can_never_run()
        try:
            if never is not None:
                parts = [("never", never)] * world_size
            elif config.exactly_once:
                holder = _holder(dataset, world_size)
                _held().started(holder)
                parts = [("ok", ray.cloudpickle.dumps(holder))] * world_size
            else:
                iterators = dataset.streaming_split(world_size, equal=equal, locality_hints=nodes)
                _coordinators.extend(_coordinator_of(iterators))
                parts = [("ok", ray.cloudpickle.dumps(iterator)) for iterator in iterators]
        except Exception as error:  # noqa: BLE001 - every rank must learn it, not wait in the scatter
            parts = [("error", f"{type(error).__name__}: {error}")] * world_size
    status, payload = scatter(parts)
    if status == "never":
        raise RuntimeError(payload)
    if status != "ok":
        raise RuntimeError(f"raydist.split_dataset: rank 0 could not split the dataset: {payload}")
    if not config.exactly_once:
        return DatasetShard(ray.cloudpickle.loads(payload), checked=True)
    from raydist.pool.worker.positional import PositionalShard

    holder = ray.cloudpickle.loads(payload)
    _held().reading(holder, rank)
    try:
        blocks = ray.get(holder.read.remote())
    except Exception as error:
        raise RuntimeError(f"raydist.split_dataset: the dataset could not be read: {error}") from error
    return PositionalShard(blocks, "", rank, world_size, config.shuffle, config.seed)


def _holder(dataset: Any, ranks: int) -> Any:
    """The actor that reads ``dataset`` and owns its blocks (outside the group's
    placement group: it takes no CPU, Ray Data's tasks take the cluster's)."""
    import ray

    from raydist.pool.worker.positional import BlockHolder

    actor = ray.remote(BlockHolder).options(num_cpus=0, scheduling_strategy="DEFAULT")
    return actor.remote(dataset, ranks)


def _held() -> Any:
    """This process's ``HeldBlocks`` (made on first use)."""
    global _held_blocks
    if _held_blocks is None:
        from raydist.pool.worker.positional import HeldBlocks

        _held_blocks = HeldBlocks()
    return _held_blocks


def _why_data_can_never_run() -> Optional[str]:
    """The error, naming the fix, where this group's workers hold every CPU
    of a cluster that cannot grow: Ray Data's tasks would wait for a CPU
    forever (and the first batch with them); None otherwise. The group's
    CPUs are its placement group's bundles; a cluster whose state cannot be
    read is let be."""
    import ray
    from ray.util.placement_group import get_current_placement_group, placement_group_table

    from raydist.pool import ray_private

    try:
        group = get_current_placement_group()
        bundles = list(placement_group_table(group).get("bundles", {}).values()) if group is not None else []
        held = sum(float(bundle.get("CPU", 0.0)) for bundle in bundles)
        total = float(ray.cluster_resources().get("CPU", 0.0))
    except Exception:  # noqa: BLE001 - only a check: reading goes on as Ray Data would
        return None
    message = no_cpu_ever_for_data(total, held) if bundles else None
    if message is None or ray_private.cluster_has_autoscaler():  # an autoscaler may add a node
        return None
    return f"raydist: {message}"


def _collectives() -> Tuple[int, int, Callable[[Any], List[Any]], Callable[[Optional[List[Any]]], Any]]:
    """Rank, world size, all-gather and scatter of objects: torch.distributed's
    where a process group is up (a torchrun script starts its own), else raydist's."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():

        def gather(obj: Any) -> List[Any]:
            out: List[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(out, obj)
            return out

        def scatter(objs: Optional[List[Any]]) -> Any:
            out: List[Any] = [None]
            dist.scatter_object_list(out, objs, src=0)
            return out[0]

        return dist.get_rank(), dist.get_world_size(), gather, scatter
    from raydist.core import collectives
    from raydist.core.initialize import get_context

    info = get_context()  # horovod, or a world of one
    return info.rank, info.world_size, collectives.all_gather_object, collectives.scatter_object


def _coordinator_of(iterators: List[Any]) -> List[Any]:
    """The split's coordinator actor (Ray Data has no public way to stop a split)."""
    actor = getattr(iterators[0], "_coord_actor", None) if iterators else None
    return [actor] if actor is not None else []
