"""``RunSummary``: where a run's time went, as one table at its end.

Kept for every run, timeline or not, from what the engine already learns:
each world as it is ready (how long after the fault that ended the one
before), each call's end (every rank's own start-up steps and its waits for
data and for ``save_state`` / ``load_state``, sent with its result), and the
straggler watch's reading of the flight recorders (each rank's seconds
waiting in collectives for the last rank to arrive, and the rank that
arrives late). ``raydist run`` prints the table when the run ends, success
or not, as torchrun prints its end summary; the API returns it
(``raydist.run(...).summary``, ``WorkerGroup.summary()``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from raydist.errors import WorkerFailure, ranks_text, root_cause
from raydist.pool.records import WorkerInfo
from raydist.pool.rules.stragglers import Straggler


@dataclass
class RankTimes:
    """One rank of one attempt: seconds in each part of its life."""

    rank: int
    node: str
    pid: int
    start: Optional[float] = None  # process start and imports (a kept process: its first start)
    init: Optional[float] = None  # launcher environment and process group
    run: float = 0.0  # the calls
    waits: Dict[str, float] = field(default_factory=dict)  # "collective", "data", "state"

    def share(self, kind: str) -> Optional[float]:
        return self.waits[kind] / self.run if self.run > 0 and kind in self.waits else None


@dataclass
class HealthFigures:
    """A pre-flight check: the workers' compute figures (median, lowest), the
    world's all_reduce bandwidth, and the nodes excluded with why."""

    workers: int
    median_gflops: Optional[float]
    lowest_gflops: Optional[float]
    seconds: float  # the probes' round trip
    excluded: Dict[str, str] = field(default_factory=dict)  # node id -> why
    allreduce_gbps: Optional[float] = None


@dataclass
class AttemptTimes:
    """One attempt: its world, how it ended, how soon it ran after the fault before it."""

    number: int
    size: int
    ready_at: float
    after_fault: Optional[float] = None  # the fault that ended the attempt before -> this world set up
    first_step_after_fault: Optional[float] = None  # the fault -> this world's first collective
    ended: str = "running"
    ranks: Dict[int, RankTimes] = field(default_factory=dict)


