"""What one rank's end of a step says: a failure record from what came back
(the user's code raised or exited, or the process died)."""

from __future__ import annotations

import re
from typing import Optional

from raydist.errors import WorkerFailure
from raydist.pool.records import Outcome, WorkerInfo


def rank_failure(
    rank: int,
    worker: Optional[WorkerInfo],
    *,
    died: Optional[str] = None,
    traceback: Optional[str] = None,
    outcome: Optional[Outcome] = None,
    now: float,
) -> WorkerFailure:
    """One failed rank: its place (``?`` before ranks are known), and the
    outcome its code reported, or the text of how it died or why its value
    could not come back; ``now``: when it was seen (the cluster's time), for
    a failure its rank did not stamp."""
    return WorkerFailure(
        rank=rank,
        node_id=worker.node_id if worker else "?",
        node_ip=worker.node_ip if worker else "?",
        pid=worker.pid if worker else -1,
        timestamp=outcome.timestamp if outcome and outcome.timestamp else now,
        traceback=outcome.traceback if outcome else traceback,
        exit_code=outcome.exit_code if outcome else None,
        died=died,
        exception_type=outcome.exception_type if outcome else None,
        collectives=outcome.collectives if outcome else None,
    )


def death_line(text: str) -> str:
    """The line of Ray's dead-actor report that says how the process ended."""
    for line in text.splitlines():
        line = line.strip()
        if "exit" in line.lower() or "signal" in line.lower() or "killed" in line.lower():
            return line
    return text.strip().splitlines()[0] if text.strip() else "the worker process died"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Ray's first line of a task's error: "ray::RayWorker.setup() (pid=..., ip=..., actor_id=..., repr=...)".
_RAY_TASK_HEADER = re.compile(r"^\s*ray::\S+.*\(pid=\d+.*\)\s*$")
_MARKERS_ONLY = re.compile(r"^[\s^~|]+$")


def step_error_text(text: str) -> str:
    """A start-up step's error as raydist reports it: Ray's text of the
    worker's exception without its colour codes, its task header (actor ids,
    which differ per rank and would keep identical failures apart) and the
    lines of only ``^``/``~`` markers; the traceback and the library's message stay."""
    lines = _ANSI.sub("", text).splitlines()
    kept = [line for line in lines if not _RAY_TASK_HEADER.match(line) and not _MARKERS_ONLY.match(line)]
    return "\n".join(kept).strip("\n")
