"""A run's timeline: the trace file (valid JSON when closed, loadable when the
driver died mid-run, bounded), and what the engine writes into it for a run
on the fake cluster where a rank crashes and a spare takes its place."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List

import pytest

from raydist.config import RunConfig
from raydist.pool.driver.calls import prepare_call
from raydist.pool.driver.controller import RunController, run_call
from raydist.pool.timeline import CATEGORIES, SpanBuffer, Timeline
from raydist.testing.fake import FakeCluster, Fault
from raydist.testing.workers import current_attempt, current_rank

NODES = {"node-a": {"CPU": 2}, "node-b": {"CPU": 2}, "node-c": {"CPU": 1}}


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="raydist")


def events(path: Path) -> List[Dict[str, Any]]:
    found = json.loads(path.read_text())
    assert isinstance(found, list)
    for event in found:
        assert {"ph", "name", "pid"} <= set(event), event
        if event["ph"] != "M":
            assert {"ts", "tid", "cat"} <= set(event) and event["cat"] in CATEGORIES, event
        if event["ph"] == "X":
            assert event["dur"] >= 0, event
    return found


def test_the_file_is_json_when_closed_and_loadable_when_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), clock=lambda: 100.0)
    timeline.span("call", "call", 99.0, 100.0, rank=3, node="node-a", attempt=0)
    timeline.instant("rank 3 failed", "failure", rank=3, node="node-a", cause="boom")
    cut = path.read_text()  # what a driver killed now leaves
    found = json.loads(cut.rstrip().rstrip(",") + "]")
    assert [e["name"] for e in found if e["ph"] != "M"] == ["call", "rank 3 failed"]
    timeline.phase("running")
    timeline.phase("closed")  # the run's last phase ends the array
    closed = events(path)
    span = next(e for e in closed if e["name"] == "call")
    assert span["ts"] == 99_000_000 and span["dur"] == 1_000_000 and span["args"] == {"attempt": 0, "rank": 3, "node": "node-a"}
    rows = {(e["pid"], e.get("tid")): e["args"]["name"] for e in closed if e["name"] in ("process_name", "thread_name")}
    assert rows[(1, None)] == "node node-a" and rows[(1, 4)] == "rank 3" and rows[(0, 0)] == "driver"
    timeline.instant("late", "call")  # after the close: nothing written, the file stays valid
    assert events(path) == closed


def test_a_calls_events_are_written_together_at_the_end_of_its_batch(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), clock=lambda: 1.0)
    before = path.read_text()
    with timeline.batch():
        timeline.span("call", "call", 0.0, 1.0, rank=0, node="node-a")
        with timeline.batch():  # another thread's call ending meanwhile
            timeline.span("call", "call", 0.0, 1.0, rank=1, node="node-a")
        assert path.read_text() == before  # nothing yet: one write when the last batch ends
    found = json.loads(path.read_text().rstrip().rstrip(",") + "]")
    assert [e["args"]["rank"] for e in found if e["ph"] == "X"] == [0, 1]


def test_a_full_timeline_says_so_and_stays_valid(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), clock=lambda: 1.0, max_bytes=2_000)
    for step in range(100):
        timeline.span("call", "call", 0.0, 1.0, rank=step % 4, node="node-a", step=step)
    timeline.close()
    found = events(path)
    assert found[-1]["name"] == "timeline full: later events dropped"
    assert path.stat().st_size < 2_200 and 5 < len(found) < 100


def test_off_it_writes_nothing_and_a_rank_sends_nothing(tmp_path: Path) -> None:
    timeline = Timeline(None)
    timeline.span("call", "call", 0.0, 1.0, rank=0, node="node-a")
    timeline.phase("closed")
    assert list(tmp_path.iterdir()) == []
    spans = SpanBuffer(limit=2)
    spans.add("start", "start", 0.0, 1.0)  # start-up steps are kept with the timeline off (the run's summary shows them)
    spans.add("call", "call", 1.0, 2.0)  # and a call's (the worker sends only those of 10 ms or more)
    spans.waited("waiting for data", "data", 2.0, 2.5)  # a wait is summed, not kept as a span
    spans.waited("waiting for data", "data", 3.0, 3.25)
    assert spans.take() == ((("start", "start", 0.0, 1.0, {}), ("call", "call", 1.0, 2.0, {})), (("data", 0.75),))
    assert spans.take() == ((), ())  # a warm call with nothing to say sends nothing
    spans.switch(True)
    for _ in range(3):
        spans.add("init", "init", 1.0, 2.0)
    assert spans.take() == ((("init", "init", 1.0, 2.0, {}),) * 2, ()) and spans.take() == ((), ())  # at most ``limit`` kept


def test_a_crash_with_a_spare_is_on_the_timeline_in_the_summary_and_the_figures(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    # Rank 2 dies; ranks 0 and 3 fail in the same call, as peers of a dead rank do in their collective.
    cluster = FakeCluster(NODES, [Fault("execute", "die", who=2), Fault("execute", "raise", who=0), Fault("execute", "raise", who=3)])
    config = RunConfig(num_workers=4, max_restarts=1, spare_workers=1, flight_recorder=False, timeline=str(path))
    values = run_call(
        RunController(cluster, config, fresh_restarts=True), prepare_call(cluster, lambda: (current_rank(), current_attempt()))
    )
    assert values == [(rank, 1) for rank in range(4)]
    found = events(path)
    moments = [e for e in found if e["ph"] != "M"]
    failed = next(i for i, e in enumerate(moments) if e["cat"] == "failure")
    assert moments[failed]["args"]["rank"] == 2 and moments[failed]["args"]["attempt"] == 0
    assert "process died" in moments[failed]["args"]["cause"] and moments[failed]["args"]["root_cause"] is True
    assert moments[failed]["name"] == "rank 2 failed (root cause)"
    # The ranks it stopped are told apart from it, each naming it.
    stopped = [e for e in moments if e["cat"] == "stopped"]
    assert sorted((e["args"]["rank"], e["args"]["root_cause"], e["args"]["root_rank"]) for e in stopped) == [(0, False, 2), (3, False, 2)]
    assert all(e["name"] == f"rank {e['args']['rank']} stopped: rank 2 failed" for e in stopped)
    spare = next(i for i, e in enumerate(moments) if e["cat"] == "spare")
    # The new world is ranked by node: the spare (node-c) is rank 3, and the old rank 3 (node-b) rank 2.
    pids = {e["args"]["rank"]: e["args"]["pid"] for e in moments[:failed] if e["cat"] == "call"}
    assert spare > failed and moments[spare]["name"] == f"a spare (pid {moments[spare]['args']['pid']}) is rank 3"
    renumbered = [(e["args"]["rank"], e["args"]["was_rank"], e["args"]["pid"]) for e in moments if e["name"].endswith(f"(pid {pids[3]})")]
    assert renumbered == [(2, 3, pids[3])]
    ready = next(e for e in moments if e["name"].startswith("world 1 ready"))
    assert ready["args"]["processes"] == {"0": pids[0], "1": pids[1], "2": pids[3], "3": moments[spare]["args"]["pid"]}
    calls = [e for e in moments[spare:] if e["cat"] == "call"]
    assert sorted(e["args"]["rank"] for e in calls) == [0, 1, 2, 3] and {e["args"]["attempt"] for e in calls} == {1}
    first = [e for e in moments[:failed] if e["cat"] == "call"]
    assert {e["args"]["rank"]: e["args"]["ended"] for e in first} == {0: "failed", 1: "finished", 2: "failed", 3: "failed"}
    phases = [e["name"] for e in moments if e["cat"] == "controller"]
    assert phases == ["starting", "running", "restarting", "running", "shutting_down"]
    assert [e["cat"] for e in moments if e["cat"] in ("placement", "start")][:2] == ["placement", "start"]
    assert cluster.leftovers() == []
    # The run's summary: the two attempts, how each ended, and the new world's ranks.
    summary = values.summary
    assert [(a.number, a.size, a.ended) for a in summary.attempts] == [(0, 4, summary.attempts[0].ended), (1, 4, "succeeded")]
    assert summary.attempts[0].ended.startswith("rank 2 failed (root cause): process died") and summary.attempts[1].after_fault is not None
    assert summary.attempts[0].ended.endswith("; ranks 0, 3 stopped by it")
    # Its figures, for Ray's metrics: one warm restart, and how long it took.
    assert [(name, tags) for name, _, tags in cluster.recorded] == [
        ("raydist_recovery_seconds", {}),
        ("raydist_restarts", {"kind": "warm"}),
    ]
    table = str(summary)
    assert "attempt 1, by rank" in table and table.count("\n  3 ") == 1 and "slowest rank: none" in table
