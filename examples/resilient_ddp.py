"""DDP training that survives a failure with nothing lost: state saved every
step with ``raydist.save_state``, loaded after a restart with ``load_state``.

    raydist run -n 4 --max-restarts 1 examples/resilient_ddp.py --crash-at 30
    python examples/resilient_ddp.py --workers 4 --crash-at 30      # through raydist.run
    RAYDIST_STATE_DIR=/tmp/state torchrun --nproc-per-node 4 --max-restarts 1 examples/resilient_ddp.py --crash-at 30

On the first attempt rank 1 is killed at step ``--crash-at``; the next attempt
resumes from the last committed step and prints it (the steps after it are
redone: the step cut short, when steps take longer than a commit).
Under raydist the copies live in other processes' memory (on two nodes when
there are two); under plain torchrun in ``RAYDIST_STATE_DIR``.
"""

from __future__ import annotations

import argparse
import os
from typing import Dict, Optional

import torch
import torch.distributed as dist

import raydist


def train(steps: int, crash_at: Optional[int]) -> Dict[str, float]:
    if not dist.is_initialized():
        init_process_group()
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    # Same on every rank under DDP: kept once per node, loadable into any world size.
    resumed = raydist.load_state(model=model, optimizer=optimizer)
    if rank == 0:
        print(f"attempt {attempt}: " + ("starting at step 0" if resumed is None else f"resumed after step {resumed}"), flush=True)
    loss = torch.zeros(())
    for step in range(0 if resumed is None else resumed + 1, steps):
        if attempt == 0 and step == crash_at:
            raydist.wait_committed()  # these steps are quicker than a commit: the crash comes after one
            if rank == 1:
                os._exit(1)  # a crash: the process is gone, and its memory with it
        generator = torch.Generator().manual_seed(step * 1000 + rank)  # the data position is the step
        x, y = torch.randn(64, 32, generator=generator), torch.randn(64, 1, generator=generator)
        optimizer.zero_grad()
        loss = ((ddp(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        raydist.save_state(step, shared=["model", "optimizer"], model=model, optimizer=optimizer)
    return {"rank": rank, "loss": float(loss)}


def init_process_group() -> None:
    """torchrun 2.13 keeps its agent's store across restarts, and a plain
    init_process_group("gloo") of attempt 1 reads attempt 0's gloo addresses:
    a prefix per attempt there (raydist gives each attempt its own port)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group("gloo")
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    prefixed = dist.PrefixStore(f"attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)
    dist.init_process_group("gloo", store=prefixed, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--workers", type=int, default=0, help="run through raydist.run with this many workers")
    options = parser.parse_args()
    if options.workers:
        results = raydist.run(train, args=(options.steps, options.crash_at), num_workers=options.workers, max_restarts=1)
        print("final loss per rank:", [round(r["loss"], 4) for r in results])
    else:  # under `raydist run` or torchrun: this process is one rank
        train(options.steps, options.crash_at)


if __name__ == "__main__":
    main()
