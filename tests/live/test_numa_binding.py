"""--numa-binding's thread binding in a real process: every thread,
including ones started before the binding, ends up on the CPU set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only"),
]


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
