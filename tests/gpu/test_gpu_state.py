"""``save_state`` / ``load_state`` of a CUDA model and Adam: after a rank
crashes and a spare takes its place (three quarter-GPU workers on the one
GPU), the run ends with the weights and moments of the run without a
failure, bit for bit, and the state is back on the GPU."""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch
from gpu_fns import train

import raydist

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("gpu_ray")]

STEPS, CRASH_AT = 8, 5
# cuBLAS picks the same kernels every run only with a fixed workspace.
OPTIONS: Dict[str, Any] = dict(num_workers=2, resources_per_worker={"GPU": 0.25}, env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})


def test_a_crashed_rank_resumes_the_cuda_state_bit_identical() -> None:
    reference = raydist.run(train, args=(STEPS,), **OPTIONS)
    assert [r["resumed"] for r in reference] == [None, None]
    results = raydist.run(train, args=(STEPS, CRASH_AT, 1), spare_workers=1, max_restarts=1, **OPTIONS)
    assert [r["attempt"] for r in results] == [1, 1]
    # The crash comes at the start of step 5, once step 4 is committed (``raydist.wait_committed``).
    assert [r["resumed"] for r in results] == [CRASH_AT - 1] * 2
    for mine, theirs in zip(results, reference):
        assert mine["backend"] == "gloo" and mine["device"] == "cuda:0" and mine["state_devices"] == ["cuda:0"]
        assert torch.equal(mine["weights"], theirs["weights"]), f"rank {mine['rank']}"
        assert all(torch.equal(a, b) for a, b in zip(mine["moments"], theirs["moments"])), f"rank {mine['rank']}"
