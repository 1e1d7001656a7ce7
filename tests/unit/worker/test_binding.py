"""--numa-binding inside a worker: where the node gives nothing to bind by,
nothing is bound and one line says why; where there is a CPU set, every
thread of the process is bound to it (torch's rule: checked in a real
process by tests/live/test_numa_binding.py). No Ray."""

from __future__ import annotations

import os

import pytest

from raydist.pool.worker.binding import apply_numa_binding

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")


def test_a_cpu_worker_is_left_alone_with_one_line() -> None:
    before = os.sched_getaffinity(0)
    line = apply_numa_binding("node", "cpu", None)
    assert line == "raydist: --numa-binding node not applied on this node: this worker has no CUDA GPU (cpu workers): binding follows a GPU"
    assert os.sched_getaffinity(0) == before


def test_a_gpu_worker_without_a_visible_gpu_is_left_alone_with_one_line() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    line = apply_numa_binding("exclusive", "cuda", 0)
    assert line is not None and line.startswith("raydist: --numa-binding exclusive not applied on this node: ")
    assert "\n" not in line
