"""Calls from many threads on one WorkerGroup run in one order on every rank,
so their collectives never pair across calls."""

from __future__ import annotations

import threading
from typing import List, Tuple

import pytest
import torch
import torch.distributed as dist

import raydist

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("ray_local")]

THREADS = 8
CALLS_PER_THREAD = 25
WORLD = 2


def tagged_sum(tag: int, size: int) -> Tuple[int, float, int]:
    # Sizes differ between calls: a call paired with another would fail or sum wrongly.
    values = torch.full((size,), float(tag * 1000 + dist.get_rank()))
    dist.all_reduce(values)
    assert bool((values == values[0]).all())
    return tag, values[0].item(), values.numel()


@pytest.mark.soak  # make test: test_submitted_futures_from_threads_resolve_in_any_order; every interleaving on the fake: tests/unit/driver/test_engine_calls_in_flight.py
def test_eight_threads_of_collective_calls_all_right() -> None:
    errors: List[BaseException] = []
    wrong: List[str] = []

    def caller(thread: int, group: raydist.WorkerGroup) -> None:
        try:
            for call in range(CALLS_PER_THREAD):
                tag = thread * CALLS_PER_THREAD + call
                size = 1 + (tag % 7) * 5
                expected = (tag, float(WORLD * tag * 1000 + sum(range(WORLD))), size)
                results = group.run(tagged_sum, args=(tag, size), timeout=60)
                if results != [expected] * WORLD:
                    wrong.append(f"call {tag}: {results} != {expected}")
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    with raydist.WorkerGroup(WORLD, resources_per_worker={"CPU": 0.5}) as group:
        threads = [threading.Thread(target=caller, args=(t, group)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=200)
        assert not any(t.is_alive() for t in threads), "a caller thread hung"
    assert errors == []
    assert wrong == []


def test_submitted_futures_from_threads_resolve_in_any_order() -> None:
    with raydist.WorkerGroup(WORLD, resources_per_worker={"CPU": 0.5}) as group:
        futures = []
        lock = threading.Lock()

        def submit(tag: int) -> None:
            future = group.submit(tagged_sum, args=(tag, 3 + tag))
            with lock:
                futures.append((tag, future))

        threads = [threading.Thread(target=submit, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        for tag, future in sorted(futures, key=lambda item: -item[0]):  # collect in reverse
            assert future.result(timeout=60) == [(tag, float(WORLD * tag * 1000 + 1), 3 + tag)] * WORLD
