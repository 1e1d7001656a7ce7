"""Large objects through Ray's object store give the same results as pickling
through the process group, and leave nothing in the object store."""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest
import torch
from conftest import ray_address, use_local_ray

import raydist
from raydist.core import collectives
from raydist.pool.worker.object_store import estimated_nbytes

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("ray_local")]

THRESHOLD = 4096  # small, so that every payload below but None goes by reference
WORLD = 3


def payload(kind: str, rank: int) -> Any:
    big = np.arange(2048, dtype=np.float64) + rank  # 16 KB
    return {
        "dict": {"name": f"rank {rank}", "weights": big, "step": rank},
        "numpy": big,
        "tensor": torch.arange(4096, dtype=torch.float32) * (rank + 1),
        "nested": [{"a": big, "b": (torch.ones(2048) * rank, "text")}, [big, None]],
        "none": None,
    }[kind]


def run_collectives(kind: str) -> Dict[str, Any]:
    info = raydist.get_context()
    transport = collectives._transport
    results = {
        "broadcast": raydist.broadcast_object(payload(kind, info.rank), src=1),
        "all_gather": raydist.all_gather_object(payload(kind, info.rank)),
        "gather": raydist.gather_object(payload(kind, info.rank), dst=2),
        "scatter": raydist.scatter_object([payload(kind, r) for r in range(WORLD)] if info.rank == 0 else None, src=0),
    }
    # Every object this rank put in the store has been released.
    results["owned_after"] = transport.owned_objects if transport is not None else 0
    return results


def assert_same(left: Any, right: Any) -> None:
    if isinstance(left, np.ndarray):
        assert isinstance(right, np.ndarray) and np.array_equal(left, right)
    elif isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor) and torch.equal(left, right)
    elif isinstance(left, dict):
        assert isinstance(right, dict) and left.keys() == right.keys()
        for key in left:
            assert_same(left[key], right[key])
    elif isinstance(left, (list, tuple)):
        assert type(left) is type(right) and len(left) == len(right)
        for a, b in zip(left, right):
            assert_same(a, b)
    else:
        assert left == right


def worker_held_objects_at_least(nbytes: int) -> list:
    """Objects of that size still referenced by worker processes (the driver's
    own references, to the call's results, do not count)."""
    from ray.util.state import list_objects

    objects = list_objects(address=ray_address(), filters=[("type", "=", "WORKER")], limit=10_000)
    return [obj for obj in objects if (obj.object_size or 0) >= nbytes]


@pytest.fixture(scope="module")
def groups() -> Any:
    use_local_ray()
    half_cpu = {"CPU": 0.5}  # both groups side by side on the 4-CPU local Ray
    by_reference = raydist.WorkerGroup(WORLD, object_store_threshold=THRESHOLD, resources_per_worker=half_cpu)
    by_pickle = raydist.WorkerGroup(WORLD, object_store_threshold=None, resources_per_worker=half_cpu)
    yield by_reference, by_pickle
    by_reference.shutdown()
    by_pickle.shutdown()


@pytest.mark.parametrize("kind", ["dict", "tensor", *(pytest.param(k, marks=pytest.mark.soak) for k in ("numpy", "nested", "none"))])
def test_object_store_path_matches_pickling_path(groups: Any, kind: str) -> None:
    by_reference, by_pickle = groups
    stored: List[Dict[str, Any]] = by_reference.run(run_collectives, args=(kind,))
    pickled: List[Dict[str, Any]] = by_pickle.run(run_collectives, args=(kind,))
    for rank in range(WORLD):
        assert_same(stored[rank], pickled[rank])
        assert stored[rank]["owned_after"] == 0
    # And both are right, not just equal to each other.
    expected = [payload(kind, r) for r in range(WORLD)]
    assert_same(stored[0]["broadcast"], expected[1])
    assert_same(stored[2]["all_gather"], expected)
    assert_same(stored[2]["gather"], expected)
    assert stored[0]["gather"] is None and stored[1]["gather"] is None
    assert_same([s["scatter"] for s in stored], expected)
    # Nothing of the payload's size is still referenced in the object store.
    if kind != "none":
        assert worker_held_objects_at_least(THRESHOLD) == []


def uses_object_store() -> List[bool]:
    transport = collectives._transport
    assert transport is not None
    return [transport.wants(np.zeros(THRESHOLD // 8)), transport.wants({"small": 1})]


def test_threshold_decides_which_path(groups: Any) -> None:
    by_reference, _ = groups
    assert by_reference.run(uses_object_store) == [[True, False]] * WORLD
    assert estimated_nbytes({"a": [np.zeros(10), torch.zeros(10)], "b": b"xyz"}) == 80 + 40 + 3
