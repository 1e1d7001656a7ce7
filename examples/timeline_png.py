"""Draw a raydist run's timeline as a PNG: the Chrome trace file that
``raydist.run(..., timeline="run.json")`` or ``raydist run --timeline run.json``
writes, as one picture for a report or a page where Perfetto is not at hand.

    python examples/timeline_png.py run.json run.png

The top row is the driver's: the run's phases (starting, running,
restarting, shutting down) and the wait for placement as bars, each world
ready, a signal forwarded and a node drained or lost as labelled markers.
Below it, one row per rank, labelled with its node: its process start,
initialisation, calls, ``save_state`` / ``load_state`` and data waits as bars
coloured by category (a step inside a call drawn thinner, on top), its
failure, a spare taking its place or a new process as labelled markers, and
its collectives and committed steps as ticks under the row. The x axis is
seconds from the first event. A file cut short by a killed driver is drawn
as far as it goes. Needs matplotlib (``pip install matplotlib``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from raydist.pool.timeline import CATEGORIES

Event = Mapping[str, Any]

DRIVER_ROW = 0
# One colour per category (Tableau-like, readable on white); an unknown one is grey.
COLOURS: Dict[str, str] = {
    "placement": "#bab0ac",
    "start": "#4e79a7",
    "init": "#76b7b2",
    "call": "#59a14f",
    "state": "#edc948",
    "data": "#b07aa1",
    "collective": "#ff9da7",
    "controller": "#9c755f",
    "failure": "#e15759",
    "stopped": "#f4b6b7",
    "restart": "#f28e2b",
    "spare": "#1b9e77",
    "signal": "#333333",
    "node": "#6a3d9a",
}
UNKNOWN_COLOUR = "#cccccc"
# Moments worth a word on a rank's row ("": the event's own name); the others (collectives, steps committed) get a tick.
# A root cause and the ranks it stopped are told apart; a spare or a kept process under a new rank names its pid.
RANK_LABELS = {"failure": "failed: the root cause", "stopped": "", "spare": "", "restart": "", "signal": "", "node": ""}
BAR_HEIGHT = 0.6  # of a row's 1 unit: the rest is room for the labels above
CLOSE = 0.08  # labels on one row nearer than this fraction of the run are stacked, not overprinted


@dataclass(frozen=True)
class Bar:
    """A span on a row, in seconds from the first event. ``lane`` > 0: it overlaps
    an earlier span of its row (a nested step, a spare's start beside the rank it
    replaced) and is drawn thinner, on top."""

    row: int
    start: float
    end: float
    cat: str
    name: str
    lane: int
    colour: str


@dataclass(frozen=True)
class Marker:
    """A moment on a row; ``level`` lifts its label above a neighbour's."""

    row: int
    at: float
    cat: str
    label: str
    level: int
    colour: str


@dataclass(frozen=True)
class Layout:
    rows: Tuple[str, ...]  # labels, top to bottom: the driver's row, then one per rank
    bars: Tuple[Bar, ...]
    markers: Tuple[Marker, ...]
    end: float  # seconds from the first event to the last one's end
    legend: Tuple[Tuple[str, str], ...]  # (category, colour) of what is drawn, in CATEGORIES order


def colour(cat: str) -> str:
    return COLOURS.get(cat, UNKNOWN_COLOUR)


# -- reading -------------------------------------------------------------------
def read_events(text: str) -> Tuple[List[Event], bool]:
    """The events of a timeline file's text, and whether the file was complete.

    A driver killed mid-run leaves the array open ("[", then each event and a
    comma): close it. A kill in the middle of a write may also leave half a
    line: drop it.
    """
    try:
        return json.loads(text), True
    except json.JSONDecodeError:
        pass
    body = text.rstrip().rstrip(",")
    try:
        return json.loads(body + "]"), False
    except json.JSONDecodeError:
        whole = body.rsplit("\n", 1)[0].rstrip().rstrip(",")
        return json.loads(whole + "]"), False


