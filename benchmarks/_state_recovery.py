"""The state benchmark's model, step and recovery table (``benchmarks/state.py``).

Recovery: the clock starts when a rank dies (``os._exit``, after writing
``time.time()``) or just before a node is removed (``Cluster.remove_node``,
which kills its processes; the driver writes the time), and stops when rank 0
of the next attempt has loaded the state and finished its first step. Every
process runs on this machine, so the clocks agree."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import types
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

import raydist

SHARED = {"shared": ["model", "optimizer"]}  # DDP's model and optimizer: the same on every rank
STEPS, FAULT_AT = 12, 6
RUN_TIMEOUT_S = 600


def build(mb: int) -> Any:
    """A model whose parameters hold ~mb/3 MB (Adam adds two moments: ~mb in all)."""
    width = max(64, int((mb * 2**20 / 3 / 4) ** 0.5))
    torch.manual_seed(0)  # the same on every rank, as DDP keeps it
    model = torch.nn.Linear(width, width, bias=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()  # the moments exist
    return model, optimizer


def busy(ms: float) -> None:
    """A step of fixed length (the work a real step does between saves)."""
    end = time.perf_counter() + ms / 1000
    x = torch.randn(64, 64)
    while time.perf_counter() < end:
        x = x @ x / 64


def _init_process_group() -> None:
    if not dist.is_initialized() and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun keeps its agent store across restarts: a prefix per attempt (see benchmarks/elastic.py).
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        prefixed = dist.PrefixStore(f"attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)
        dist.init_process_group("gloo", store=prefixed, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    elif not dist.is_initialized():
        dist.init_process_group("gloo")


def _fault(marks: str, rank: int, keep_node: str) -> None:
    """Attempt 0's fault: rank 1 dies; with ``keep_node``, every rank marks the
    step and those on other nodes wait there until the driver removes their node
    (the rest wait in the next barrier, as in a real loss)."""
    if keep_node:
        import ray

        node = ray.get_runtime_context().get_node_id()
        with open(os.path.join(marks, f"at-{rank}"), "w") as file:
            file.write(node)
        if node != keep_node:
            threading.Event().wait()
    elif rank == 1:
        with open(os.path.join(marks, "crash"), "w") as file:
            file.write(repr(time.time()))
        os._exit(1)


def imports(seconds: float) -> None:
    """What a script's heavy imports cost (a library such as transformers): ``seconds``
    of CPU the first time in a process, nothing after (the modules stay imported)."""
    if seconds and HEAVY_MODULE not in sys.modules:
        busy(seconds * 1000)
        sys.modules[HEAVY_MODULE] = types.ModuleType(HEAVY_MODULE)


HEAVY_MODULE = "raydist_benchmark_heavy_imports"


def recover(
    mb: int,
    steps: int,
    crash_at: int,
    marks: str,
    disk: Optional[str] = None,
    shared: bool = False,
    keep_node: str = "",
    imports_s: float = 0.0,
) -> None:
    """Train, saving every step; attempt 0 fails at ``crash_at`` (``_fault``); rank 0
    of the next attempt writes when its first step after loading ended. ``disk``:
    torch.save/torch.load instead (``shared``: rank 0 saves one file, every rank loads it);
    ``imports_s``: the function's imports cost that much in a new process (``imports``)."""
    entered = time.time()
    imports(imports_s)
    model, optimizer = build(mb)  # before anything needs the rank: with run_ahead, a process waits in load_state with this done
    built = time.time()
    path = ""
    if disk:
        _init_process_group()
        path = os.path.join(disk, "shared.pt" if shared else f"rank{dist.get_rank()}.pt")
        start = None
        if os.path.exists(path):
            saved = torch.load(path, weights_only=False)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            start = saved["step"]
    else:
        start = raydist.load_state(model=model, optimizer=optimizer)
        _init_process_group()
    rank, attempt = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    loaded = time.time()
    for step in range(0 if start is None else start + 1, steps):
        if attempt == 0 and step == crash_at:
            if not disk:  # as the disk case's last checkpoint is whole: the step before is committed (20 ms steps outrun a commit)
                raydist.wait_committed()
            _fault(marks, rank, keep_node)
        busy(20)
        dist.barrier()
        if disk:
            if rank == 0 or not shared:  # under a temporary name: a rank killed while saving leaves the last whole file
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path + ".tmp")
                os.replace(path + ".tmp", path)
            dist.barrier()  # the step's checkpoint is whole on every rank before any goes on (and may crash)
        elif not disk:
            raydist.save_state(step, model=model, optimizer=optimizer, **(SHARED if shared else {}))
        if attempt > 0 and rank == 0 and not os.path.exists(os.path.join(marks, "first")):
            with open(os.path.join(marks, "first"), "w") as file:
                file.write(f"{time.time()!r} {start} {entered!r} {built!r} {loaded!r}")


