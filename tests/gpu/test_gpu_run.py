"""``raydist.run`` on one GPU: one worker with the whole device (nccl, bound to
it at initialisation), and two workers of half the device each (gloo chosen,
since NCCL takes one rank per device; nccl asked for is refused before any
process group starts), with a DDP step on CUDA tensors."""

from __future__ import annotations

import pytest
import torch
from gpu_fns import ddp_step, where_am_i

import raydist

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("gpu_ray")]


def test_one_worker_gets_the_gpu_and_nccl_bound_to_it() -> None:
    [seen] = raydist.run(where_am_i, num_workers=1, resources_per_worker={"GPU": 1})
    assert seen["backend"] == "nccl" and seen["bound_device_id"] == "cuda:0"  # device_id given: initialised eagerly
    assert (seen["device"], seen["current_device"], seen["tensor_device"]) == ("cuda:0", 0, "cuda:0")
    assert seen["visible"] == ",".join(seen["ray_gpu_ids"]) and seen["ray_gpu_ids"], seen  # Ray's own GPU
    assert seen["sum"] == [1.0] * 4


def test_two_workers_sharing_the_gpu_run_a_ddp_step_over_gloo() -> None:
    results = raydist.run(ddp_step, num_workers=2, resources_per_worker={"GPU": 0.5})
    assert [r["rank"] for r in results] == [0, 1]
    for seen in results:
        assert seen["backend"] == "gloo", seen["backend"]  # chosen for ranks that share a device
        assert (seen["device"], seen["param_device"]) == ("cuda:0", "cuda:0")
        assert seen["visible"] == results[0]["visible"] and len(seen["visible"].split(",")) == 1
        torch.testing.assert_close(seen["weights"], seen["expected"])  # the gradients were averaged over both
    assert torch.equal(results[0]["weights"], results[1]["weights"])


def test_nccl_asked_for_on_a_shared_gpu_is_refused_before_it_starts() -> None:
    with pytest.raises(Exception, match=r"takes one rank per device, but ranks 0, 1 share GPU"):
        raydist.run(where_am_i, num_workers=2, resources_per_worker={"GPU": 0.5}, backend="nccl", max_restarts=0)