# -- layout (pure: no matplotlib) ----------------------------------------------
def row_of(event: Event) -> Optional[int]:
    """The rank an event belongs to (None: the driver's row). The writer puts a
    rank on ``tid`` rank + 1 of its node's track and names it in ``args.rank``."""
    if event.get("pid", 0) == 0:
        return None
    rank = event.get("args", {}).get("rank")
    return int(rank) if rank is not None else int(event["tid"]) - 1


def _short_node(node: str) -> str:
    return node[:8]  # a Ray node id is 56 hex digits; its first 8 tell nodes apart


def _rank_label(rank: int, nodes: List[str]) -> str:
    if not nodes:
        return f"rank {rank}"
    where = " → ".join(_short_node(node) for node in nodes)  # a rank whose new process (a spare) is on another node
    return f"rank {rank} · node {where}" if len(nodes) == 1 else f"rank {rank} · nodes {where}"


def _lanes(spans: List[Tuple[float, float]]) -> List[int]:
    """For spans of one row, sorted by start: the lowest lane free at each one's start."""
    ends: List[float] = []
    lanes = []
    for start, end in spans:
        lane = next((i for i, busy_until in enumerate(ends) if busy_until <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        lanes.append(lane)
    return lanes


def _label(event: Event, row: int) -> str:
    cat = str(event.get("cat", ""))
    if row == DRIVER_ROW:
        return str(event.get("name", ""))  # the driver's moments are few and their names short ("world 1 ready (4 ranks)")
    short = RANK_LABELS.get(cat)
    if short is None:
        return ""
    return short or str(event.get("name", ""))


def layout(events: Sequence[Event]) -> Layout:
    """Rows, bars and markers for ``events`` (a timeline's, as read)."""
    timed = [e for e in events if e.get("ph") in ("X", "i", "I")]
    origin = min((e["ts"] for e in timed), default=0)
    ranks = sorted({rank for rank in map(row_of, timed) if rank is not None})
    index = {rank: i + 1 for i, rank in enumerate(ranks)}  # row 0 is the driver's
    nodes: Dict[int, List[str]] = {rank: [] for rank in ranks}

    spans: Dict[int, List[Tuple[float, float, Event]]] = {}
    moments: List[Tuple[int, float, Event]] = []
    for event in sorted(timed, key=lambda e: e["ts"]):
        rank = row_of(event)
        row = DRIVER_ROW if rank is None else index[rank]
        node = event.get("args", {}).get("node")
        if rank is not None and node and node not in nodes[rank]:
            nodes[rank].append(str(node))
        start = (event["ts"] - origin) / 1e6
        if event["ph"] == "X":
            spans.setdefault(row, []).append((start, start + event.get("dur", 0) / 1e6, event))
        else:
            moments.append((row, start, event))

    bars: List[Bar] = []
    for row, found in sorted(spans.items()):
        found.sort(key=lambda span: (span[0], -span[1]))  # an enclosing span before the ones inside it
        for (start, end, event), lane in zip(found, _lanes([(s, e) for s, e, _ in found])):
            cat = str(event.get("cat", ""))
            bars.append(Bar(row, start, end, cat, str(event.get("name", "")), lane, colour(cat)))

    end = max([bar.end for bar in bars] + [at for _, at, _ in moments], default=0.0)
    markers: List[Marker] = []
    last_label: Dict[Tuple[int, int], float] = {}  # (row, level) -> where the last label on it was
    for row, at, event in moments:
        cat, label = str(event.get("cat", "")), _label(event, row)
        level = 0
        if label:
            while at - last_label.get((row, level), -1e9) < CLOSE * max(end, 1e-9):
                level += 1
            last_label[(row, level)] = at
        markers.append(Marker(row, at, cat, label, level, colour(cat)))

    drawn = {bar.cat for bar in bars} | {marker.cat for marker in markers}
    legend = tuple((cat, colour(cat)) for cat in (*CATEGORIES, *sorted(drawn - set(CATEGORIES))) if cat in drawn)
    rows = ("driver", *(_rank_label(rank, nodes[rank]) for rank in ranks))
    return Layout(rows, tuple(bars), tuple(markers), end, legend)


# -- drawing ---------------------------------------------------------------------
def draw(picture: Layout, out: Path, title: str = "", dpi: int = 100) -> None:
    """Write ``picture`` to ``out`` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.5 * len(picture.rows)))
    span = max(picture.end, 1e-6)
    for bar in sorted(picture.bars, key=lambda b: b.lane):  # deeper lanes on top
        height = BAR_HEIGHT * 0.5**bar.lane
        ax.barh(bar.row, bar.end - bar.start, left=bar.start, height=height, color=bar.colour, edgecolor="white", linewidth=0.8)
        # Bars of one colour side by side (the driver's phases) say their name when there is room.
        if bar.row == DRIVER_ROW and bar.lane == 0 and (bar.end - bar.start) > 0.07 * span:
            ax.text((bar.start + bar.end) / 2, bar.row, bar.name.replace("_", " "), ha="center", va="center", fontsize=7, color="white")
    # The many small moments (collectives, state steps committed): a tick each under the bar, a rug when dense.
    ticks: Dict[str, List[Tuple[float, float]]] = {}
    for marker in picture.markers:
        if not marker.label:
            ticks.setdefault(marker.colour, []).append((marker.at, marker.row + BAR_HEIGHT / 2))
    for shade, points in ticks.items():
        xs, ys = zip(*points)
        ax.plot(xs, ys, linestyle="", marker="|", markersize=5, color=shade, markeredgewidth=0.8)
    for marker in picture.markers:
        if not marker.label:
            continue
        ax.plot(marker.at, marker.row, marker="D", markersize=6, color=marker.colour, markeredgecolor="black", markeredgewidth=0.6)
        late = marker.at > 0.7 * span  # its label ends at the marker rather than running off the plot
        ax.annotate(  # above the row's bars, in dark ink: a label in its marker's colour vanishes on a bar of that colour
            marker.label,
            (marker.at, marker.row - BAR_HEIGHT / 2),
            xytext=(-2 if late else 2, 1 + 9 * marker.level),
            textcoords="offset points",
            ha="right" if late else "left",
            va="bottom",
            fontsize=7,
            color="#222222",
            bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
        )

    ax.set_yticks(range(len(picture.rows)), list(picture.rows), fontsize=8)
    ax.set_ylim(len(picture.rows) - 0.4, -0.9)  # the driver on top, room above it for labels
    ax.set_xlim(0, span * 1.08)
    ax.set_xlabel("seconds from the first event", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", linewidth=0.3, alpha=0.6)
    ax.set_axisbelow(True)
    if title:
        ax.set_title(title, fontsize=9)
    bar_cats, labelled = {bar.cat for bar in picture.bars}, {marker.cat for marker in picture.markers if marker.label}
    handles = [
        Patch(color=shade, label=cat)
        if cat in bar_cats
        else Line2D([], [], marker="D", linestyle="", color=shade, markeredgecolor="black", label=cat)
        if cat in labelled
        else Line2D([], [], marker="|", linestyle="", color=shade, markeredgewidth=0.8, label=cat)
        for cat, shade in picture.legend
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Draw a raydist run's timeline (Chrome trace JSON) as a PNG.")
    parser.add_argument("timeline", type=Path, help="the timeline file (timeline= / --timeline)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--dpi", type=int, default=100)
    options = parser.parse_args(argv)
    events, complete = read_events(options.timeline.read_text())
    title = options.timeline.name + ("" if complete else " (cut short: the driver stopped before the run ended)")
    draw(layout(events), options.out, title, options.dpi)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
