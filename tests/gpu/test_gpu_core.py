"""The core on one GPU under ``torchrun --nproc-per-node 1``, no Ray: nccl
bound to the device (``device_id``), the object collectives over it, and the
seed's ``init_distributed_device(args)``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

pytestmark = pytest.mark.timeout(180)

SCRIPT = Path(__file__).resolve().parent / "gpu_core_script.py"


def torchrun(mode: str, tmp_path: Path) -> Dict[str, Any]:
    out = tmp_path / f"{mode}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(SCRIPT), mode, str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=150, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return dict(json.loads(out.read_text()))


def test_the_core_initialises_nccl_bound_to_the_gpu_and_moves_objects(tmp_path: Path) -> None:
    seen = torchrun("core", tmp_path)
    assert seen["backend"] == "nccl"
    assert (seen["device"], seen["device_index"], seen["current_device"]) == ("cuda:0", 0, 0)
    assert seen["bound_device_id"] == "cuda:0"  # init_process_group(device_id=...): the communicator starts eagerly
    assert seen["all_reduce"] == [0.0, 1.0, 2.0, 3.0]
    assert seen["broadcast_equal"] and seen["broadcast_device"] == "cuda:0"
    assert (seen["all_gather"], seen["gather"], seen["scatter"]) == ([0], [0], "only")
    assert seen["large_equal"]
    assert seen["seed_args"] == {"device": "cuda:0", "world_size": "1", "rank": "0", "distributed": "True"}


def test_the_seeds_init_distributed_device_takes_the_gpu(tmp_path: Path) -> None:
    seen = torchrun("seed", tmp_path)
    # One process (WORLD_SIZE=1): as in open_clip, no process group, the device kept as asked.
    assert seen["args"] == {"device": "cuda", "world_size": 1, "rank": 0, "local_rank": 0, "distributed": False}
    assert seen["device"] == "cuda" and seen["sum"] == 4.0 and not seen["initialized"]
