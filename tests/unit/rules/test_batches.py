"""Exact batch sizes over uneven batches (``rules.batches``) and the dataset
options (``rules.datasets``): the pure parts of ``datasets=``."""

from __future__ import annotations

import random
from typing import List

import numpy as np
import pytest

from raydist.pool.rules.batches import batch_count, batch_rows, rechunk, row_drop_bound
from raydist.pool.rules.datasets import DataConfig, check_dataset_names, no_cpu_ever_for_data, no_cpus_for_data, split_names


def uneven(rows: int, rng: random.Random) -> List[dict]:
    """``rows`` ids in batches of random sizes, as Ray Data gives them after a shuffle buffer."""
    batches, start = [], 0
    while start < rows:
        size = min(rows - start, rng.randint(1, 40))
        batches.append({"id": np.arange(start, start + size), "x": np.zeros((size, 3))})
        start += size
    return batches


@pytest.mark.parametrize("seed", range(40))
def test_rechunk_gives_exact_sizes_whatever_came_in(seed: int) -> None:
    rng = random.Random(seed)
    rows, size, drop_last = rng.randint(0, 300), rng.randint(1, 64), rng.random() < 0.5
    out = list(rechunk(uneven(rows, rng), size, drop_last))
    sizes = [batch_rows(b) for b in out]
    assert len(out) == batch_count(rows, size, drop_last)  # depends on the row count alone
    assert all(s == size for s in sizes[:-1]) and (not sizes or sizes[-1] == size or not drop_last)
    ids = np.concatenate([b["id"] for b in out]) if out else np.array([], dtype=int)
    assert ids.tolist() == list(range(len(ids)))  # order kept, nothing repeated
    assert rows - len(ids) == (rows % size if drop_last else 0)
    assert all(b["x"].shape == (batch_rows(b), 3) for b in out)  # every column cut alike


def test_rechunk_passes_right_sized_batches_through_uncopied() -> None:
    batch = {"id": np.arange(8)}
    assert next(rechunk([batch], 8)) is batch


def test_rechunk_refuses_a_batch_size_below_one() -> None:
    with pytest.raises(ValueError, match="positive"):
        list(rechunk([], 0))


def test_the_documented_drop() -> None:
    assert row_drop_bound(3, 8, drop_last=False, equal=True) == 2
    assert row_drop_bound(3, 8, drop_last=True, equal=True) == 2 + 3 * 7
    assert row_drop_bound(3, 8, drop_last=False, equal=False) == 0


def test_which_datasets_are_split() -> None:
    assert split_names(["train", "eval"], DataConfig()) == ["train", "eval"]
    assert split_names(["train", "eval"], DataConfig(["train"])) == ["train"]
    with pytest.raises(ValueError, match="'test', not given"):
        check_dataset_names({"train": 1}, DataConfig(["test"]))
    with pytest.raises(TypeError, match="non-empty strings"):
        check_dataset_names({"": 1}, DataConfig())
    with pytest.raises(ValueError, match="'all' or a list"):
        DataConfig("train")
    with pytest.raises(TypeError, match="True or False"):
        DataConfig(equal=1)  # type: ignore[arg-type]


def test_an_exactly_once_config_refuses_what_cannot_apply_to_it() -> None:
    with pytest.raises(ValueError, match="equal=False does not apply"):
        DataConfig(exactly_once=True, equal=False)
    with pytest.raises(ValueError, match=r"ds.random_shuffle\(\)"):
        DataConfig(shuffle=True)
    with pytest.raises(TypeError, match="seed must be an int >= 0"):
        DataConfig(exactly_once=True, seed=-1)
    with pytest.raises(TypeError, match="exactly_once must be True or False"):
        DataConfig(exactly_once="yes")  # type: ignore[arg-type]
    assert DataConfig(exactly_once=True, shuffle=True, seed=3).seed == 3


def test_no_warning_while_a_cpu_is_free_for_ray_data() -> None:
    assert no_cpus_for_data(free_cpus=1.0, total_cpus=4.0, group_cpus=2.0, workers=2) is None
    assert no_cpus_for_data(free_cpus=2.0, total_cpus=4.0, group_cpus=2.0, workers=2) is None


def test_a_cluster_with_every_cpu_held_is_named_with_cause_and_fix() -> None:
    warning = no_cpus_for_data(free_cpus=0.0, total_cpus=4.0, group_cpus=3.0, workers=3)
    assert warning is not None
    assert "0 of the cluster's 4 CPUs are free" in warning
    assert "3 held by this group's 3 worker(s), 1 by others" in warning
    for fix in ("num_workers", "resources_per_worker", "a larger Ray"):
        assert fix in warning
    # Less than one CPU free: a Ray Data task (one CPU) still cannot start.
    assert no_cpus_for_data(free_cpus=0.5, total_cpus=2.0, group_cpus=1.5, workers=3) is not None


def test_reading_is_refused_only_where_no_cpu_can_ever_be_free_beside_the_workers() -> None:
    assert no_cpu_ever_for_data(total_cpus=3.0, group_cpus=2.0) is None  # a private Ray's extra CPU
    assert no_cpu_ever_for_data(total_cpus=4.0, group_cpus=2.5) is None
    error = no_cpu_ever_for_data(total_cpus=6.0, group_cpus=6.0)
    assert error is not None and "hold 6 of its 6 CPUs" in error and "none can ever be free" in error
    for fix in ("resources_per_worker={'CPU': 0.5}", "--resources-per-worker", "fewer workers", "a bigger cluster"):
        assert fix in error
    assert no_cpu_ever_for_data(total_cpus=4.0, group_cpus=3.5) is not None  # half a CPU runs no default task
