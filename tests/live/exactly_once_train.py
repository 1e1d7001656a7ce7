"""A data-parallel loop that logs every row it trains on: run as a function
(``raydist.run(train, ...)``) or as a torchrun script (the sampler).

The rows are ``0 .. rows-1``, read from a Ray Data shard read exactly once
(``ray-data``: ``datasets=`` "train" with an ``id`` column and
``DataConfig(exactly_once=True)``; ``split``: ``raydist.split_dataset(...,
exactly_once=True)``) or through ``raydist.DistributedSampler`` and a
``DataLoader`` (``sampler``). Each step is one
batch per rank; the model, optimizer and data position are saved every step.
Every ``settle_every`` steps each rank waits for the step's commit (the
steps in between commit as they may). Each rank appends to
``<log>/attempt-<a>-rank-<r>.log`` the step it resumed
from, then per step: the epoch, the step and the rows it took, so a test can
rebuild which rows the committed steps consumed.

Faults, on the attempt they name:
- ``crash``: ``(attempt, step, rank)``: that rank dies after taking the step's batch;
- ``hold``: ``[(attempt, step), ...]``: there, every rank takes the step's
  batch, leaves a mark and all-reduces until the world is torn down (the test
  then removes or adds a node).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.utils.data as tud
from marks import write_mark

import raydist

LEARNING_RATE = 0.05


def batches(source: str, rows: int, batch_size: int, epochs: int, data: Any) -> Iterator[Tuple[int, torch.Tensor]]:
    """(epoch, row ids) per step, from the position ``data`` was loaded at."""
    if source in ("ray-data", "split"):
        while data.epoch < epochs:
            epoch = data.epoch
            for batch in data.iter_torch_batches(batch_size=batch_size):
                yield epoch, batch["id"]
        return
    sampler, loader = data
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for (ids,) in sampler.track(loader):
            yield epoch, ids


def train(
    source: str,
    rows: int,
    batch_size: int,
    epochs: int,
    log: str,
    crash: Optional[Sequence[int]] = None,
    hold: Sequence[Sequence[int]] = (),
    settle_every: int = 10,
) -> Dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    if source == "ray-data":
        data: Any = raydist.get_dataset_shard("train")
        saved = data
    elif source == "split":
        import ray

        data = saved = raydist.split_dataset(ray.data.range(rows, override_num_blocks=7), exactly_once=True, shuffle=True, seed=0)
    else:
        dataset = tud.TensorDataset(torch.arange(rows))
        sampler = raydist.DistributedSampler(dataset, shuffle=True, seed=0)
        data = (sampler, tud.DataLoader(dataset, batch_size=batch_size, sampler=sampler))
        saved = sampler
    resumed = raydist.load_state(model=model, optimizer=optimizer, data=saved)
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    step = resumed or 0
    with open(Path(log, f"attempt-{attempt}-rank-{rank}.log"), "a") as out:
        out.write(f"resumed {resumed} world {world}\n")
        out.flush()
        for epoch, ids in batches(source, rows, batch_size, epochs, data):
            step += 1
            out.write(f"{epoch} {step} {' '.join(map(str, ids.tolist()))}\n")
            out.flush()
            if crash is not None and (attempt, step, rank) == tuple(crash):
                os._exit(3)
            if (attempt, step) in {tuple(h) for h in hold}:
                write_mark(log, f"hold-{attempt}-{rank}.json", {"rank": rank, "world": world})
                while True:
                    dist.all_reduce(torch.ones(1))  # until the world is torn down
            x = ids.to(torch.float64).unsqueeze(1) / rows
            optimizer.zero_grad()
            (((ddp(x) - (3 * x + 1)) ** 2).sum() / batch_size).backward()  # by rows: an empty batch adds nothing
            optimizer.step()
            raydist.save_state(step, shared=["model", "optimizer", "data"], model=model, optimizer=optimizer, data=saved)
            if step % settle_every == 0:  # a commit now and then: steps take milliseconds, a commit a moment
                raydist.wait_committed()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"rank": rank, "world": world, "attempt": attempt, "resumed": resumed, "weights": weights.tolist(), "steps": step}


def reference(source: str, rows: int, batch_size: int, epochs: int, world: int) -> torch.Tensor:
    """The weights of a run that never failed, computed here: DDP's mean of the
    ranks' gradients, with each rank's rows from the same sampler or shard."""
    from raydist.core.sampler import DistributedSampler

    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    dataset = tud.TensorDataset(torch.arange(rows))
    if source in ("ray-data", "split"):
        import pyarrow as pa

        from raydist.pool.worker.positional import PositionalShard

        table = pa.table({"id": list(range(rows))})  # ray.data.range(rows), read in order
        ranks = [PositionalShard([(table, 0, rows)], "train", r, world, True, 0, fetch=lambda t: t) for r in range(world)]
        streams = [batches(source, rows, batch_size, epochs, shard) for shard in ranks]
    else:
        samplers = [DistributedSampler(dataset, num_replicas=world, rank=r, shuffle=True, seed=0) for r in range(world)]
        streams = [
            batches(source, rows, batch_size, epochs, (s, tud.DataLoader(dataset, batch_size=batch_size, sampler=s))) for s in samplers
        ]
    for step in zip(*streams):
        optimizer.zero_grad()
        for _, ids in step:
            x = ids.to(torch.float64).unsqueeze(1) / rows
            ((((model(x) - (3 * x + 1)) ** 2).sum() / batch_size) / world).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def consumed(log: Path) -> Dict[int, Dict[int, int]]:
    """Per epoch, how many times each row was in a committed step: an attempt's
    steps count up to the step the next attempt resumed from (the last: all)."""
    attempts: Dict[int, Dict[str, Any]] = {}
    for path in sorted(log.glob("attempt-*-rank-*.log")):
        attempt = int(path.name.split("-")[1])
        lines = path.read_text().splitlines()
        entry = attempts.setdefault(attempt, {"resumed": None, "steps": []})
        resumed = lines[0].split()[1]
        entry["resumed"] = None if resumed == "None" else int(resumed)
        for line in lines[1:]:
            epoch, step, *ids = line.split()
            entry["steps"].append((int(epoch), int(step), [int(i) for i in ids]))
    order = sorted(attempts)
    counts: Dict[int, Dict[int, int]] = {}
    for index, attempt in enumerate(order):
        until = (attempts[order[index + 1]]["resumed"] or 0) if index + 1 < len(order) else float("inf")
        for epoch, step, ids in attempts[attempt]["steps"]:
            if step <= until:
                for row in ids:
                    counts.setdefault(epoch, {}).setdefault(row, 0)
                    counts[epoch][row] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--crash", type=json.loads, default=None)
    options = parser.parse_args()
    from state_ddp import _init_process_group

    _init_process_group()  # a store prefix per attempt under torchrun's agent store
    result = train("sampler", options.rows, options.batch_size, options.epochs, options.out_dir, crash=options.crash)
    if result["rank"] == 0:
        Path(options.out_dir, "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
