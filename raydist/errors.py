"""Errors a worker group raises, with enough detail to act on.

A failure names the rank, node and pid, and carries either the remote
traceback or how the process died. The earliest failure is the root cause
(torchrun's rule); identical tracebacks on many ranks are printed once.
"""

from __future__ import annotations

import copy
import copyreg
import enum
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, TypeVar


class CallEnd(enum.Enum):
    """How a call (or a start-up step) on a worker group ended."""

    FINISHED = "finished"
    RANK_FAILED = "rank failed"  # a rank's code raised or exited non-zero, or its process died
    NODE_LOST = "node lost"  # the root cause is a rank whose node died or left the cluster
    DRAINED = "drained"  # ranks on a node Ray was draining failed: a preemption
    GROW = "room to grow"  # raydist stopped the group to restart it larger (restart_to_grow)
    REPLACED = "straggler replaced"  # raydist killed a straggler to put a spare in its place (straggler_action)
    TIMED_OUT = "timed out"
    CANCELLED = "cancelled"  # WorkerFuture.cancel()
    SHUT_DOWN = "shut down"  # the group or Ray was shut down while the call ran


@dataclass(frozen=True)
class CollectiveEntry:
    """One collective in a rank's flight recorder (torch's ``_dump_fr_trace``)."""

    group: str  # the process group's name ("0": the default group)
    seq: int  # collective_seq_id: the n-th collective of that group on this rank
    op: str  # "all_reduce", "broadcast", ...
    shapes: Tuple[Tuple[int, ...], ...]  # input sizes
    dtypes: Tuple[str, ...]  # input dtypes, as torch names them ("float32")
    created_ns: int  # when the rank entered it, by its own wall clock
    completed: bool  # torch retired it: the rank left it
    failed: bool = False  # the rank's call raised inside it (a process group timeout, a peer gone)


