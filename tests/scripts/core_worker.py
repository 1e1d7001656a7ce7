"""One rank of the multi-process core test (launched by torchrun or a fake SLURM job).

It records what the launcher said, initialises raydist on CPU/gloo, runs every
object collective and writes ``<outdir>/rank<r>.json`` for the parent to check.
Expected values are derived from the rank and world size, so the parent can
check them against the layout it launched.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Dict

import torch.distributed as dist
from core_launch import write_result

import raydist
from raydist.core.environment import read_world_info


def _value_error(call: Any) -> str:
    """The ValueError message of ``call()``, or a marker when none was raised."""
    try:
        call()
    except ValueError as error:
        return str(error)
    return "no ValueError"


def main(outdir: Path) -> None:
    launcher = read_world_info()  # before init: what the launcher variables say
    info = raydist.init_distributed(device="cpu", timeout=60)
    rank, world = info.rank, info.world_size
    last = world - 1

    result: Dict[str, Any] = {
        "launcher": dataclasses.asdict(launcher),
        "record": dataclasses.asdict(info),
        "same_record_again": raydist.init_distributed() is info,
        "context_is_record": raydist.get_context() is info,
        "torch_rank": dist.get_rank(),
        "torch_world_size": dist.get_world_size(),
        "torch_backend": str(dist.get_backend()),
        "exported_env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")},
    }

    # Only the source's object may arrive: the others pass something different.
    sent = {"sender": rank, "squares": [i * i for i in range(world)], "nested": {"world": world}}
    result["broadcast_from_0"] = raydist.broadcast_object(sent if rank == 0 else {"wrong": rank}, src=0)
    result["broadcast_from_last"] = raydist.broadcast_object(sent if rank == last else None, src=last)
    result["all_gather"] = raydist.all_gather_object(rank)
    result["all_gather_dicts"] = raydist.all_gather_object({"rank": rank, "tag": f"r{rank}"})
    result["gather_to_last"] = raydist.gather_object(rank * 10, dst=last)
    result["gather_to_0"] = raydist.gather_object(f"from{rank}", dst=0)
    objs = [{"to": r, "payload": [r] * (r + 1)} for r in range(world)] if rank == 0 else None
    result["scatter_from_0"] = raydist.scatter_object(objs, src=0)
    raydist.barrier()

    # Out-of-world ranks are refused locally, before any communication.
    result["src_world_error"] = _value_error(lambda: raydist.broadcast_object("x", src=world))
    result["src_negative_error"] = _value_error(lambda: raydist.broadcast_object("x", src=-1))
    result["gather_dst_error"] = _value_error(lambda: raydist.gather_object("x", dst=world + 3))
    result["scatter_src_error"] = _value_error(lambda: raydist.scatter_object(["x"] * world, src=world))
    # After the refused calls the group must still work (nothing half-sent).
    result["all_gather_after_errors"] = raydist.all_gather_object(-rank)

    raydist.shutdown()
    result["initialized_after_shutdown"] = dist.is_initialized()
    result["context_after_shutdown"] = raydist.core.initialize._context is None
    write_result(outdir, rank, result)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
