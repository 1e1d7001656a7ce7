"""What the engine puts in a run's timeline (``raydist.pool.timeline``): each
rank's span of each call (its own, sent with its result, or the driver's view
of a rank that never sent one), failures with their cause, and the worlds a
restart builds, spares named."""

from __future__ import annotations

from typing import Collection, Sequence

from raydist.errors import WorkerFailure
from raydist.pool.driver.waiting import Waited
from raydist.pool.driver.world import World
from raydist.pool.records import WorkerInfo
from raydist.pool.timeline import Timeline


def call_ended(timeline: Timeline, world: World, number: int, sent_at: float, waited: Waited, failures: Sequence[WorkerFailure]) -> None:
    """Call ``number`` on ``world`` ended as ``waited`` says (``failures``: its failed ranks, deaths explained)."""
    if not timeline.on:
        return
    now, failed = timeline.now(), {failure.rank: failure for failure in failures}
    for worker in world.workers:
        rank, own = worker.rank, waited.spans.get(worker.rank, ())
        timeline.spans(own, rank, worker.node_id, attempt=world.attempt, pid=worker.pid)
        if any(cat == "call" for _, cat, *_ in own):
            continue
        failure = failed.get(rank)  # a rank that died, or whose result could not come back, sent no span of its own
        ended = "failed" if failure else "not finished" if rank in waited.pending else "finished"
        end = failure.timestamp if failure is not None and failure.timestamp >= sent_at else now
        timeline.span("call", "call", sent_at, end, rank, worker.node_id, attempt=world.attempt, pid=worker.pid, call=number, ended=ended)
    for failure in failures:
        timeline.instant(
            f"rank {failure.rank} failed",
            "failure",
            failure.timestamp or now,
            failure.rank,
            failure.node_id or None,
            attempt=world.attempt,
            cause=failure.summary(),
        )


def world_ready(timeline: Timeline, world: World, old: Sequence[WorkerInfo] = (), spare_pids: Collection[int] = ()) -> None:
    """``world`` is set up: an instant on the driver's row; a spare that took a
    rank's place, on that rank's row."""
    if not timeline.on:
        return
    kept = {worker.pid for worker in old}
    what = "restart" if world.attempt else "start"
    timeline.instant(f"world {world.attempt} ready ({world.size} ranks)", what, attempt=world.attempt, size=world.size)
    for worker in world.workers:
        if worker.pid in spare_pids:
            timeline.instant(
                f"a spare is rank {worker.rank}", "spare", rank=worker.rank, node=worker.node_id, attempt=world.attempt, pid=worker.pid
            )
        elif old and worker.pid not in kept:
            timeline.instant(
                f"rank {worker.rank} in a new process", "restart", rank=worker.rank, node=worker.node_id, attempt=world.attempt
            )
