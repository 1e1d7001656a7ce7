"""``examples/timeline_png.py``: a timeline written by ``Timeline`` becomes a
driver row and one row per rank, spans coloured by category, moments on the
row they belong to; a PNG is written, from a closed file and from one a
killed driver left open."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Dict, List

import pytest

from raydist.pool.timeline import Timeline

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "timeline_png.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("timeline_png", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


timeline_png = _load()


def write_run(path: Path, close: bool = True) -> None:
    """A 2-rank run on two nodes: rank 0 commits a step, rank 1 fails in its
    first call, a spare takes its place, and the second world's call runs on both."""
    now: List[float] = [1000.0]
    timeline = Timeline(str(path), clock=lambda: now[0])
    timeline.phase("starting")
    timeline.span("waiting for placement", "placement", 1000.0, 1000.5)
    for rank, node in ((0, "node-a"), (1, "node-b")):
        timeline.span("start", "start", 1000.5, 1002.0, rank=rank, node=node, pid=10 + rank)
        timeline.span("init", "init", 1002.0, 1002.5, rank=rank, node=node, attempt=0)
    now[0] = 1002.5
    timeline.phase("running")
    timeline.span("call", "call", 1002.5, 1004.0, rank=0, node="node-a", attempt=0)
    timeline.instant("step 0 committed", "state", 1002.8, rank=0, node="node-a", step=0)
    timeline.span("call", "call", 1002.5, 1003.0, rank=1, node="node-b", attempt=0, ended="failed")
    timeline.instant("rank 1 failed", "failure", 1003.0, rank=1, node="node-b", attempt=0, cause="process died")
    now[0] = 1003.0
    timeline.phase("restarting")
    timeline.instant("a spare is rank 1", "spare", 1004.0, rank=1, node="node-c", attempt=1)
    timeline.instant("world 1 ready (2 ranks)", "restart", 1004.0, attempt=1, size=2)
    now[0] = 1004.0
    timeline.phase("running")
    for rank, node in ((0, "node-a"), (1, "node-c")):
        timeline.span("call", "call", 1004.0, 1006.0, rank=rank, node=node, attempt=1)
    now[0] = 1006.0
    if close:
        timeline.phase("closed")


