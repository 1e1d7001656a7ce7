"""A run's summary: what the straggler watch reads from the ranks' flight
recorders (each rank's wait in collectives for the last rank, the late rank,
each collective on the timeline) and the table that names the slowest rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest

from raydist.errors import CollectiveEntry, WorkerFailure
from raydist.pool.driver.stragglers import StragglerWatch
from raydist.pool.driver.summary import RunSummary
from raydist.pool.records import WorkerInfo
from raydist.pool.timeline import Timeline
from raydist.testing.fake import FakeCluster

LATE_NS = 50_000_000  # rank 2 enters every collective 50 ms after the others
STEP_NS = 200_000_000


def worker(rank: int) -> WorkerInfo:
    return WorkerInfo(rank, rank, 3, 1, 0, 1, f"node-{rank}", "10.0.0.1", 100 + rank, (), (), None, rank)


class Recorders:
    """Stands in for the node agents: every rank's last collectives, ``steps`` of them so far."""

    connected = True

    def __init__(self) -> None:
        self.steps = 0

    def ask(self, workers: Sequence[WorkerInfo], ranks: Sequence[int], method: str, *args: Any, **options: Any) -> Dict[int, Any]:
        assert method == "collectives"
        return {rank: [self.entry(rank, seq) for seq in range(max(0, self.steps - 64), self.steps)] for rank in ranks}

    @staticmethod
    def entry(rank: int, seq: int) -> CollectiveEntry:
        late = LATE_NS if rank == 2 else 0
        return CollectiveEntry("0", seq, "all_reduce", ((32, 8),), ("float32",), 10**18 + seq * STEP_NS + late, True)


def test_the_watch_sums_each_ranks_wait_once_and_names_the_late_rank(tmp_path: Path) -> None:
    recorders, path = Recorders(), tmp_path / "t.json"
    timeline = Timeline(str(path))
    watch = StragglerWatch([worker(r) for r in range(3)], recorders, FakeCluster({"n": {"CPU": 3}}), timeline=timeline, attempt=1)  # type: ignore[arg-type]
    for steps in (6, 12, 24):  # each poll sees the entries before it again
        recorders.steps = steps
        watch.poll()
    assert {rank: round(seconds, 6) for rank, seconds in watch.waits.items()} == {0: 1.2, 1: 1.2, 2: 0.0}
    assert [s.rank for s in watch.stragglers] == [2] and watch.first_at == 1e9
    timeline.close()
    moments = [e for e in json.loads(path.read_text()) if e.get("cat") == "collective"]
    assert len(moments) == 3 * 24  # each collective once per rank, on its row
    assert {(e["name"], e["args"]["rank"], e["args"]["attempt"]) for e in moments if e["args"]["seq"] == 5} == {
        ("all_reduce", r, 1) for r in range(3)
    }
    assert moments[0]["args"]["shapes"] == "32x8"


