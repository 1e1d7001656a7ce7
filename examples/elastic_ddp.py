"""An elastic DDP training script: checkpoints, resumes on any world size,
and saves before a preemption. A plain torchrun script (raydist is optional),
meant as a template:

    torchrun --standalone --nproc-per-node 2 examples/elastic_ddp.py --checkpoint-dir /tmp/ckpt
    raydist run --nnodes 1:3 -n 2 --max-restarts 3 examples/elastic_ddp.py --checkpoint-dir /shared/ckpt

What makes it elastic:

* Every --checkpoint-every steps rank 0 writes model + optimizer + step to
  --checkpoint-dir/checkpoint.pt, atomically (a temporary file, then
  os.replace), so a crash mid-write never leaves a broken checkpoint.
* At start every rank loads that checkpoint if there is one and continues
  from its step, whatever the world size is now: after a node is lost the
  launcher (raydist's elastic group, torchrun's elastic agent) starts the
  script again with fewer (or, after a restart to grow, more) ranks. Every
  rank must see the directory: on several machines, put it on shared
  storage.
* The data of a step does not depend on the world size: step s has one
  global batch (drawn from the seed and s), split across the ranks there are
  now, and the loss is scaled so that DDP's averaged gradient is the
  gradient of the whole global batch. A run that restarts on 4 ranks from a
  checkpoint written by 6 follows the same trajectory as one that never
  stopped, up to floating-point rounding.
* SIGTERM is a preemption warning (raydist sends it to the ranks on a node
  Ray starts draining; torchrun forwards its own SIGTERM to every rank).
  The handler only sets a flag; at the next step boundary the ranks agree
  (the flag travels in the one all-reduce each step makes anyway), rank 0
  saves a checkpoint, and every rank exits with status 143 (128 + SIGTERM),
  so the launcher restarts the run elsewhere. Under raydist,
  raydist.preemption_requested() says by when the node goes; the script
  also polls it, so it works with --preemption-signal none too.

Output: rank 0 prints one line every --checkpoint-every steps (step, world
size, loss) and a final line.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import signal
import sys
import tempfile
import time
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

try:  # optional: the script runs under plain torchrun without raydist
    from raydist import preemption_requested as _raydist_preemption
except ImportError:
    _raydist_preemption = None

PREEMPTED_EXIT_STATUS = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM
CHECKPOINT_NAME = "checkpoint.pt"
FEATURES = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint-dir", required=True, help="where rank 0 writes checkpoint.pt (every rank reads it)")
    parser.add_argument("--steps", type=int, default=200, help="total training steps (counted across restarts)")
    parser.add_argument("--checkpoint-every", type=int, default=20, metavar="N", help="checkpoint and print every N steps")
    parser.add_argument("--global-batch-size", type=int, default=96, help="samples per step, split across the ranks")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sleep this long in every step, to stand in for a heavier model (demos and tests)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="cpu (gloo), cuda (nccl, one GPU per process) or auto (cuda when available; the default)",
    )
    args = parser.parse_args()
    if args.steps < 1 or args.checkpoint_every < 1 or args.global_batch_size < 1:
        parser.error("--steps, --checkpoint-every and --global-batch-size must be >= 1")
    return args


# -- preemption -----------------------------------------------------------------


class PreemptionWatch:
    """SIGTERM (or a drain deadline raydist announced) asks for a checkpoint
    and a clean exit at the next step boundary. The handler only sets a
    flag: saving inside a signal handler could interrupt a collective."""

    def __init__(self) -> None:
        self.signalled = False
        self._previous: Any = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.signalled = True

    def requested(self) -> bool:
        return self.signalled or self.deadline() is not None

    @staticmethod
    def deadline() -> Optional[float]:
        """When this rank's node goes (time.time() seconds, inf: no deadline); None if raydist says nothing."""
        return _raydist_preemption() if _raydist_preemption is not None else None

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)


# -- checkpoints ------------------------------------------------------------------