def test_a_row_per_rank_below_the_drivers_with_moments_where_they_happened(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_run(path)
    events, complete = timeline_png.read_events(path.read_text())
    picture = timeline_png.layout(events)
    assert complete
    assert picture.rows == ("driver", "rank 0 · node node-a", "rank 1 · nodes node-b → node-c")
    assert picture.end == pytest.approx(6.0)  # seconds from the first event

    phases = [(bar.name, bar.start, bar.end) for bar in picture.bars if bar.cat == "controller"]
    assert phases == [("starting", 0.0, 2.5), ("running", 2.5, 3.0), ("restarting", 3.0, 4.0), ("running", 4.0, 6.0)]
    assert all(bar.row == 0 for bar in picture.bars if bar.cat in ("controller", "placement"))
    placement = next(bar for bar in picture.bars if bar.cat == "placement")
    assert placement.lane == 1  # inside the "starting" phase: drawn over it, thinner
    calls = sorted((bar.row, bar.start, bar.end) for bar in picture.bars if bar.cat == "call")
    assert calls == [(1, 2.5, 4.0), (1, 4.0, 6.0), (2, 2.5, 3.0), (2, 4.0, 6.0)]
    assert {bar.lane for bar in picture.bars if bar.row != 0} == {0}  # a rank's steps follow one another

    moments = {(marker.row, marker.cat): marker for marker in picture.markers}
    assert set(moments) == {(2, "failure"), (2, "spare"), (0, "restart"), (1, "state")}
    assert moments[(1, "state")].label == ""  # a small moment: a tick without a word
    assert moments[(2, "failure")].at == pytest.approx(3.0) and moments[(2, "failure")].label == "failed: the root cause"
    assert moments[(0, "restart")].label == "world 1 ready (2 ranks)"


def test_colours_follow_the_category(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_run(path)
    picture = timeline_png.layout(timeline_png.read_events(path.read_text())[0])
    by_cat: Dict[str, str] = {}
    for item in (*picture.bars, *picture.markers):
        assert by_cat.setdefault(item.cat, item.colour) == item.colour, item.cat  # one colour per category
    assert len(set(by_cat.values())) == len(by_cat)  # and a different one for each
    drawn = ["placement", "start", "init", "call", "state", "controller", "failure", "restart", "spare"]
    assert [cat for cat, _ in picture.legend] == drawn  # in the writer's order of categories
    assert timeline_png.colour("no such category") == timeline_png.UNKNOWN_COLOUR


def test_labels_close_together_on_one_row_are_stacked() -> None:
    events = [
        {"ph": "i", "name": "world 1 ready (2 ranks)", "cat": "restart", "pid": 0, "tid": 0, "ts": 0},
        {"ph": "i", "name": "SIGTERM forwarded to every rank", "cat": "signal", "pid": 0, "tid": 0, "ts": 10},
        {"ph": "X", "name": "running", "cat": "controller", "pid": 0, "tid": 0, "ts": 0, "dur": 10_000_000},
    ]
    picture = timeline_png.layout(events)
    assert [marker.level for marker in picture.markers] == [0, 1]


def test_a_png_is_written_from_a_closed_file_and_from_a_cut_short_one(tmp_path: Path) -> None:
    closed, cut = tmp_path / "closed.json", tmp_path / "cut.json"
    write_run(closed)
    write_run(cut, close=False)  # what a killed driver leaves: no closing bracket
    events, complete = timeline_png.read_events(cut.read_text())
    assert not complete and any(e.get("cat") == "failure" for e in events)
    half_line = cut.read_text() + '{"ph":"X","name":"ca'  # killed in the middle of a write
    assert timeline_png.read_events(half_line)[0] == events
    for source in (closed, cut):
        out = tmp_path / f"{source.stem}.png"
        assert timeline_png.main([str(source), str(out)]) == 0
        assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_the_root_cause_stands_apart_from_the_ranks_it_stopped_and_a_renumbered_process_is_named(tmp_path: Path) -> None:
    # Rank 1 dies and stops ranks 0 and 2; in the new world the old rank 2 (pid 12) is rank 1, a spare rank 2.
    path, now = tmp_path / "run.json", [1000.0]
    timeline = Timeline(str(path), clock=lambda: now[0])
    for rank in range(3):
        timeline.span("call", "call", 1000.0, 1001.0, rank=rank, node="node-a", attempt=0, pid=10 + rank)
    timeline.instant("rank 1 failed (root cause)", "failure", 1001.0, rank=1, node="node-a", root_cause=True, root_rank=1)
    for rank in (0, 2):
        timeline.instant(f"rank {rank} stopped: rank 1 failed", "stopped", 1001.0, rank=rank, node="node-a", root_cause=False, root_rank=1)
    timeline.instant("rank 1 is the old rank 2 (pid 12)", "restart", 1002.0, rank=1, node="node-a", pid=12, was_rank=2)
    timeline.instant("a spare (pid 20) is rank 2", "spare", 1002.0, rank=2, node="node-b", pid=20)
    timeline.close()
    picture = timeline_png.layout(timeline_png.read_events(path.read_text())[0])
    labels = {(marker.row, marker.cat): marker.label for marker in picture.markers}
    assert labels == {
        (2, "failure"): "failed: the root cause",
        (1, "stopped"): "rank 0 stopped: rank 1 failed",
        (3, "stopped"): "rank 2 stopped: rank 1 failed",
        (2, "restart"): "rank 1 is the old rank 2 (pid 12)",
        (3, "spare"): "a spare (pid 20) is rank 2",
    }
    assert timeline_png.colour("failure") != timeline_png.colour("stopped")
    assert timeline_png.main([str(path), str(tmp_path / "run.png")]) == 0
