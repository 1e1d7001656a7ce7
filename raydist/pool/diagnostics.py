"""Why a rank died and where a hung rank is.

Ray reports a dead worker with the same text however it died, and a hung
rank cannot answer calls. Each worker therefore leaves evidence on its node
(see ``WorkerEvidence``): its stderr file (Ray writes one per worker process;
Python's faulthandler prints "Fatal Python error: Segmentation fault" there),
a note of ``os._exit(n)``, and a Python stack file that faulthandler fills on
a signal — written by C code, so it works even while a C++ collective holds
the GIL, and needs no ptrace rights (unlike py-spy). A small agent actor on
each of the group's nodes reads the evidence (or sends the signal), so this
works on every node, and the pure functions below turn it into one clear line.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from raydist.pool.errors import WorkerFailure
    from raydist.pool.layout import WorkerInfo

# The signal that makes a worker write every thread's Python stack.
STACK_SIGNAL = signal.SIGUSR2
TAIL_LINES = 20
EVIDENCE_TIMEOUT_S = 10.0
# faulthandler's first line for each fatal signal it catches.
_FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# Frames that are raydist's or Ray's own machinery around the user's call.
_MACHINERY = (os.sep + "ray" + os.sep, os.path.join("raydist", "pool") + os.sep, os.sep + "runpy.py", "<frozen runpy>")
_COLLECTIVE_FILES = (os.path.join("torch", "distributed") + os.sep, os.sep + "horovod" + os.sep, os.path.join("raydist", "core", "collectives.py"))


@dataclass(frozen=True)
class WorkerEvidence:
    """Where one worker process leaves what it wrote and how it ended (paths on its node)."""

    stderr_path: Optional[str]  # the file Ray sends this process's stderr to
    exit_note_path: str  # os._exit(n) writes n here first
    stack_path: str  # faulthandler writes the stacks here on STACK_SIGNAL
    preemption_path: str  # the driver writes the drain deadline here (see raydist.core.preemption)

    @classmethod
    def for_process(cls, pid: int, scratch_dir: str) -> "WorkerEvidence":
        try:
            stderr_path: Optional[str] = os.readlink("/proc/self/fd/2")  # Linux; Ray's per-worker .err file
        except OSError:
            stderr_path = None
        return cls(
            stderr_path=stderr_path if stderr_path and os.path.isfile(stderr_path) else None,
            exit_note_path=os.path.join(scratch_dir, f"exit-{pid}"),
            stack_path=os.path.join(scratch_dir, f"stacks-{pid}"),
            preemption_path=os.path.join(scratch_dir, f"preempted-{pid}"),
        )


# -- on the rank's node -------------------------------------------------------


def read_evidence(evidence: WorkerEvidence, lines: int = TAIL_LINES) -> Tuple[Optional[str], Optional[int]]:
    """The last ``lines`` lines the process wrote to stderr, and its os._exit code if noted."""
    tail = None
    if evidence.stderr_path and os.path.isfile(evidence.stderr_path):
        tail = _tail(evidence.stderr_path, lines)
    code = None
    try:
        with open(evidence.exit_note_path) as note:
            code = int(note.read().strip() or "0")
    except (OSError, ValueError):
        pass
    return tail, code


def _tail(path: str, lines: int, chunk: int = 256 * 1024) -> str:
    with open(path, "rb") as file:
        file.seek(0, os.SEEK_END)
        file.seek(max(0, file.tell() - chunk))
        text = file.read().decode("utf-8", errors="replace")
    kept = [line.rstrip() for line in text.splitlines() if not _NOISE.search(line)]
    kept = [line for i, line in enumerate(kept) if line or (i and kept[i - 1])]  # no runs of blank lines
    return "\n".join(kept[-lines:]).strip("\n")


# Lines of a crash report that say nothing a reader can act on, so the tail
# keeps the cause ("what(): ...", the Python stack): native frame addresses,
# Ray's second copy of the signal report, faulthandler's module list, and
# Ray's and raydist's own marker lines.
_NOISE = re.compile(
    r"^\s*/\S+\(\+?[_\w]*\+?0x|^\s*@\s+0x|^PC: @|logging\.cc:474:|^Extension modules:"
    r"|^:(actor_name|job_id|task_name):|raydist-output-end-"
)


def dump_stack(pid: int, stack_path: str, timeout: float = 3.0) -> Optional[str]:
    """Signal ``pid`` to write its stacks; the dump, or None if it did not come."""
    try:
        start = os.path.getsize(stack_path)
    except OSError:
        return None
    try:
        os.kill(pid, STACK_SIGNAL)
    except OSError:
        return None
    deadline = time.monotonic() + timeout
    size, stable_since = start, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)  # the dump is written asynchronously by the signal handler
        now = os.path.getsize(stack_path)
        if now != size:
            size, stable_since = now, time.monotonic()
        elif size > start and time.monotonic() - stable_since > 0.1:
            break
    if size <= start:
        return None
    with open(stack_path, "rb") as file:
        file.seek(start)
        return file.read().decode("utf-8", errors="replace")


def warn_of_preemption(pid: int, evidence: WorkerEvidence, deadline: float, signal_name: Optional[str]) -> bool:
    """Write the drain deadline where the rank reads it, then signal the rank."""
    with open(evidence.preemption_path, "w") as note:
        note.write("" if deadline == float("inf") else repr(deadline))
    if signal_name is None:
        return True
    try:
        os.kill(pid, getattr(signal, signal_name))
    except OSError:
        return False
    return True


# -- pure: turning evidence into words ----------------------------------------


def explain_death(ray_text: str, tail: Optional[str], exit_code: Optional[int], node_alive: bool) -> str:
    """One line on how a worker process ended, from what it left behind."""
    if exit_code is not None:
        return f"exited with status {exit_code} (os._exit)"
    for marker, name in _FATAL_SIGNALS.items():
        # Python's faulthandler and Ray's own handler both name the signal.
        if tail and (f"Fatal Python error: {marker}" in tail or f"*** {name} received" in tail):
            return f"killed by {name} ({marker.lower()})"
    if "running low on memory" in ray_text or "OutOfMemoryError" in ray_text:
        return "killed by Ray's memory monitor (OOM: the node ran low on memory)"
    if not node_alive:
        return "its node died or left the cluster"
    return (
        "killed without an exit status or crash report: SIGKILL (or SIGTERM) from outside, "
        "or the kernel's OOM killer"
    )


@dataclass(frozen=True)
class StackSummary:
    """The part of one rank's stack that says where it is."""

    where: str  # "in all_reduce at train.py:88"
    frames: Tuple[str, ...]  # the user's frames, outermost first
    in_collective: bool  # waiting for the other ranks