class RunSummary:
    """A run's attempts and ranks, filled as it goes (thread-safe); ``table`` at the end."""

    def __init__(self) -> None:
        self.attempts: List[AttemptTimes] = []
        self.slowest: Optional[Straggler] = None  # the late rank, of the last attempt that had one
        self.health: List[HealthFigures] = []  # each pre-flight check, in order
        self._fault_at: Optional[float] = None
        self._started: Dict[int, float] = {}  # a process's start, by pid: a kept process started once
        self._held_by: Dict[int, List[RankTimes]] = {}  # each process's rank in every world it was in
        self._lock = threading.Lock()

    # -- a value to keep: pickled, copied and compared without its lock ---------
    def __getstate__(self) -> Dict[str, Any]:
        with self._lock:
            return {name: value for name, value in vars(self).items() if name != "_lock"}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunSummary):
            return NotImplemented
        return self.__getstate__() == other.__getstate__()

    __hash__ = None  # type: ignore[assignment]  # it changes as the run goes

    # -- what the engine tells it ----------------------------------------------
    def world_ready(self, attempt: int, workers: Sequence[WorkerInfo], now: float) -> None:
        with self._lock:
            times = AttemptTimes(attempt, len(workers), now, None if self._fault_at is None else now - self._fault_at)
            times.ranks = {w.rank: RankTimes(w.rank, w.node_id, w.pid, self._started.get(w.pid)) for w in workers}
            for own in times.ranks.values():
                self._held_by.setdefault(own.pid, []).append(own)
            self.attempts.append(times)

    def call_ended(
        self,
        attempt: int,
        ran: Mapping[int, float],
        spans: Mapping[int, Sequence[Any]],
        waits: Mapping[int, Sequence[Tuple[str, float]]],
        failures: Sequence[WorkerFailure],
    ) -> None:
        """A call of ``attempt`` ended: ``ran`` each rank's seconds in it,
        ``spans`` / ``waits`` what each rank sent (``SpanBuffer.take``)."""
        with self._lock:
            times = self._attempt(attempt)
            if times is None:
                return
            for rank in {*ran, *spans, *waits}:
                own = times.ranks.get(rank)
                if own is None:
                    continue
                own.run += ran.get(rank, 0.0)
                for _, cat, start, end, _ in spans.get(rank, ()):
                    if cat == "init":
                        own.init = end - start
                    elif cat == "start":
                        self._process_started(own.pid, end - start)
                for kind, waited in waits.get(rank, ()):
                    own.waits[kind] = own.waits.get(kind, 0.0) + waited
            if failures:
                first = min(failures, key=lambda failure: failure.timestamp or float("inf"))
                self._fault_at = first.timestamp or None
                root = root_cause(failures)  # not the first by the clock: peers of a dead rank may fail before it is seen
                stopped = sorted(f.rank for f in failures if f is not root)
                times.ended = f"rank {root.rank} failed (root cause): {root.summary()}"
                if stopped:
                    times.ended += f"; {ranks_text(stopped)} stopped by it"

    def _process_started(self, pid: int, seconds: float) -> None:
        """Process ``pid`` took ``seconds`` to start: in every world it holds a rank in,
        a later one too (a survivor's first result may be read once the new world is up)."""
        self._started[pid] = seconds
        for times in self._held_by.get(pid, ()):
            times.start = seconds

    def collectives(self, attempt: int, waits: Mapping[int, float], first_at: Optional[float], stragglers: Sequence[Straggler]) -> None:
        """What the straggler watch of ``attempt`` read, once its world ended."""
        with self._lock:
            times = self._attempt(attempt)
            if times is None:
                return
            for rank, waited in waits.items():
                if rank in times.ranks:
                    times.ranks[rank].waits["collective"] = waited
            if times.after_fault is not None and first_at is not None:  # (the first attempt follows no fault)
                times.first_step_after_fault = first_at - (times.ready_at - times.after_fault)
            if stragglers:
                self.slowest = max(stragglers, key=lambda straggler: straggler.late_s)

    def health_checked(self, figures: HealthFigures) -> None:
        """A pre-flight check of new workers ended (``figures``)."""
        with self._lock:
            self.health.append(figures)

    def bandwidth_checked(self, gbps: float) -> None:
        """The world's pre-flight all_reduce: its bus bandwidth, with the last check's figures."""
        with self._lock:
            if self.health:
                self.health[-1].allreduce_gbps = gbps

    def ended(self, how: str) -> None:
        """The run ended: ``how`` the last attempt did (unless a failure already said)."""
        with self._lock:
            if self.attempts and self.attempts[-1].ended == "running":
                self.attempts[-1].ended = how

    def _attempt(self, number: int) -> Optional[AttemptTimes]:
        return next((a for a in reversed(self.attempts) if a.number == number), None)

    # -- the table -------------------------------------------------------------
    def table(self) -> str:
        """The summary as text: one line per attempt, one per rank of the last attempt, the slowest rank."""
        with self._lock:
            attempts, slowest, health = list(self.attempts), self.slowest, list(self.health)
        if not attempts:
            return "raydist run summary: no world was started"
        lines = [f"raydist run summary: {len(attempts)} attempt(s)"]
        rows: List[Tuple[str, ...]] = [("attempt", "world", "new world after fault", "first step after fault", "ended")]
        for a in attempts:
            rows.append((str(a.number), str(a.size), _seconds(a.after_fault), _seconds(a.first_step_after_fault), a.ended))
        lines += _columns(rows)
        last = attempts[-1]
        rows = [("rank", "node", "start", "init", "run", "in collectives", "waiting for data", "in state")]
        for times in sorted(last.ranks.values(), key=lambda t: t.rank):
            rows.append(
                (
                    str(times.rank),
                    times.node[:12],
                    _seconds(times.start),
                    _seconds(times.init),
                    _seconds(times.run),
                    _share(times, "collective"),
                    _share(times, "data"),
                    _share(times, "state"),
                )
            )
        lines += [f"attempt {last.number}, by rank (in collectives: waiting there for the last rank to arrive):"]
        lines += _columns(rows)
        if slowest is not None:
            lines.append(f"slowest rank: {slowest.line()}")
        else:
            lines.append("slowest rank: none (no rank reached collectives consistently late)")
        lines += [_health_line(check) for check in health]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def slowest_rank(self) -> Optional[int]:
        return None if self.slowest is None else self.slowest.rank


class RunResults(List[Any]):
    """``raydist.run``'s values by rank (a list), with ``summary``: where the run's time went."""

    def __init__(self, values: List[Any], summary: RunSummary):
        super().__init__(values)
        self.summary = summary


def _health_line(check: HealthFigures) -> str:
    """``health check: 5 workers, 41.2 GFLOP/s median (lowest 3.1), all_reduce 1.20 GB/s, 0.08 s; excluded node …: why``."""
    figures = "no figure" if check.median_gflops is None else f"{check.median_gflops:.3g} GFLOP/s median (lowest {check.lowest_gflops:.3g})"
    bandwidth = f", all_reduce {check.allreduce_gbps:.3g} GB/s" if check.allreduce_gbps is not None else ""
    excluded = "".join(f"; excluded node {node[:12]}: {why}" for node, why in check.excluded.items())
    return f"health check: {check.workers} worker(s), {figures}{bandwidth}, {check.seconds:.2f} s{excluded}"


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _share(times: RankTimes, kind: str) -> str:
    share = times.share(kind)
    return "-" if share is None else f"{times.waits[kind]:.2f} s ({100 * share:.0f}%)"


def _columns(rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
