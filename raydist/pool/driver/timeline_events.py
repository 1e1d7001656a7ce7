"""What the engine records of a run as it goes: in its timeline
(``raydist.pool.timeline``), each rank's span of each call (its own, sent
with its result, or the driver's view of a rank that never sent one),
failures with their cause, lost nodes, and the worlds a restart builds,
spares named; in its summary (``summary.RunSummary``), the same calls and
worlds, timed."""

from __future__ import annotations

from typing import Collection, Dict, Sequence

from raydist.errors import WorkerFailure, root_cause
from raydist.pool.driver.attempt import Attempt
from raydist.pool.driver.waiting import Waited
from raydist.pool.records import WorkerInfo
from raydist.pool.rules.explain import NODE_LOST_TEXT


def call_ended(attempt: Attempt, number: int, sent_at: float, waited: Waited, failures: Sequence[WorkerFailure]) -> None:
    """Call ``number`` on ``attempt`` ended as ``waited`` says (``failures``: its failed ranks, deaths explained)."""
    with attempt.timeline.batch():  # every rank's events in one write
        _call_ended(attempt, number, sent_at, waited, failures)


def _call_ended(attempt: Attempt, number: int, sent_at: float, waited: Waited, failures: Sequence[WorkerFailure]) -> None:
    timeline = attempt.timeline
    now, failed = timeline.now(), {failure.rank: failure for failure in failures}
    ran: Dict[int, float] = {}
    for worker in attempt.workers:
        rank, own = worker.rank, waited.spans.get(worker.rank, ())
        timeline.spans(own, rank, worker.node_id, attempt=attempt.number, pid=worker.pid)
        call = next(((start, end) for _, cat, start, end, _ in own if cat == "call"), None)
        if call is not None:
            ran[rank] = call[1] - call[0]
            continue
        failure = failed.get(rank)  # a rank that died, or whose result could not come back, sent no span of its own
        end = failure.timestamp if failure is not None and failure.timestamp >= sent_at else now
        ran[rank] = end - sent_at
        if timeline.on:
            ended = "failed" if failure else "not finished" if rank in waited.pending else "finished"
            timeline.span(
                "call", "call", sent_at, end, rank, worker.node_id, attempt=attempt.number, pid=worker.pid, call=number, ended=ended
            )
    attempt.summary.call_ended(attempt.number, ran, waited.spans, waited.waits, failures)
    if not timeline.on:
        return
    if not failures:
        return
    lost = set()
    root = root_cause(failures)
    for failure in failures:
        at = failure.timestamp or now
        if failure is root:
            name, cat = f"rank {failure.rank} failed (root cause)", "failure"
        else:  # its failure followed from the root cause's (gloo's "Connection closed by peer")
            name, cat = f"rank {failure.rank} stopped: rank {root.rank} failed", "stopped"
        timeline.instant(
            name,
            cat,
            at,
            failure.rank,
            failure.node_id or None,
            attempt=attempt.number,
            pid=failure.pid,
            cause=failure.summary(),
            root_cause=failure is root,
            root_rank=root.rank,
        )
        if failure.died == NODE_LOST_TEXT and failure.node_id not in lost:
            lost.add(failure.node_id)
            timeline.instant(f"node {failure.node_id[:12]} lost", "node", at, attempt=attempt.number, node=failure.node_id)


def late_results(attempt: Attempt, late: Waited) -> None:
    """What ranks of ``attempt`` sent with a result that came back only while a
    warm restart settled them (their start-up, their waits): kept as a
    result's are, so a kept process's start is not lost."""
    if not late.spans and not late.waits:
        return
    with attempt.timeline.batch():
        for worker in attempt.workers:
            if worker.rank in late.spans:
                attempt.timeline.spans(late.spans[worker.rank], worker.rank, worker.node_id, attempt=attempt.number, pid=worker.pid)
    attempt.summary.call_ended(attempt.number, {}, late.spans, late.waits, [])


def world_ready(attempt: Attempt, old: Sequence[WorkerInfo] = (), spare_pids: Collection[int] = ()) -> None:
    """``attempt`` is set up: an instant on the driver's row; a spare that took a
    rank's place, on that rank's row."""
    timeline = attempt.timeline
    attempt.summary.world_ready(attempt.number, attempt.workers, timeline.now())
    if not timeline.on:
        return
    was = {worker.pid: worker.rank for worker in old}  # a kept process's rank in the world before
    what = "restart" if attempt.number else "start"
    # Which process holds which rank: a restart may renumber the kept ones.
    processes = {str(worker.rank): worker.pid for worker in attempt.workers}
    timeline.instant(
        f"world {attempt.number} ready ({attempt.size} ranks)", what, attempt=attempt.number, size=attempt.size, processes=processes
    )
    for worker in attempt.workers:
        rank, pid = worker.rank, worker.pid
        if pid in spare_pids:
            name, cat = f"a spare (pid {pid}) is rank {rank}", "spare"
        elif old and pid not in was:
            name, cat = f"rank {rank} in a new process (pid {pid})", "restart"
        elif old and was[pid] != rank:
            name, cat = f"rank {rank} is the old rank {was[pid]} (pid {pid})", "restart"
        else:
            continue
        timeline.instant(name, cat, rank=rank, node=worker.node_id, attempt=attempt.number, pid=pid, was_rank=was.get(pid))