def summarize_stack(dump: str) -> StackSummary:
    """The stack of the thread running the user's call, from a faulthandler dump."""
    threads: List[List[Tuple[str, int, str]]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append([])
            continue
        match = _FRAME.match(line)
        if match and threads:
            threads[-1].append((match["file"], int(match["line"]), match["func"]))
    # faulthandler lists the most recent call first; the call runs under raydist's execute.
    running = [t for t in threads if any(f.endswith(os.path.join("pool", "worker.py")) and fn == "execute" for f, _, fn in t)]
    frames = list(reversed(running[0] if running else (threads[0] if threads else [])))
    while frames and any(m in frames[0][0] for m in _MACHINERY):
        frames.pop(0)
    if not frames:
        return StackSummary("(no Python frames)", (), False)
    innermost = frames[-1]
    user = [f for f in frames if not _is_library(f[0])]
    where = f"in {innermost[2]} at {os.path.basename(innermost[0])}:{innermost[1]}"
    if user and user[-1] is not innermost:  # the user's line that led there
        where += f", from {user[-1][2]} at {os.path.basename(user[-1][0])}:{user[-1][1]}"
    lines = tuple(f'File "{file}", line {line}, in {func}' for file, line, func in frames)
    return StackSummary(where, lines, any(c in f[0] for f in frames for c in _COLLECTIVE_FILES))


def _is_library(path: str) -> bool:
    return "site-packages" in path or "dist-packages" in path or path.startswith(("<", os.path.dirname(os.__file__)))


def ranks_text(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"."""
    spans: List[str] = []
    ordered = sorted(ranks)
    start = prev = ordered[0]
    for rank in ordered[1:] + [None]:  # type: ignore[list-item]
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(spans)


def format_stacks(dumps: Dict[int, Optional[str]]) -> str:
    """Ranks grouped by where they are; the odd ones out marked.

    A rank outside any collective while others wait in one is marked; with
    no such difference, the smaller groups are.
    """
    groups: Dict[Tuple[str, Tuple[str, ...]], List[int]] = {}
    summaries: Dict[Tuple[str, Tuple[str, ...]], StackSummary] = {}
    missing = [rank for rank, dump in dumps.items() if not dump]
    for rank, dump in sorted(dumps.items()):
        if dump:
            summary = summarize_stack(dump)
            key = (summary.where, summary.frames)
            groups.setdefault(key, []).append(rank)
            summaries[key] = summary
    odd = _odd_groups(groups, summaries)
    lines = []
    for key, ranks in sorted(groups.items(), key=lambda item: item[1][0]):
        mark = "  <-- differs" if key in odd else ""
        lines.append(f"{ranks_text(ranks)}: {key[0]}{mark}")
        lines.extend(f"    {frame}" for frame in key[1])
    if missing:
        lines.append(f"{ranks_text(missing)}: no stack (the process did not answer)")
    return "\n".join(lines)


def _odd_groups(groups: Dict[Tuple[str, Tuple[str, ...]], List[int]], summaries: Dict[Tuple[str, Tuple[str, ...]], StackSummary]) -> List[Tuple[str, Tuple[str, ...]]]:
    if len(groups) < 2:
        return []
    outside = [key for key in groups if not summaries[key].in_collective]
    if outside and len(outside) < len(groups):
        return outside
    largest = max(len(ranks) for ranks in groups.values())
    smaller = [key for key, ranks in groups.items() if len(ranks) < largest]
    return smaller


# -- the Ray side: one small agent actor per node of a group -------------------


class NodeAgent:
    """A light actor on each node of a group (no torch, no resources) that
    reads its ranks' evidence, dumps their stacks and warns them of a
    preemption. Started with the group, it is there when needed: a draining
    node accepts no new tasks, and a hung rank cannot answer for itself."""

    def ping(self) -> int:
        return os.getpid()

    def evidence(self, requests: List[Tuple[int, int, WorkerEvidence]]) -> Dict[int, Tuple[Optional[str], Optional[int]]]:
        return {rank: read_evidence(evidence) for rank, _, evidence in requests}

    def stacks(self, requests: List[Tuple[int, int, WorkerEvidence]]) -> Dict[int, Optional[str]]:
        return {rank: dump_stack(pid, evidence.stack_path) for rank, pid, evidence in requests}

    def preempt(self, requests: List[Tuple[int, int, WorkerEvidence]], deadline: float, signal_name: Optional[str]) -> Dict[int, bool]:
        return {rank: warn_of_preemption(pid, evidence, deadline, signal_name) for rank, pid, evidence in requests}


def start_agents(node_ids: Sequence[str]) -> Dict[str, object]:
    """One NodeAgent per node, pinned there."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote_agent = ray.remote(num_cpus=0, max_restarts=0)(NodeAgent)
    return {
        node_id: remote_agent.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
        for node_id in dict.fromkeys(node_ids)
    }


def ask_agents(
    agents: Dict[str, object],
    workers: Sequence["WorkerInfo"],
    ranks: Sequence[int],
    method: str,
    *args: object,
    timeout: float = EVIDENCE_TIMEOUT_S,
) -> Dict[int, object]:
    """``NodeAgent.<method>`` for ``ranks``, one call per node, in parallel;
    ranks whose node (or agent) does not answer within ``timeout`` are left out."""
    import ray

    by_node: Dict[str, List[Tuple[int, int, WorkerEvidence]]] = {}
    for rank in ranks:
        worker = workers[rank]
        if worker.evidence is not None and worker.node_id in agents:
            by_node.setdefault(worker.node_id, []).append((rank, worker.pid, worker.evidence))
    refs = [getattr(agents[node], method).remote(requests, *args) for node, requests in by_node.items()]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    found: Dict[int, object] = {}
    for ref in ready:
        try:
            found.update(ray.get(ref))
        except Exception:  # noqa: BLE001 - an agent whose node went away: that evidence is missing
            pass
    return found


def explain_deaths(failures: Sequence["WorkerFailure"], workers: Sequence["WorkerInfo"], agents: Dict[str, object]) -> List["WorkerFailure"]:
    """``failures`` with each dead process's cause and last stderr lines,
    read on its node (a rank whose node is gone says so)."""
    import dataclasses

    import ray

    dead = [f.rank for f in failures if f.crashed and f.rank < len(workers)]
    if not dead or not ray.is_initialized():
        return list(failures)
    found = ask_agents(agents, workers, dead, "evidence")
    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    explained = []
    for failure in failures:
        if failure.rank in dead:
            tail, code = found.get(failure.rank, (None, None))  # type: ignore[misc]
            cause = explain_death(failure.died or "", tail, code, workers[failure.rank].node_id in alive)
            failure = dataclasses.replace(failure, died=cause, output=tail)
        explained.append(failure)
    return explained
