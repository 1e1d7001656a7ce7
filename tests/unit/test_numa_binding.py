"""--numa-binding inside a worker: where the node gives nothing to bind by,
nothing is bound and one line says why; where there is a CPU set, every
thread of the process is bound to it (torch's rule). No Ray."""

from __future__ import annotations

import os
import subprocess
import sys

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


BIND = """\
import os, threading
from raydist.pool.worker.binding import bind_threads
started, release = threading.Event(), threading.Event()
def wait():
    started.set()
    release.wait()
thread = threading.Thread(target=wait)
thread.start()
started.wait()
cpu = min(os.sched_getaffinity(0))
bind_threads({cpu})
print(os.sched_getaffinity(0) == {cpu}, os.sched_getaffinity(thread.native_id) == {cpu})
release.set()
"""


def test_binding_covers_every_thread_of_the_process() -> None:
    result = subprocess.run([sys.executable, "-c", BIND], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]