Measured = Tuple[float, str, str]


def _recovery_seconds(marks: str) -> Measured:
    """Seconds from the fault to rank 0's first step after loading, the step it
    resumed after, and where the time went (rank 0: until its function started,
    building the model, loading the state, the first step)."""
    crashed = float(open(os.path.join(marks, "crash")).read())
    first, start, *times = open(os.path.join(marks, "first")).read().split()
    entered, built, loaded = (float(t) for t in times)
    split = f"{entered - crashed:.2f} / {built - entered:.2f} / {loaded - built:.2f} / {float(first) - loaded:.2f}"
    return float(first) - crashed, start, split


def _wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)  # polling files the ranks write, with a deadline


def node_loss(cluster: Any, mb: int, store_gib: float, marks: str, spares: int = 0, run_ahead: bool = False) -> Measured:
    """4 ranks, two per node (SPREAD); at the fault's step the node with two
    ranks that is not the driver's is removed, and the run restarts warm.
    Without ``spares`` a third node (as big) joins just before the loss and
    new processes take the lost ranks there; with them, the third node is
    there from the start and the spares stand on it (rank order fills the
    driver's node first and puts the spares last)."""
    import ray
    from _common import wait_for_quiet_cpu

    head = ray.get_runtime_context().get_node_id()
    outcome: Dict[str, Any] = {}
    if spares:
        cluster.add_node(num_cpus=3, object_store_memory=int(store_gib * 2**30))
        cluster.wait_for_nodes()

    def target() -> None:
        try:
            options: Dict[str, Any] = {"num_workers": 4, "max_restarts": 1, "placement_strategy": "SPREAD", "spare_workers": spares}
            options["run_ahead"] = run_ahead
            raydist.run(recover, args=(mb, STEPS, FAULT_AT, marks), kwargs={"keep_node": head}, **options)
        except BaseException as error:  # noqa: BLE001 - raised below, in the driver's thread
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    at = lambda: [open(os.path.join(marks, n)).read() for n in os.listdir(marks) if n.startswith("at-")]  # noqa: E731
    _wait_until(lambda: len(at()) == 4 or not thread.is_alive(), RUN_TIMEOUT_S, "4 ranks at the fault's step")
    if len(at()) < 4 or sorted(at()).count(head) != 2:
        raise RuntimeError(f"expected two ranks on each node, found {at()} ({outcome.get('error')!r})")
    if not spares:
        cluster.add_node(num_cpus=3, object_store_memory=int(store_gib * 2**30))
        cluster.wait_for_nodes()
    wait_for_quiet_cpu()  # the new raylet's start-up is not part of the loss
    victim = next(node for node in cluster.worker_nodes if node.node_id in at())
    with open(os.path.join(marks, "crash"), "w") as file:
        file.write(repr(time.time()))
    cluster.remove_node(victim)
    thread.join(RUN_TIMEOUT_S)
    if thread.is_alive() or "error" in outcome:
        raise RuntimeError(f"the node-loss run did not finish: {outcome.get('error')!r}")
    return _recovery_seconds(marks)


