"""The GPU tier (``make test-gpu``): what only a CUDA device can show, on one
GPU. Every test here is skipped, with the reason, where torch sees no CUDA
device; ``make test`` never collects this folder.

``gpu_ray``: a local Ray for the tier with the machine's GPUs and token auth
on, with a token of its own (as the live tier's heads have). The tier needs
pytest and pytest-timeout only, none of the live tier's other plugins.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Iterator, List

import pytest
import torch

GPU_DIR = Path(__file__).resolve().parent
# Ray workers import the functions they run from this folder's modules.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(GPU_DIR), os.environ.get("PYTHONPATH")]))
sys.path[:0] = [str(GPU_DIR)]
# Ray reads its auth mode when it is imported: set before any test module imports it.
os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
os.environ.pop("RAY_AUTH_TOKEN_PATH", None)

NO_CUDA = "no CUDA device: torch.cuda.is_available() is False (this tier needs an NVIDIA GPU: make test-gpu there)"
RAY_CPUS = 8


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_CUDA)
    for item in items:
        if GPU_DIR in Path(str(item.path)).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_ray() -> Iterator[None]:
    """A local Ray with the machine's GPUs and token auth, for the whole tier."""
    import ray

    if not ray.is_initialized():
        cpus = min(RAY_CPUS, os.cpu_count() or 1)
        ray.init(address="local", num_cpus=cpus, num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=True)
    yield
    ray.shutdown()