def ranks_text(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"."""
    spans: List[str] = []
    ordered = sorted(ranks)
    start = prev = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(spans)


_E = TypeVar("_E", bound="RaydistError")


class RaydistError(Exception):
    """The base of every error raydist raises about a run (each also keeps the
    built-in base it always had, so existing ``except`` clauses still catch it)."""

    # How the call ended, as the group classified it (see raydist.pool.rules.policy).
    end: Optional[CallEnd] = None
    # The group replaced its failed ranks before raising: it takes calls again.
    restarted_in_place: bool = False
    # Where the run's time went, to the end (``RunSummary``; raydist.run's errors).
    summary: Optional[Any] = None

    def __reduce__(self) -> Tuple[Any, ...]:
        # Subclasses take other arguments than the message they pass to
        # Exception, so the default (``cls(*args)``) cannot rebuild them:
        # pickle's own protocol instead, the message and fields as they were.
        return (copyreg.__newobj__, (type(self),), {**self.__dict__, "args": self.args})  # type: ignore[attr-defined]

    def with_summary(self: _E, summary: Any) -> _E:
        """This error with the run's summary (a copy: an error raised once never changes)."""
        told = copy.copy(self)
        told.summary = summary
        return told

    def restarted_as(self: _E, attempt: int) -> _E:
        """This error as a call of a world restarted in place as ``attempt`` tells
        it (attribute and message; a copy: an error raised once never changes)."""
        told = copy.copy(self)
        told.restarted_in_place = True
        first = str(self.args[0]) if self.args else ""
        told.args = (f"{first}\n(the group restarted in place: attempt {attempt} runs and takes calls)", *self.args[1:])
        return told


@dataclass(frozen=True)
class WorkerFailure:
    """One rank that failed."""

    rank: int
    node_id: str
    node_ip: str
    pid: int
    timestamp: float
    traceback: Optional[str] = None  # set when the user's code raised
    exit_code: Optional[int] = None  # set when the code called sys.exit(n != 0)
    died: Optional[str] = None  # set when the process died (killed, crashed)
    exception_type: Optional[str] = None
    output: Optional[str] = None  # the last lines a dead process wrote to stderr
    collectives: Optional[Tuple[CollectiveEntry, ...]] = None  # its last collectives, when it failed inside one

    @property
    def crashed(self) -> bool:
        """The process died, as opposed to raising or exiting."""
        return self.died is not None

    @property
    def placed(self) -> bool:
        """Whether it had reported where it runs (before that, ``rank`` is its worker's number)."""
        return self.pid >= 0

    def who(self) -> str:
        """``rank 3 on node ab12 (10.0.0.2), pid 4711``, or ``worker 3 before it reported where it runs``."""
        if not self.placed:
            return f"worker {self.rank} before it reported where it runs"
        return f"rank {self.rank} on node {self.node_id[:12]} ({self.node_ip}), pid {self.pid}"

    def summary(self) -> str:
        """The cause in one line: the exception line of a traceback, the exit
        status, or how the process died (not the last line it printed)."""
        if self.traceback is not None:
            lines = [line for line in self.traceback.strip().splitlines() if line.strip()]
            return lines[-1].strip() if lines else "raised"
        if self.exit_code is not None:
            return f"exited with status {self.exit_code}"
        return f"process died: {self.died}"

    def describe(self) -> str:
        if self.traceback is not None:
            return self.traceback.rstrip()
        if self.exit_code is not None:
            return f"exited with status {self.exit_code}"
        text = f"process died: {self.died}"
        if self.output:
            text += "\nits last lines on stderr:\n" + "\n".join("  | " + line for line in self.output.splitlines())
        elif self.output is not None:
            text += "\n(it wrote nothing to stderr)"
        return text


def format_failures(failures: Sequence[WorkerFailure], root: WorkerFailure) -> str:
    """Failures grouped by identical detail, the root cause first."""
    groups: Dict[str, List[WorkerFailure]] = {}
    for failure in sorted(failures, key=lambda f: (f is not root, f.rank)):
        groups.setdefault(failure.describe(), []).append(failure)
    lines = []
    for detail, members in groups.items():
        ranks = sorted(m.rank for m in members)
        where = "; ".join(sorted({f"node {m.node_id[:12]} ({m.node_ip})" for m in members}))
        pids = ", ".join(str(m.pid) for m in members)
        tag = " [root cause]" if root in members else ""
        if all(m.placed for m in members):
            lines.append(f"--- {ranks_text(ranks)}{tag} on {where}, pid {pids}:")
        else:  # start-up failed before the workers said where they run: no ranks yet
            lines.append(f"--- worker(s) {', '.join(map(str, ranks))}{tag}, before they reported where they run:")
        lines.append(detail)
    return "\n".join(lines)


def root_cause(failures: Sequence[WorkerFailure]) -> WorkerFailure:
    """The earliest failure, except that a process death wins: peers of a
    dead rank fail in their collectives *because* of it."""
    return min(failures, key=lambda f: (not f.crashed, f.timestamp, f.rank))


class WorkerGroupError(RaydistError, RuntimeError):
    """One or more ranks failed; the whole group was torn down."""

    def __init__(
        self,
        failures: Sequence[WorkerFailure],
        attempts: Sequence[BaseException] = (),
        preempted_nodes: Sequence[str] = (),
        collectives: str = "",
    ):
        if not failures:
            raise ValueError("a WorkerGroupError needs at least one failure")
        # Nodes of failed ranks that Ray was draining: a preemption, not a fault.
        self.preempted_nodes: List[str] = list(preempted_nodes)
        self.failures: List[WorkerFailure] = sorted(failures, key=lambda f: f.rank)
        self.root_cause: WorkerFailure = root_cause(failures)
        self.attempts: Tuple[BaseException, ...] = tuple(attempts)  # earlier attempts' errors, oldest first
        # Where every rank was in its collectives (flight recorder), when a rank failed inside one.
        self.collectives = collectives
        super().__init__(self._message())

    @property
    def failed_ranks(self) -> List[int]:
        return [f.rank for f in self.failures]

    @property
    def crashed(self) -> bool:
        """The root cause is a process that died, not code that raised."""
        return self.root_cause.crashed

    def _message(self) -> str:
        root = self.root_cause
        head = f"{len(self.failures)} rank(s) failed: {self.failed_ranks}; root cause: {root.who()}"
        if not root.placed:
            head = f"{len(self.failures)} worker(s) failed while starting: {self.failed_ranks}; root cause: {root.who()}"
        parts = [head]
        if self.attempts:
            parts.append(f"after {len(self.attempts) + 1} attempts; earlier root causes:")
            for number, attempt in enumerate(self.attempts):
                parts.append(f"  attempt {number}: {_attempt_summary(attempt)}")
        if self.collectives:
            parts.append(COLLECTIVES_HEADER + "\n" + _indent(self.collectives))
        parts.append(format_failures(self.failures, root))
        return "\n".join(parts)


COLLECTIVES_HEADER = "where the ranks were in their collectives (flight recorder):"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _attempt_summary(error: BaseException) -> str:
    if isinstance(error, WorkerGroupError):
        preempted = " (preempted)" if error.preempted_nodes else ""
        return f"rank {error.root_cause.rank}{preempted}: {error.root_cause.summary()}"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


class WorkerGroupStopped(RaydistError, RuntimeError):
    """raydist stopped the group itself: the cluster has room for more of an
    elastic group's workers (``restart_to_grow``); ``raydist.run`` restarts it larger."""


class WorkerGroupClosed(RaydistError, RuntimeError):
    """The group (or the Ray it ran in) was shut down while a call ran."""


class WorkerGroupTimeout(RaydistError, TimeoutError):
    """The call did not finish in time; the group was torn down."""

    def __init__(self, timeout: float, unfinished_ranks: Sequence[int], stacks: str = "", collectives: str = ""):
        self.timeout = timeout
        self.unfinished_ranks: List[int] = sorted(unfinished_ranks)
        self.stacks = stacks  # where each unfinished rank was, grouped (see WorkerGroup.stacks)
        self.collectives = collectives  # where every rank was in its collectives (flight recorder)
        message = f"timed out after {timeout:g} s; {ranks_text(self.unfinished_ranks)} had not finished"
        if collectives:
            message += "\n" + COLLECTIVES_HEADER + "\n" + _indent(collectives)
        if stacks:
            message += "\nwhere they were:\n" + stacks
        super().__init__(message)


class WorkerCallCancelled(RaydistError, CancelledError):
    """The call was cancelled (``WorkerFuture.cancel``); its group was shut down."""


class InfeasibleResourcesError(RaydistError, RuntimeError):
    """The cluster cannot (or did not in time) provide the requested workers."""


class UnhealthyWorkers(InfeasibleResourcesError):
    """The pre-flight check left too few healthy workers in a placement; their
    nodes are excluded, and the run places its workers again without them."""


class WorkerStartupTimeout(RaydistError, TimeoutError):
    """The workers did not start or initialise within ``startup_timeout``
    (as opposed to a call that ran too long); the group was torn down."""

    def __init__(self, timeout: float, stage: str, total: int, still_waiting: Sequence[str]):
        self.timeout = timeout
        self.stage = stage
        self.still_waiting: List[str] = list(still_waiting)
        doing = {"started": "starting", "initialised": "initialising"}.get(stage, f"not {stage}")
        super().__init__(
            f"start-up timed out: {total - len(still_waiting)} of {total} workers {stage} after "
            f"{timeout:g} s; {', '.join(still_waiting)} still {doing}"
        )