def save_checkpoint(directory: str, state: Dict[str, Any]) -> str:
    """Write ``state`` to directory/checkpoint.pt atomically: a reader (or a
    restart after a crash mid-write) sees the old checkpoint or the new one,
    never half of one."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, CHECKPOINT_NAME)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{CHECKPOINT_NAME}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)  # atomic on POSIX (same directory, same filesystem)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def load_checkpoint(directory: str) -> Optional[Dict[str, Any]]:
    path = os.path.join(directory, CHECKPOINT_NAME)
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


# -- data -------------------------------------------------------------------------


def global_batch(step: int, size: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s whole batch: the same on every rank and for every world size."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, FEATURES, generator=generator)
    true_weights = torch.arange(FEATURES, dtype=torch.float32) / FEATURES
    y = torch.tanh(x @ true_weights / 2).unsqueeze(1) + 0.01 * torch.randn(size, 1, generator=generator)
    return x, y


def main() -> int:
    args = parse_args()
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    # The launcher's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT do the rest.
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # raydist names this rank's first GPU (several GPUs per worker); torchrun: the local rank.
    device_index = int(os.environ.get("RAYDIST_DEVICE_INDEX", os.environ.get("LOCAL_RANK", "0")))
    device = torch.device(f"cuda:{device_index}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    watch = PreemptionWatch()

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    start, last_loss = 0, math.nan
    checkpoint = load_checkpoint(args.checkpoint_dir)
    if checkpoint is not None:
        net.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start, last_loss = int(checkpoint["step"]), float(checkpoint["loss"])
    # Every rank must resume from the same step: a checkpoint directory that
    # only some ranks can see (not shared between machines) fails here.
    steps_seen = torch.tensor([start, -start], dtype=torch.int64, device=device)
    dist.all_reduce(steps_seen, op=dist.ReduceOp.MAX)
    if steps_seen[0].item() != -steps_seen[1].item():
        raise RuntimeError(
            f"ranks found different checkpoints in {args.checkpoint_dir!r} (steps {-steps_seen[1].item()} to "
            f"{steps_seen[0].item()}): put --checkpoint-dir on storage every rank sees"
        )
    if rank == 0:
        if checkpoint is None:
            print(f"starting at step 0, world size {world_size} (restart {restart})", flush=True)
        else:
            print(
                f"resumed from checkpoint at step {start} (written by world size {checkpoint['world_size']}), "
                f"world size {world_size} (restart {restart})",
                flush=True,
            )
    del checkpoint
    model = DistributedDataParallel(net, device_ids=[device_index] if use_cuda else None)

    step, status = start, 0
    while step < args.steps:
        x, y = global_batch(step, args.global_batch_size, args.seed)
        # This rank's share of the global batch (shares differ by at most one
        # sample when the size does not divide). A sum over the share, times
        # world_size / global batch: DDP divides the summed gradients by
        # world_size, leaving the gradient of the mean over the whole batch.
        x, y = x.tensor_split(world_size)[rank].to(device), y.tensor_split(world_size)[rank].to(device)
        local_sum = torch.nn.functional.mse_loss(model(x), y, reduction="sum")
        optimizer.zero_grad()
        (local_sum * world_size / args.global_batch_size).backward()
        optimizer.step()
        if args.step_delay > 0:
            time.sleep(args.step_delay)
        step += 1
        # One small all-reduce per step: the whole batch's loss, and whether
        # any rank was warned (raydist warns only the ranks on a draining node).
        stats = torch.stack([local_sum.detach(), torch.tensor(float(watch.requested()), device=device)])
        dist.all_reduce(stats)
        last_loss = stats[0].item() / args.global_batch_size
        stop = stats[1].item() > 0 and step < args.steps  # a warning at the last step: just finish
        if step % args.checkpoint_every == 0 or step == args.steps or stop:
            if rank == 0:
                save_checkpoint(
                    args.checkpoint_dir,
                    {
                        "model": net.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "step": step,
                        "loss": last_loss,
                        "world_size": world_size,
                        "global_batch_size": args.global_batch_size,
                    },
                )
                print(f"step {step} world {world_size} loss {last_loss:.6f} (checkpoint saved)", flush=True)
            if stop:
                # The earliest deadline any rank was given (raydist tells only the ranks on the draining node).
                deadline = watch.deadline()
                soonest = torch.tensor(math.inf if deadline is None else deadline, dtype=torch.float64, device=device)
                dist.all_reduce(soonest, op=dist.ReduceOp.MIN)  # also: nobody exits before rank 0's checkpoint is on disk
                if rank == 0:
                    when = "" if math.isinf(soonest.item()) else f" (node leaves in {soonest.item() - time.time():.0f} s)"
                    print(f"preemption warning{when}: checkpoint at step {step} saved, exiting", flush=True)
                status = PREEMPTED_EXIT_STATUS
                break
    if status == 0 and rank == 0:
        print(f"final: step {step} world {world_size} loss {last_loss:.6f}", flush=True)
    watch.restore()
    # Free DDP before leaving the process group: a DDP model still alive at
    # interpreter exit can make torch abort ("terminate called ...").
    del model, optimizer, net
    gc.collect()
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