def torchrun(mb: int, marks: str, shared: bool) -> Measured:
    """The crash under ``torchrun --standalone --nproc-per-node 4 --max-restarts 1``, torch.save/torch.load."""
    script = (
        f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); import _state_recovery; "
        f"_state_recovery.recover({mb}, {STEPS}, {FAULT_AT}, {marks!r}, {marks!r}, shared={shared})"
    )
    with open(os.path.join(marks, "run.py"), "w") as file:
        file.write(script)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "--max-restarts", "1"]
    result = subprocess.run([*command, os.path.join(marks, "run.py")], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(f"torchrun exited {result.returncode}: {result.stderr[-3000:]}")
    return _recovery_seconds(marks)


SPARE: Dict[str, Any] = {"spare_workers": 1, "resources_per_worker": {"CPU": 0.5}}
IMPORTS_S = 2.0  # the "2 s of imports" cases: a heavy library, paid once per process
CRASHES = [  # (label, options, on disk, the function's imports in a new process)
    ("crash, spare", SPARE, False, 0.0),
    ("crash, spare, run_ahead", {**SPARE, "run_ahead": True}, False, 0.0),
    (f"crash, spare, {IMPORTS_S:g} s of imports", SPARE, False, IMPORTS_S),
    (f"crash, spare, {IMPORTS_S:g} s of imports, run_ahead", {**SPARE, "run_ahead": True}, False, IMPORTS_S),
    ("crash, no spare", {}, False, 0.0),
    ("fresh + torch.load", {"restart_mode": "fresh"}, True, 0.0),
]
NODE_LOSS = [  # (label, spares, run_ahead); each case leaves the cluster with two nodes, as it found it
    ("node lost (2 of 4 ranks), warm, 2 spares on a third node", 2, False),
    ("node lost (2 of 4 ranks), warm, 2 spares on a third node, run_ahead", 2, True),
    ("node lost (2 of 4 ranks), warm, new processes on a third node", 0, False),
]


def recovery_table(
    mb: int, cluster: Any, store_gib: float, shared: bool = False, reps: int = 1, cases: Optional[Sequence[str]] = None
) -> List[str]:
    """One row per case: seconds (the median of ``reps`` rounds, the cases
    interleaved, and the range), the step resumed after, torchrun's median over
    the case's, and the split of the median round. ``shared``: the model and
    optimizer saved as shared state, and only the first two crashes with a spare
    (and torchrun, the anchor). ``cases``: only those whose label holds one of
    these (torchrun always)."""
    rounds: Dict[str, List[Measured]] = {}
    for _ in range(reps):
        for label, measured in _one_round(mb, cluster, store_gib, shared, cases):
            rounds.setdefault(label, []).append(measured)
    medians = {label: sorted(samples)[(len(samples) - 1) // 2] for label, samples in rounds.items()}
    anchor = medians[TORCHRUN][0]
    rows = []
    for label, samples in rounds.items():
        seconds, start, split = medians[label]
        spread = f" ({min(s[0] for s in samples):.2f}-{max(s[0] for s in samples):.2f})" if reps > 1 else ""
        rows.append(f"| {label} | {seconds:.2f}{spread} | {start} | {anchor / seconds:.1f}x | {split} |")
    return rows


TORCHRUN = "torchrun --max-restarts 1 + torch.load"


def _one_round(mb: int, cluster: Any, store_gib: float, shared: bool, cases: Optional[Sequence[str]]) -> List[Tuple[str, Measured]]:
    """Every case once, in the table's order."""
    import shutil

    chosen = lambda label: cases is None or any(case in label for case in cases)  # noqa: E731
    measured: List[Tuple[str, Measured]] = []
    folders = []
    for label, options, disk, imports_s in CRASHES[:2] if shared else CRASHES:
        if not chosen(label):
            continue
        folders.append(tempfile.mkdtemp())
        marks = folders[-1]
        args = (mb, STEPS, FAULT_AT, marks, marks if disk else None, shared)
        raydist.run(recover, args=args, kwargs={"imports_s": imports_s}, num_workers=4, max_restarts=1, **options)  # type: ignore[arg-type]
        measured.append((label, _recovery_seconds(marks)))
    if not shared:  # last of raydist's: they leave the cluster with a new node instead of the lost one
        for label, spares, ahead in NODE_LOSS:
            if not chosen(label):
                continue
            folders.append(tempfile.mkdtemp())
            measured.insert(len(measured) - 1, (label, node_loss(cluster, mb, store_gib, folders[-1], spares, ahead)))
    folders.append(tempfile.mkdtemp())
    measured.append((TORCHRUN, torchrun(mb, folders[-1], shared)))
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    return measured
