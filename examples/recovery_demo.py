"""What raydist does that other launchers do not, in about a minute on a laptop's CPU.

    python examples/recovery_demo.py                 # `make demo` runs this
    python examples/recovery_demo.py --out /tmp/demo --workers 3 --crash-at 30   # needs 4 CPUs

A small DDP model trains on ``--workers`` CPU workers with one ready spare,
saving its state every step with ``raydist.save_state`` (a copy in another
process's memory, no disk). At step ``--crash-at`` rank 1's process is
killed. raydist keeps the surviving processes, puts the spare in the dead
rank's place, and the function starts again: ``load_state`` gives it the
last committed step from memory, so only the step cut short is redone and
the loss goes on from where it was. The demo then prints the recovery (which rank
died, how long until the next step, the step reached), the loss curve, the
run's summary, and where it wrote the run's timeline (JSON for Perfetto or
chrome://tracing, and a PNG drawn with matplotlib).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

import raydist

HERE = Path(__file__).resolve().parent


def train(steps: int, crash_at: int) -> Dict[str, Any]:
    info = raydist.get_context()  # torch.distributed is initialised; the same code runs in both attempts
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    history: Dict[str, List[float]] = {"loss": []}  # rank 0's loss by step, kept with the state
    # From another process's memory after the crash; None on the first attempt.
    resumed = raydist.load_state(model=model, optimizer=optimizer, history=history)
    first_step_done: Optional[float] = None
    target = torch.arange(32, dtype=torch.float32) / 32
    for step in range(0 if resumed is None else resumed + 1, steps):
        if attempt == 0 and step == crash_at:
            # A save never waits for the one before to be committed, and these steps take
            # milliseconds, less than a commit: the crash comes once the step before is
            # committed, as it is in a loop whose steps outlast a commit.
            raydist.wait_committed()
            if info.rank == 1:
                os._exit(1)  # a crash: the process and its memory are gone
        generator = torch.Generator().manual_seed(step * 1000 + info.rank)  # the data position is the step
        x = torch.randn(64, 32, generator=generator)
        loss = torch.nn.functional.mse_loss(ddp(x), (x @ target).unsqueeze(1))
        optimizer.zero_grad()
        loss.backward()  # DDP's all_reduce: every rank takes part in each step
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        history["loss"].append(mean.item() / info.world_size)
        if first_step_done is None:
            first_step_done = time.time()
        raydist.save_state(step, shared=["model", "optimizer", "history"], model=model, optimizer=optimizer, history=history)
    return {"attempt": attempt, "resumed": resumed, "first_step_done": first_step_done, "pid": os.getpid(), "loss": history["loss"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--crash-at", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("build") / "demo", help="where the timeline is written")
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    trace, picture = options.out / "timeline.json", options.out / "timeline.png"

    print(f"== {options.workers} workers and 1 spare; rank 1 is killed at step {options.crash_at} of {options.steps}", flush=True)
    results = raydist.run(
        train,
        args=(options.steps, options.crash_at),
        num_workers=options.workers,
        accelerator="cpu",
        max_restarts=1,
        spare_workers=1,
        timeline=str(trace),
    )
    first, after = results.summary.attempts[0], results.summary.attempts[-1]
    rank0, losses = results[0], results[0]["loss"]
    kept = sorted({r["pid"] for r in results} & {t.pid for t in first.ranks.values()})
    spare = [r["pid"] for r in results if r["pid"] not in kept]
    print("\n== the recovery")
    print(f"step {options.crash_at}, attempt 0: {first.ended} (rank 1 was pid {first.ranks[1].pid})")
    print(f"attempt {rank0['attempt']}: kept process(es) {kept}, the spare (pid {spare[0]}) took the dead rank's place")
    print(f"state loaded from another process's memory: resumed after step {rank0['resumed']}, so step {rank0['resumed'] + 1} came next")
    if after.after_fault is not None:
        fault_at = after.ready_at - after.after_fault  # when raydist saw the crash (wall clock)
        first_step = min(r["first_step_done"] for r in results) - fault_at
        print(f"the new world was ready {after.after_fault:.2f} s after the crash, and its first step done {first_step:.2f} s after it")
    print("\n== the loss, averaged over the ranks: the new world goes on where the old one was")
    for step, loss in enumerate(losses):
        if step % 5 == 0 or abs(step - options.crash_at) <= 1 or step == len(losses) - 1:
            mark = "   <- rank 1 killed here; the new world went on from the saved state" if step == options.crash_at else ""
            print(f"  step {step:3d}  loss {loss:.4f}{mark}")
    # The demo checks itself: `make demo` fails if the run did not recover as shown.
    resumed = rank0["resumed"]
    if rank0["attempt"] != 1 or len(spare) != 1 or resumed != options.crash_at - 1 or losses[resumed + 1] > losses[0] / 2:
        print("the run did not recover as it should have", file=sys.stderr)
        return 1
    print(f"\n== the run's summary\n{results.summary.table()}")

    sys.path.insert(0, str(HERE))
    import timeline_png  # examples/timeline_png.py: needs matplotlib

    timeline_png.main([str(trace), str(picture)])
    print(f"\n== the timeline: {trace.resolve()} (open it in https://ui.perfetto.dev)")
    print(f"   drawn as {picture.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
