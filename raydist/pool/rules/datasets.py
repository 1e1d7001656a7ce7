"""Which datasets of a call are split, and how (pure: no Ray)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["DataConfig", "check_dataset_names", "no_cpu_ever_for_data", "no_cpus_for_data", "split_names"]


@dataclass(frozen=True)
class DataConfig:
    """How ``datasets=`` reach the ranks (Ray Train's ``DataConfig``).

    ``datasets_to_split``: ``"all"`` or the names of the datasets split
    across the ranks (each rank reads its own part); the others go whole to
    every rank. ``equal``: every rank gets the same number of rows (up to
    ``world_size - 1`` rows of an epoch dropped), so that the equal-batch
    iterator gives every rank the same number of batches; ``False`` takes
    every row (evaluation), and ranks may then get different batch counts.

    ``exactly_once``: each split dataset is read into blocks once per call
    and each rank reads its rows by position, so its shard, given to
    ``save_state`` (shared) and ``load_state``, resumes an epoch where the
    last committed step left it, in a world of any size: the committed steps
    read every row of every epoch exactly once, none dropped to even the
    ranks. ``shuffle`` / ``seed`` then order each epoch (runs of rows
    shuffled, and the rows within them; the same seed, the same order).
    """

    datasets_to_split: Union[str, Tuple[str, ...]] = "all"
    equal: bool = True
    exactly_once: bool = False
    shuffle: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        names = self.datasets_to_split
        if isinstance(names, str):
            if names != "all":
                raise ValueError(f"datasets_to_split must be 'all' or a list of dataset names, got {names!r}")
        else:
            if not isinstance(names, (list, tuple, set, frozenset)) or not all(isinstance(n, str) for n in names):
                raise TypeError(f"datasets_to_split must be 'all' or a list of dataset names, got {names!r}")
            object.__setattr__(self, "datasets_to_split", tuple(names))
        for flag in ("equal", "exactly_once", "shuffle"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise TypeError(f"seed must be an int >= 0, got {self.seed!r}")
        if self.exactly_once and not self.equal:
            raise ValueError("exactly_once reads every row and gives every rank as many batches: equal=False does not apply")
        if (self.shuffle or self.seed) and not self.exactly_once:
            raise ValueError(
                "shuffle and seed order the epochs of an exactly_once dataset (DataConfig(exactly_once=True, shuffle=True)); "
                "otherwise shuffle the dataset itself (ds.random_shuffle(), or iter_batches(local_shuffle_buffer_size=...))"
            )


def check_dataset_names(datasets: Mapping[Any, Any], config: DataConfig) -> None:
    """Names are non-empty strings, and every name to split is given."""
    if not isinstance(datasets, Mapping):
        raise TypeError(f"datasets must be a dict of name -> ray.data.Dataset, got {type(datasets).__name__}")
    for name in datasets:
        if not isinstance(name, str) or not name:
            raise TypeError(f"dataset names must be non-empty strings, got {name!r}")
    if config.datasets_to_split != "all":
        missing = sorted(set(config.datasets_to_split) - set(datasets))
        if missing:
            raise ValueError(
                f"DataConfig.datasets_to_split names {', '.join(map(repr, missing))}, not given in datasets= "
                f"(given: {', '.join(map(repr, sorted(datasets))) or 'none'})"
            )


def split_names(names: Collection[str], config: DataConfig) -> List[str]:
    """The given datasets that are split, in the order given."""
    chosen: Sequence[str] = list(names) if config.datasets_to_split == "all" else config.datasets_to_split
    return [name for name in names if name in chosen]


def no_cpus_for_data(free_cpus: float, total_cpus: float, group_cpus: float, workers: int) -> Optional[str]:
    """The warning for ``datasets=`` on a cluster with no CPU slot left for
    Ray Data's tasks (they run beside the workers, never in their slots):
    its reads and transforms would wait for a CPU forever. None when one is free."""
    if free_cpus >= 1:
        return None
    others = max(0.0, total_cpus - group_cpus - free_cpus)
    return (
        f"raydist: datasets= needs free CPU slots beside the workers for Ray Data's tasks, but {free_cpus:g} of "
        f"the cluster's {total_cpus:g} CPUs are free ({group_cpus:g} held by this group's {workers} worker(s), "
        f"{others:g} by others): reading the datasets would wait forever. Leave CPUs free: fewer workers "
        f"(num_workers), fewer CPUs per worker (resources_per_worker={{'CPU': ...}}), or a larger Ray"
    )


def no_cpu_ever_for_data(total_cpus: float, group_cpus: float) -> Optional[str]:
    """The error for reading a split on a cluster (that cannot grow) whose
    CPUs this group's workers hold: Ray Data's read and transform tasks need
    a CPU each beside them, and none can ever be free while the workers run,
    so the first batch would never come. None when one CPU can be free."""
    if total_cpus - group_cpus >= 1:
        return None
    return (
        f"Ray Data cannot run its tasks on this cluster: they need a CPU each beside the workers, but this group's "
        f"workers hold {group_cpus:g} of its {total_cpus:g} CPUs, so none can ever be free while they run "
        "and the first batch would never come. Give each worker a fraction of a CPU (resources_per_worker={'CPU': 0.5}, "
        "raydist run --resources-per-worker '{\"CPU\": 0.5}'), run fewer workers, or use a bigger cluster (CPUs beyond the workers')"
    )
