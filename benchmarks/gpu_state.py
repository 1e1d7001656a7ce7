"""Training state on a GPU: what ``save_state`` of a model + Adam on the
device costs the loop at 1, 4 and 16 GB of state (parameters plus Adam's two
moments), against ``torch.save`` to local disk and the blocking part of
``torch.distributed.checkpoint.async_save`` of the same state, in the same
run; and ``load_state`` back onto the device, against ``torch.load`` of that
file. One worker on one GPU (``raydist.run``), a local Ray with token auth
and an object store sized for two steps of the largest state.

* save_state: the time it blocks (its return, plus what the next
  ``optimizer.step()`` waits for; CUDA tensors are copied to pinned host
  memory before it returns), median over ``--repeats`` saves after a first
  one (printed apart: it starts the keeper and pins the host buffers). Each
  save comes after the previous one is committed, as in a loop whose saves
  are further apart than a commit takes ("commit": how long after its
  return).
* torch.save: to a file on local disk (into the page cache; no fsync), once
  per size; ``dcp.async_save``: until it returns (the state staged in host
  memory), then its write is waited for apart. Each file is removed once timed.
* load: ``load_state`` of the last committed step into the same model and
  optimizer (a survivor's load after a warm restart), ``torch.load`` of the
  file onto the device plus ``load_state_dict``.

Goals: save_state blocks <= 1/20 of torch.save, and less than async_save.

    python benchmarks/gpu_state.py [--sizes-gb 1,4,16] [--json out.json]
    python benchmarks/gpu_state.py --device cpu --sizes-gb 0.05   # no GPU: the same path on CPU tensors
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

# Token auth as on a real cluster; Ray reads it when imported.
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import fmt_ms, fmt_ratio, fmt_s, init_ray, load_line, machine_line, print_table, verdict

import raydist

CHUNKS = 8  # the parameters as several tensors, as a model has them
SAVE_GOAL = 1 / 20  # save_state <= this share of torch.save


def build(size_gb: float, device: str) -> Tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model of ``size_gb / 3`` GB of fp32 parameters and Adam with both moments
    allocated: ``size_gb`` GB of state on ``device``."""
    per_chunk = max(1, int(size_gb * 2**30 / 3 / 4 / CHUNKS))
    model = torch.nn.Module()
    model.chunks = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(per_chunk, device=device)) for _ in range(CHUNKS))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    optimizer.step()  # the moments exist
    optimizer.zero_grad(set_to_none=True)  # the timed step() below changes nothing: only its wait counts
    return model, optimizer


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    moments = [t for kept in optimizer.state.values() for t in kept.values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *moments])


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Callable[[], Any]) -> float:
    _sync()
    started = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - started


def _wait_committed() -> float:
    """Until this rank's last save is committed (every rank waits at the same point); seconds waited."""
    started = time.perf_counter()
    raydist.wait_committed()
    return time.perf_counter() - started


def time_save_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saves: int) -> Dict[str, Any]:
    blocked, commits = [], []
    for step in range(saves + 1):
        _sync()
        started = time.perf_counter()
        raydist.save_state(step, model=model, optimizer=optimizer)
        optimizer.step()  # waits for the copy of any tensor saved in the background
        blocked.append(time.perf_counter() - started)
        commits.append(_wait_committed())
    return {"first": blocked[0], "save_state": statistics.median(blocked[1:]), "commit": statistics.median(commits[1:])}


def time_torch_save(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str, device: str) -> Dict[str, float]:
    path = os.path.join(folder, "state.pt")
    saved = _timed(lambda: torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path))

    def load() -> None:
        state = torch.load(path, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    loaded = _timed(load)
    os.remove(path)
    return {"torch.save": saved, "torch.load": loaded}


def time_async_save(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str) -> Dict[str, float]:
    import torch.distributed.checkpoint as dcp

    # Its planning collectives run on a CPU group of their own, apart from the loop's.
    group = dist.new_group(backend="gloo")
    path = os.path.join(folder, "dcp")
    _sync()
    started = time.perf_counter()
    response = dcp.async_save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=path, process_group=group)
    blocked = time.perf_counter() - started
    getattr(response, "upload_completion", response).result()  # a newer torch answers staging and upload apart
    written = time.perf_counter() - started
    shutil.rmtree(path, ignore_errors=True)
    dist.destroy_process_group(group)
    return {"dcp.async_save": blocked, "dcp.async_save written": written}


