"""The object collectives through each backend (torch.distributed, horovod) on
real worker groups: the same objects on every rank, small ones pickled through
the backend and large ones through Ray's object store, and gather and scatter
delivering each object only to the rank that keeps it."""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
from test_object_store import assert_same

import raydist
from raydist.core import collectives

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("ray_local")]

THRESHOLD = 4096  # objects from 4 KB on go through the object store
GATHER_DST = 1
SCATTER_SRC = 0


def _horovod_installed() -> bool:
    try:
        importlib.import_module("horovod.torch")
    except ImportError:
        return False
    return True


HOROVOD = pytest.param("horovod", marks=pytest.mark.skipif(not _horovod_installed(), reason="horovod is installed by `make test`"))

# In a worker process: the origin of every Witness unpickled there since the last clear().
ARRIVALS: List[int] = []


def _arrived(origin: int) -> "Witness":
    ARRIVALS.append(origin)
    return Witness(origin)


@dataclass(frozen=True)
class Witness:
    """Notes in the process that unpickles it that it arrived there; a rank's
    own object, which never travels, is never unpickled."""

    origin: int

    def __reduce__(self) -> Tuple[Any, Tuple[int]]:
        return _arrived, (self.origin,)


def rank_object(size: str, origin: int) -> Dict[str, Any]:
    data: Any = {"rank": origin, "squares": [i * i for i in range(origin + 2)]}
    if size == "large":
        data = np.arange(2048, dtype=np.float64) + origin  # 16 KB: by reference
    return {"from": Witness(origin), "data": data}


def collectives_with_arrivals() -> Dict[str, Dict[str, Any]]:
    """Every object collective, on small and on large objects, noting which
    objects each rank unpickled in gather and scatter."""
    info = raydist.get_context()
    transport = collectives._transport
    assert transport is not None  # raydist's worker installed the object-store path
    results: Dict[str, Dict[str, Any]] = {}
    for size in ("small", "large"):
        mine = rank_object(size, info.rank)
        out: Dict[str, Any] = {"by_reference": transport.wants(mine)}
        out["broadcast"] = raydist.broadcast_object(mine, src=info.world_size - 1)
        out["all_gather"] = raydist.all_gather_object(mine)
        ARRIVALS.clear()
        out["gather"] = raydist.gather_object(mine, dst=GATHER_DST)
        out["gather_arrivals"] = sorted(ARRIVALS)
        ARRIVALS.clear()
        objs = [rank_object(size, r) for r in range(info.world_size)] if info.rank == SCATTER_SRC else None
        out["scatter"] = raydist.scatter_object(objs, src=SCATTER_SRC)
        out["scatter_arrivals"] = sorted(ARRIVALS)
        out["still_owned"] = transport.owned_objects  # every stored object has been freed
        results[size] = out
    return results


@functools.lru_cache(maxsize=None)
def outcome(backend: Optional[str], world: int) -> Tuple[Dict[str, Dict[str, Any]], ...]:
    """One run per backend and world size, shared by the tests below."""
    return tuple(raydist.run(collectives_with_arrivals, num_workers=world, backend=backend, object_store_threshold=THRESHOLD))


@pytest.mark.parametrize("world", [3, pytest.param(2, marks=pytest.mark.soak)])
@pytest.mark.parametrize("backend", [None, HOROVOD], ids=["torch.distributed", "horovod"])
def test_object_collectives_are_right(backend: Optional[str], world: int) -> None:
    for rank, result in enumerate(outcome(backend, world)):
        for size in ("small", "large"):
            out = result[size]
            expected = [rank_object(size, r) for r in range(world)]
            assert out["by_reference"] is (size == "large")
            assert_same(out["broadcast"], expected[world - 1])
            assert_same(out["all_gather"], expected)
            if rank == GATHER_DST:
                assert_same(out["gather"], expected)
            else:
                assert out["gather"] is None
            assert_same(out["scatter"], expected[rank])
            assert out["still_owned"] == 0


@pytest.mark.parametrize("world", [3, pytest.param(2, marks=pytest.mark.soak)])
@pytest.mark.skipif(not _horovod_installed(), reason="horovod is installed by `make test`")
def test_horovod_gives_what_torch_distributed_gives(world: int) -> None:
    for through_horovod, through_torch in zip(outcome("horovod", world), outcome(None, world)):
        assert_same(through_horovod, through_torch)


@pytest.mark.parametrize("world", [3, pytest.param(2, marks=pytest.mark.soak)])
@pytest.mark.parametrize("backend", [None, HOROVOD], ids=["torch.distributed", "horovod"])
def test_gather_and_scatter_deliver_only_to_their_ranks(backend: Optional[str], world: int) -> None:
    # With the object-store path installed: gather must not turn into an
    # all-gather, nor scatter into a broadcast, for small or large objects.
    for rank, result in enumerate(outcome(backend, world)):
        for size in ("small", "large"):
            gathered_here = [r for r in range(world) if r != GATHER_DST] if rank == GATHER_DST else []
            assert result[size]["gather_arrivals"] == gathered_here, (size, rank)
            assert result[size]["scatter_arrivals"] == ([] if rank == SCATTER_SRC else [rank]), (size, rank)
