"""A torchrun script that finishes its work in atexit handlers, as experiment
trackers and profilers do: one writes DIR/atexit-<rank>, one raises."""

import atexit
import os
import sys

import torch.distributed as dist

out_dir = sys.argv[1]
rank = os.environ["RANK"]


def flush_results() -> None:
    with open(os.path.join(out_dir, f"atexit-{rank}"), "w") as note:
        note.write("flushed")


def broken_logger() -> None:
    raise ValueError(f"logger of rank {rank} failed at exit")


atexit.register(flush_results)
atexit.register(broken_logger)
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