def measure(size_gb: float, saves: int, folder: str) -> Dict[str, Any]:
    """Every figure for one size, in this worker (one rank, its device)."""
    device = raydist.get_context().device
    model, optimizer = build(size_gb, device)
    result: Dict[str, Any] = {"size_gb": size_gb, "bytes": state_bytes(model, optimizer), "device": device}
    if device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(device)
    result.update(time_torch_save(model, optimizer, folder, device))
    result.update(time_async_save(model, optimizer, folder))
    result.update(time_save_state(model, optimizer, saves))
    result["load_state"] = _timed(lambda: raydist.load_state(model=model, optimizer=optimizer))
    return result  # the worker ends with the call (one run per size): its memory goes with it


def fmt_t(seconds: Optional[float]) -> str:
    """Milliseconds below a second (a save that blocks 40 ms), else seconds."""
    return fmt_ms(seconds) if seconds is not None and seconds < 1 else fmt_s(seconds)


def row(result: Dict[str, Any]) -> List[str]:
    save, baseline, staged = result["save_state"], result["torch.save"], result["dcp.async_save"]
    met = save <= SAVE_GOAL * baseline and save < staged
    return [
        f"{result['bytes'] / 2**30:.2f} GiB",
        fmt_t(save),
        fmt_t(result["first"]),
        fmt_t(result["commit"]),
        fmt_t(baseline),
        fmt_t(staged),
        fmt_t(result["dcp.async_save written"]),
        fmt_ratio(save, baseline),
        fmt_ratio(save, staged),
        fmt_t(result["load_state"]),
        fmt_t(result["torch.load"]),
        verdict(met),
    ]


COLUMNS = [
    "state",
    "save_state blocks",
    "first save_state",
    "commit after",
    "torch.save",
    "async_save blocks",
    "async_save written",
    "vs torch.save (<= 0.05x)",
    "vs async_save (< 1x)",
    "load_state",
    "torch.load + load_state_dict",
    "goal",
]


def run_worker(options: argparse.Namespace, size_gb: float, folder: str) -> Dict[str, Any]:
    where: Dict[str, Any] = {"accelerator": "cpu"} if options.device == "cpu" else {"resources_per_worker": {"GPU": 1}}
    [result] = raydist.run(measure, args=(size_gb, options.repeats, folder), num_workers=1, **where)
    return dict(result)


def store_bytes(options: argparse.Namespace, sizes: List[float]) -> int:
    """Two steps of the largest state, and room besides; at most half the memory."""
    import psutil

    wanted = int((2.5 * max(sizes) + 1) * 2**30)
    return min(wanted, psutil.virtual_memory().total // 2) if options.store_gib is None else int(options.store_gib * 2**30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: the same path on CPU tensors (no GPU here)")
    parser.add_argument("--sizes-gb", default="1,4,16", help="state sizes (parameters + Adam's moments), comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="save_state samples per size, after the first")
    parser.add_argument("--dir", default=None, help="local disk folder for torch.save / async_save (default: a temporary one)")
    parser.add_argument("--store-gib", type=float, default=None, help="Ray's object store (default: 2.5x the largest state)")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    options = parser.parse_args()
    if options.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: use --device cpu (with small --sizes-gb)")
    sizes = [float(s) for s in options.sizes_gb.split(",") if s]
    import ray

    init_ray(num_cpus=4, object_store_memory=store_bytes(options, sizes))
    machine = machine_line()
    print(machine, flush=True)
    folder = tempfile.mkdtemp(dir=options.dir)
    results: List[Dict[str, Any]] = []
    try:
        for size in sizes:
            results.append(run_worker(options, size, folder))
            print(f"{size:g} GB: {json.dumps(results[-1])}", flush=True)
            write_json(options, machine, results)  # after each size: a run cut short keeps what it measured
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        ray.shutdown()
    where = results[0].get("gpu", "CPU") if results else options.device
    title = f"## save_state of a model + Adam on {where}, one worker (blocking time: median of {options.repeats})"
    print_table(title, COLUMNS, map(row, results))
    print(f"At the end: {load_line()}")


def write_json(options: argparse.Namespace, machine: str, results: List[Dict[str, Any]]) -> None:
    if not options.json:
        return
    goal = {"save_state / torch.save": SAVE_GOAL, "save_state / async_save": 1.0}
    summary = {"machine": machine, "device": options.device, "sizes_gb": options.sizes_gb, "results": results, "goal": goal}
    with open(options.json, "w") as file:
        json.dump(summary, file, indent=1)


if __name__ == "__main__":
    main()
