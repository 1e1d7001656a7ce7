"""One rank of the compat test: open_clip's calling convention, unchanged.

The script parses its arguments as open_clip's main does and calls the
seed-compatible helpers on the ``argparse.Namespace``; it writes
``<outdir>/rank<r>.json`` for the parent to check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict

import torch
from core_launch import write_result

from raydist import compat as distributed


def build_parser() -> argparse.ArgumentParser:
    """The distributed options of open_clip's parser (same names and defaults)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", type=str)
    parser.add_argument("--dist-url", default=None, type=str)
    parser.add_argument("--dist-backend", default=None, type=str)
    parser.add_argument("--horovod", default=False, action="store_true")
    parser.add_argument("--no-set-device-rank", default=False, action="store_true")
    return parser


# What a CPU run of open_clip passes on its command line.
CLI_ARGS = ["--device", "cpu", "--dist-url", "env://"]


def main(outdir: Path) -> None:
    args = build_parser().parse_args(CLI_ARGS)
    # The parser defines no rank/world_size/local_rank/distributed: the helper adds them.
    device = distributed.init_distributed_device(args)

    result: Dict[str, Any] = {
        "returned_device": str(device),
        "returned_is_torch_device": isinstance(device, torch.device),
        "args": {k: getattr(args, k) for k in ("device", "rank", "world_size", "local_rank", "distributed")},
        "is_master": distributed.is_master(args),
        "is_local_master": distributed.is_master(args, local=True),
        "is_global_master": distributed.is_global_master(args),
        "is_using_distributed": distributed.is_using_distributed(),
        "world_info_from_env": list(distributed.world_info_from_env()),
        "backend": str(torch.distributed.get_backend()),
    }
    sent = {"epoch": 3, "from_master": True, "world": args.world_size}
    result["broadcast"] = distributed.broadcast_object(args, sent if distributed.is_master(args) else None)
    result["all_gather"] = distributed.all_gather_object(args, {"rank": args.rank})
    result["all_gather_dst_ignored"] = distributed.all_gather_object(args, args.rank, dst=1)

    import raydist  # teardown is raydist's addition; the seed never destroyed its group

    raydist.shutdown()
    write_result(outdir, args.rank, result)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