def test_the_table_names_the_slowest_rank_and_each_attempts_end() -> None:
    summary, workers = RunSummary(), [worker(r) for r in range(3)]
    summary.world_ready(0, workers, now=100.0)
    spans = {r: (("start", "start", 90.0, 92.5, {}), ("init", "init", 99.0, 99.5, {})) for r in range(3)}
    failure = WorkerFailure(1, "node-1", "10.0.0.1", 101, 110.0, died="killed by SIGKILL")
    summary.call_ended(0, {0: 10.0, 1: 10.0, 2: 10.0}, spans, {0: (("data", 1.0),)}, [failure])
    summary.world_ready(1, workers, now=111.0)
    summary.call_ended(1, {r: 20.0 for r in range(3)}, {}, {0: (("data", 2.0), ("state", 0.5))}, [])
    recorders = Recorders()
    recorders.steps = 24
    # The processes were kept: their recorders still hold 4 collectives of the world before.
    watch = StragglerWatch(workers, recorders, FakeCluster({"n": {"CPU": 3}}), since=1e9 + 4 * STEP_NS / 1e9)  # type: ignore[arg-type]
    watch.poll()
    summary.collectives(1, watch.waits, 111.5, watch.stragglers)
    summary.ended("succeeded")
    assert [(a.number, a.ended) for a in summary.attempts] == [
        (0, "rank 1 failed (root cause): process died: killed by SIGKILL"),
        (1, "succeeded"),
    ]
    assert summary.attempts[1].after_fault == 1.0 and summary.attempts[1].first_step_after_fault == 1.5
    ranks = summary.attempts[1].ranks
    assert ranks[0].waits == {"data": 2.0, "state": 0.5, "collective": pytest.approx(1.0)} and ranks[2].waits == {"collective": 0.0}
    assert ranks[1].start == 2.5 and ranks[1].init is None  # a kept process's start is its first; its init came with no result
    table = summary.table()
    assert summary.slowest_rank() == 2 and "slowest rank: rank 2 reaches collectives 50 ms after the others" in table
    lines: List[str] = table.splitlines()
    row = next(line for line in lines if line.split()[:2] == ["0", "node-0"])
    assert "20.00 s" in row and "1.00 s (5%)" in row and "2.00 s (10%)" in row  # run, its collective wait, its data wait
    assert any("1.00 s" in line and "1.50 s" in line and "succeeded" in line for line in lines)


def test_an_attempts_end_names_the_root_cause_not_the_first_rank_by_the_clock() -> None:
    # Rank 2 dies; ranks 0 and 3 fail in their all_reduce first (gloo sees the closed connection before Ray sees the death).
    summary, workers = RunSummary(), [worker(r) for r in range(4)]
    summary.world_ready(0, workers, now=100.0)
    peer_gone = "RuntimeError: Connection closed by peer"
    failures = [
        WorkerFailure(0, "node-0", "10.0.0.1", 100, 110.0, traceback=peer_gone),
        WorkerFailure(2, "node-2", "10.0.0.1", 102, 110.2, exit_code=None, died="exited with status 1 (os._exit)"),
        WorkerFailure(3, "node-3", "10.0.0.1", 103, 110.1, traceback=peer_gone),
    ]
    summary.call_ended(0, {r: 10.0 for r in range(4)}, {}, {}, failures)
    assert (
        summary.attempts[0].ended == "rank 2 failed (root cause): process died: exited with status 1 (os._exit); ranks 0, 3 stopped by it"
    )


def test_a_survivors_start_read_after_the_new_world_is_up_is_kept_in_both() -> None:
    # A warm restart: ranks 0 and 2 kept, rank 1 a spare. Rank 0's first result (with its start span) is read
    # only after the new world was set up, as a survivor's is when the restart settles before its result arrives.
    summary, old = RunSummary(), [worker(r) for r in range(3)]
    summary.world_ready(0, old, now=100.0)
    died = WorkerFailure(1, "node-1", "10.0.0.1", 101, 110.0, died="killed by SIGKILL")
    spans = {r: (("start", "start", 90.0, 92.0 + r, {}),) for r in (0, 2)}
    summary.call_ended(0, {0: 10.0, 2: 10.0}, {2: spans[2]}, {}, [died])
    spare = WorkerInfo(1, 1, 3, 1, 0, 1, "node-1", "10.0.0.1", 200, (), (), None, 1)
    summary.world_ready(1, [old[0], spare, old[2]], now=111.0)
    summary.call_ended(0, {}, {0: spans[0]}, {}, [])  # rank 0's first result, late: its spans only
    assert [summary.attempts[n].ranks[0].start for n in (0, 1)] == [2.0, 2.0]
    assert [summary.attempts[n].ranks[2].start for n in (0, 1)] == [4.0, 4.0]
    row = next(line for line in summary.table().splitlines() if line.split()[:2] == ["0", "node-0"])
    assert row.split()[2:4] == ["2.00", "s"]  # its start, not "-"
