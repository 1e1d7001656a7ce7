"""The fake cluster's processes: what the engine's tests and the scale
simulation rely on of them, counted rather than timed."""

from __future__ import annotations

import pickle
from typing import Any, Callable

from raydist.testing.processes import FakeProcesses


def ended(n: int) -> Callable[[], None]:
    processes = FakeProcesses(pickle.loads)
    for slot in range(n):
        processes.start_worker(f"node-{slot // 8}", 0, slot)
    return lambda: processes.end_all("killed by raydist", exit_code=-9)


def test_ending_every_worker_takes_work_linear_in_the_workers(count_calls: Callable[[Callable[[], Any]], int]) -> None:
    # Each end looked at every worker's flight recorder (gloo fails a collective's waiting peers):
    # a shutdown of 4,096 workers took 6.8 s, past the fake's limit for one step under tracemalloc.
    small, large = count_calls(ended(100)), count_calls(ended(400))
    assert large <= 4.5 * small


def test_a_worker_waiting_in_a_collective_fails_once_a_peer_ends() -> None:
    processes = FakeProcesses(pickle.loads)
    waiting, peer = processes.start_worker("a", 0, 0), processes.start_worker("b", 0, 1)
    processes.wait_in_collective(waiting, 3, entered=True, now=1.0)
    call = processes.call(waiting, "execute", (b"",))
    call.state = "hung"
    processes.end(peer, "killed by raydist", -9)
    assert call.ended and all(entry.completed for entry in waiting.recorder)
    assert "all_reduce #3: Connection closed by peer" in call.value.traceback
