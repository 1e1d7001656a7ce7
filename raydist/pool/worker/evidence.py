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

import contextlib
import ctypes
import faulthandler
import os
import platform
import re
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from raydist.pool.records import CollectiveEntry, WorkerEvidence
from raydist.pool.worker.recorder import ask_worker

# The signal that makes a worker write every thread's Python stack: a
# real-time one, which scripts do not take for themselves (SLURM's
# --signal and many training scripts use SIGUSR1/SIGUSR2, and a script's
# own handler would replace faulthandler's).
STACK_SIGNAL = signal.SIGRTMIN + 6
# Signals whose default action ends the process: noted first, so that the
# driver can say which one (Ray's own SIGTERM handler would turn it into "exited with status 1").
NOTED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

TAIL_LINES = 20
SCRATCH_FOLDER = "raydist-workers"  # under the node's temp directory, shared by every run there
# The files a worker leaves under its pid (see WorkerEvidence.for_process).
_OWN_FILE = re.compile(r"^(?:exit|stacks|preempted|error|diag)-(\d+)(?:\.json|\.sock)?$")
# A dead process's files younger than this may still be read as the evidence of its death.
STALE_AFTER_S = 30.0


def scratch_dir() -> str:
    """Where this node's workers leave their evidence."""
    return os.path.join(tempfile.gettempdir(), SCRATCH_FOLDER)


def leave_evidence(evidence: WorkerEvidence) -> None:
    """Make this process leave evidence of how it ends and where it hangs
    (read by raydist.pool.rules.explain from another process on this node)."""
    os.makedirs(os.path.dirname(evidence.stack_path), exist_ok=True)
    remove_stale(os.path.dirname(evidence.stack_path))  # what SIGKILLed workers (or a lost driver) left here
    for stale in (evidence.exit_note_path, evidence.preemption_path, evidence.error_path):  # left by an earlier process with this pid
        try:
            os.remove(stale)
        except FileNotFoundError:
            pass
    # Written by faulthandler's C handler: works while a C++ call holds the GIL.
    stacks = open(evidence.stack_path, "ab")
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
    for signum in NOTED_SIGNALS:  # a script's own handler replaces this one, as it should
        signal.signal(signum, _die_noting_signal(evidence.exit_note_path))
    # Ray blocks SIGINT in its workers; a rank gets it as torchrun's child does
    # when `raydist run` forwards a Ctrl-C: KeyboardInterrupt while it runs the
    # user's code (see ``user_code_interruptible``), else it ends at once: a
    # KeyboardInterrupt raised in Ray's C++ task loop would never surface.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def user_code_interruptible() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt inside (the user's code), and kills
    the process outside, as it would a torchrun child that has not started
    Python yet or has finished (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL)


def _die_noting_signal(note_path: str) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        try:
            with open(note_path, "w") as note:
                note.write(str(-signum))
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)  # ends as the signal's default action would

    return handler


def remove_evidence(evidence: WorkerEvidence) -> None:
    """Remove the files raydist made for a process that is gone (not Ray's stderr file)."""
    for path in evidence.own_files:
        try:
            os.remove(path)
        except OSError:
            pass


def remove_stale(scratch_dir: str, stale_after: float = STALE_AFTER_S, owned: "re.Pattern[str]" = _OWN_FILE) -> List[str]:
    """Remove the files of workers that are gone (killed, crashed, their
    driver lost) and older than ``stale_after``; the paths removed. A file
    is a process's when its name matches ``owned`` (group 1: the pid). A live
    pid keeps its files unless it started after them (a reused pid)."""
    removed: List[str] = []
    try:
        names = os.listdir(scratch_dir)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        found = owned.match(name)
        path = os.path.join(scratch_dir, name)
        try:
            written = os.lstat(path).st_mtime
        except OSError:
            continue
        if found is None or now - written < stale_after:
            continue
        started = _start_time(int(found.group(1)))
        if started is None or started > written:
            try:
                os.remove(path)
                removed.append(path)
            except OSError:
                pass  # another user's, or removed meanwhile
    return removed


def _start_time(pid: int) -> Optional[float]:
    """When ``pid`` started (seconds since the epoch); None when no such process lives."""
    if not _alive(pid):
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            ticks = int(stat.read().rpartition(")")[2].split()[19])
        with open("/proc/stat") as boot:
            booted = next(int(line.split()[1]) for line in boot if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0  # alive, start unknown: kept
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def read_evidence(evidence: WorkerEvidence, lines: int = TAIL_LINES) -> Tuple[Optional[str], Optional[int]]:
    """The last ``lines`` lines the process wrote to stderr, and its os._exit
    code if noted (a fatal signal it noted: minus its number)."""
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
    return send_signal(pid, getattr(signal, signal_name))


# How long removing a killed process's files waits for it to be gone.
GONE_TIMEOUT_S = 5.0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"  # a zombie writes nothing more
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return not os.path.isdir("/proc")  # /proc is there and has no such process: gone


# tgkill's system call number per machine: a signal for a process's main thread.
_TGKILL = {"x86_64": 234, "aarch64": 131, "ppc64le": 250, "s390x": 241}


def send_signal(pid: int, signum: int) -> bool:
    """Signal ``pid``'s main thread, where Python runs signal handlers.

    A worker process has many threads (Ray's, gloo's); a signal sent to the
    process may land on any of them, and a main thread blocked in a wait
    would then not run the script's handler until it wakes. A launcher's
    child (torchrun's) sees the signal at once; this does the same."""
    number = _TGKILL.get(platform.machine())
    if number is not None:
        try:
            if ctypes.CDLL(None, use_errno=True).syscall(number, pid, pid, signum) == 0:
                return True
        except (OSError, AttributeError):
            pass  # no tgkill here: the process as a whole gets it
    try:
        os.kill(pid, signum)
    except OSError:
        return False
    return True


class NodeAgent:
    """What reads a group's evidence on one node, dumps its ranks' stacks,
    forwards signals and warns them of a preemption (a hung rank cannot
    answer for itself). On the driver's node the driver does this itself
    with a plain instance; elsewhere it is a light actor (no torch, no
    resources), started once the group is up: a draining node accepts no
    new actors, so it must be there before a drain."""

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

    def signal(self, requests: List[Tuple[int, int, WorkerEvidence]], signum: int) -> Dict[int, bool]:
        return {rank: send_signal(pid, signum) for rank, pid, _ in requests}

    def remove(self, requests: List[Tuple[int, int, WorkerEvidence]]) -> Dict[int, bool]:
        """Remove what killed processes left, once they are gone (a dying one may still note its signal)."""
        deadline = time.monotonic() + GONE_TIMEOUT_S
        for _, pid, evidence in requests:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)  # waiting for the kernel to reap a process Ray is killing
            remove_evidence(evidence)
        return {rank: True for rank, _, _ in requests}

    def preempt(self, requests: List[Tuple[int, int, WorkerEvidence]], deadline: float, signal_name: Optional[str]) -> Dict[int, bool]:
        return {rank: warn_of_preemption(pid, evidence, deadline, signal_name) for rank, pid, evidence in requests}
