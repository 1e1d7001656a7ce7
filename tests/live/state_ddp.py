"""A deterministic data-parallel training loop that saves its state every step: run as a
function (``raydist.run(train, ...)``) or as a script (``raydist run`` /
``torchrun``). Batches are seeded by (step, rank), so a run that resumes from
a committed step ends with the same weights, bit for bit, as one that never
failed. A fault happens on the first attempt only."""

from __future__ import annotations

import argparse
import inspect
import os
import threading
import time
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
from marks import write_mark

import raydist

# Per-parameter buckets (see ``train``): a cap per bucket where this torch takes one
# (``bucket_cap_mb_list``, not in every torch raydist supports); else one cap, which an
# older DDP applies to its first bucket too.
_DDP_PARAMETERS = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
PER_PARAMETER_BUCKETS: Dict[str, Any] = (
    {"bucket_cap_mb_list": [1e-6]} if "bucket_cap_mb_list" in _DDP_PARAMETERS else {"bucket_cap_mb": 1e-6}
)


def train(
    steps: int,
    crash_at: Optional[int] = None,
    crash_rank: int = 1,
    lose_node: str = "",
    marks: str = "",
    shared: bool = False,
    builds: str = "",
) -> Dict[str, Any]:
    """``steps`` steps of DDP (torch's DistributedDataParallel, gloo); on attempt 0, once step
    ``crash_at - 1`` is committed, rank ``crash_rank`` dies at the start of step ``crash_at`` (or, with ``marks``, every rank marks the step
    there, with its node, and those on ``lose_node`` block until that node is
    removed; the others go on into the collective). ``builds``: a folder where each
    model build leaves a mark with its process and the RANK it saw (none: run ahead).

    Nothing before ``load_state`` needs the rank or the process group, so that a
    process readied with ``run_ahead`` parks there with its model built."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    if builds:
        write_mark(builds, f"build-{os.getpid()}-{time.monotonic_ns()}.json", {"pid": os.getpid(), "rank": os.environ.get("RANK")})
    kept = {"shared": ("model", "optimizer")} if shared else {}
    resumed = raydist.load_state(model=model, optimizer=optimizer)
    if not dist.is_initialized():
        _init_process_group()
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # One bucket per parameter: DDP lays out its first step's single bucket in
    # parameter order and rebuilds it in gradient-ready order after that step, so
    # a resumed run's first step would sum the same gradients in another layout
    # than the run without a failure (gloo's ring: last-bit differences).
    # Per-parameter buckets are laid out alike in every step.
    ddp = torch.nn.parallel.DistributedDataParallel(model, **PER_PARAMETER_BUCKETS)
    for step in range(0 if resumed is None else resumed + 1, steps):
        if attempt == 0 and step == crash_at:
            # A save never waits for a commit: the fault comes once the step before is committed, so
            # that the resumed step is known (on every rank: each one's copies are part of the commit).
            raydist.wait_committed()
            if marks:
                import ray

                node = ray.get_runtime_context().get_node_id()
                write_mark(marks, f"rank-{rank}.json", {"rank": rank, "pid": os.getpid(), "node": node})
                if node == lose_node:
                    threading.Event().wait()  # until the node goes; the others block in all_reduce
            elif rank == crash_rank:
                os._exit(3)
        generator = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 8, generator=generator), torch.randn(16, 1, generator=generator)
        optimizer.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()
        optimizer.step()
        raydist.save_state(step, model=model, optimizer=optimizer, **kept)  # type: ignore[arg-type]
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"resumed": resumed, "attempt": attempt, "rank": rank, "pid": os.getpid(), "weights": weights}


def _init_process_group() -> None:
    """torchrun 2.13 keeps its agent's store across restarts, and a plain
    init_process_group("gloo") of attempt 1 reads attempt 0's gloo addresses
    ("Connection refused"): a prefix per attempt there. raydist gives every
    attempt its own MASTER_PORT."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group("gloo")
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    prefixed = dist.PrefixStore(f"attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)
    dist.init_process_group("gloo", store=prefixed, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--out", required=True)
    options = parser.parse_args()
    result = train(options.steps, options.crash_at)
    if result["rank"] == 0:
        torch.save(result, options.out)


if __name__ == "__main__":
    main()
