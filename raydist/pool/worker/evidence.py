"""The evidence a worker process leaves on its node, and the small agent
that reads it there (and, through a worker's diagnostics socket, its flight
recorder).

Ray reports a dead worker with the same text however it died, and a hung
rank cannot answer calls. Each worker therefore leaves evidence on its node
(see ``WorkerEvidence``): its stderr file (Ray writes one per worker process;
Python's faulthandler prints "Fatal Python error: Segmentation fault" there),
a note of ``os._exit(n)``, and a Python stack file that faulthandler fills on
a signal — written by C code, so it works even while a C++ collective holds
the GIL, and needs no ptrace rights (unlike py-spy). ``NodeAgent``, a small
actor on each of a group's nodes, reads it (or sends the signal); the rules
in ``raydist.pool.rules.explain`` turn it into words.
"""

from __future__ import annotations

import faulthandler
import os
from concurrent.futures import ThreadPoolExecutor
import re
import signal
import time
from typing import Dict, List, Optional, Tuple

from raydist.pool.records import CollectiveEntry, WorkerEvidence
from raydist.pool.worker.recorder import ask_worker

# The signal that makes a worker write every thread's Python stack.
STACK_SIGNAL = signal.SIGUSR2

TAIL_LINES = 20


def leave_evidence(evidence: WorkerEvidence) -> None:
    """Make this process leave evidence of how it ends and where it hangs
    (read by raydist.pool.rules.explain from another process on this node)."""
    os.makedirs(os.path.dirname(evidence.stack_path), exist_ok=True)
    for stale in (evidence.exit_note_path, evidence.preemption_path):  # left by an earlier process with this pid
        try:
            os.remove(stale)
        except FileNotFoundError:
            pass
    # Written by faulthandler's C handler: works while a C++ call holds the GIL.
    stacks = open(evidence.stack_path, "ab")  # noqa: SIM115 - open for the process's life
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True, chain=False)
    # os._exit(n) ends the process without a trace Ray reports; note n first.
    real_exit = os._exit

    def exit_noting_status(status: int) -> None:
        try:
            with open(evidence.exit_note_path, "w") as note:
                note.write(str(status))
        finally:
            real_exit(status)

    os._exit = exit_noting_status  # type: ignore[assignment]


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

    def collectives(self, requests: List[Tuple[int, int, WorkerEvidence]]) -> Dict[int, Optional[List[CollectiveEntry]]]:
        """Each rank's last recorded collectives, asked in parallel (a stuck rank answers from its own thread)."""
        with ThreadPoolExecutor(max_workers=min(16, len(requests) or 1)) as pool:
            replies = pool.map(lambda request: ask_worker(request[2].diagnostics_path), requests)
            return {rank: reply for (rank, _, _), reply in zip(requests, replies)}

    def clock(self) -> int:
        """This node's wall clock (ns), to put the ranks' recorder times on the driver's clock."""
        return time.time_ns()

    def preempt(self, requests: List[Tuple[int, int, WorkerEvidence]], deadline: float, signal_name: Optional[str]) -> Dict[int, bool]:
        return {rank: warn_of_preemption(pid, evidence, deadline, signal_name) for rank, pid, evidence in requests}
