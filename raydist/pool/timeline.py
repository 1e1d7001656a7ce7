"""A run's timeline: trace events in the Chrome trace format, which Perfetto
(ui.perfetto.dev) and chrome://tracing open.

``Timeline`` writes the driver's file as the run goes, in the format's JSON
Array form: ``[``, then one event per line, each followed by a comma, and
``]`` when the run ends. A driver killed mid-run leaves every event written
so far: drop the last comma and close the array. Tracks: the driver's
(trace ``pid`` 0), then one per node in the order the run first used them,
with a row per rank on it (``tid`` = rank + 1). Times are seconds since the
epoch on the cluster's clock, written in microseconds.

``SpanBuffer`` is a rank's side (``SPANS`` in each worker process): what
its process did (start, init, each call, its waits for data and for state),
kept until its next result carries it to the driver. With the timeline off
it keeps the start-up steps, the calls of 10 ms or more and two sums, which
the run's summary shows; a shorter call then costs two clock reads and an
empty check.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

# Every event's ``cat`` is one of these.
CATEGORIES = (
    "placement",  # waiting for the placement group
    "start",  # a worker process starting (spawn, imports) until it reports where it runs
    "init",  # the launcher environment and the process group
    "call",  # a call of the user's function (or script) on a rank
    "ahead",  # the call run ahead to its load_state before the process had its rank (run_ahead)
    "state",  # save_state / load_state
    "data",  # waiting for a batch of a Ray Data shard
    "collective",  # a collective, from the flight recorder
    "controller",  # the run's phases (running, restarting, ...)
    "failure",  # the rank whose failure ended a world (the root cause), and why
    "stopped",  # a rank that failed because the root cause did (a peer gone from its collective)
    "restart",  # a new world after a failure, and a kept process under a new rank
    "spare",  # a spare taking a rank's place
    "signal",  # a signal forwarded to the ranks
    "node",  # a node lost or draining
)
MAX_BYTES = 64 * 2**20  # past this the file takes no more events (it says so, and stays valid)
# A rank sends its own span of a call only when the call lasts this long: a shorter one
# is drawn from the driver's view (sent -> result), since a result that carries a span
# costs Ray about 0.05 ms more per rank to send than a bare value (a warm no-op call
# takes ~0.5 ms); past it the span costs under 0.5 % of the call.
OWN_CALL_SPAN_S = 0.01
ENV_VAR = "RAYDIST_TIMELINE"  # "1" in a rank's environment when the run keeps a timeline
DRIVER_PID = 0

Span = Tuple[str, str, float, float, Mapping[str, Any]]  # name, cat, start, end (epoch seconds), args


class Timeline:
    """The driver's timeline file (``path``), or nothing when ``path`` is None."""

    def __init__(self, path: Optional[str], clock: Callable[[], float] = time.time, max_bytes: int = MAX_BYTES):
        self.on = path is not None
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._max_bytes = max_bytes
        self._written = 0
        self._full = False
        self._file: Optional[BinaryIO] = None
        self._nodes: Dict[str, int] = {}  # node id -> its track (trace pid)
        self._rows: set = set()  # (pid, tid) rows already named
        self._phase: Optional[Tuple[str, float]] = None  # the controller's phase and since when
        self._held: List[str] = []  # events of the batches open now, written together when the last ends
        self._batches = 0
        if path is not None:
            self._file = open(path, "wb")
            self._write("[\n")
            self._meta("process_name", DRIVER_PID, None, "driver")
            self._meta("thread_name", DRIVER_PID, 0, "driver")

    def now(self) -> float:
        return self._clock()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Events recorded inside are written (and flushed) once, at the end: a call's, every rank's at once."""
        if not self.on:
            yield
            return
        with self._lock:
            self._batches += 1
        try:
            yield
        finally:
            with self._lock:
                self._batches -= 1
                held, self._held = (self._held, []) if self._batches == 0 else ([], self._held)
            if held:
                self._write("".join(held))

    # -- events ---------------------------------------------------------------
    def span(
        self, name: str, cat: str, start: float, end: float, rank: Optional[int] = None, node: Optional[str] = None, **args: Any
    ) -> None:
        """A complete event: on ``rank``'s row of ``node``'s track, else on the driver's row."""
        if self.on:
            self._event({"ph": "X", "name": name, "cat": cat, "ts": _us(start), "dur": max(0, _us(end) - _us(start))}, rank, node, args)

    def instant(
        self, name: str, cat: str, at: Optional[float] = None, rank: Optional[int] = None, node: Optional[str] = None, **args: Any
    ) -> None:
        """A moment (``at``: now): on ``rank``'s row of ``node``'s track, else the driver's."""
        if self.on:
            moment = self._clock() if at is None else at
            self._event({"ph": "i", "s": "t", "name": name, "cat": cat, "ts": _us(moment)}, rank, node, args)

    def spans(self, spans: Tuple[Span, ...], rank: int, node: str, **args: Any) -> None:
        """What a rank's ``SpanBuffer`` sent, on its row."""
        for name, cat, start, end, own in spans:
            if start == end:  # a moment (a step committed)
                self.instant(name, cat, start, rank=rank, node=node, **{**args, **own})
            else:
                self.span(name, cat, start, end, rank=rank, node=node, **{**args, **own})

    def phase(self, name: str) -> None:
        """The run entered phase ``name``: the last one becomes a span on the
        driver's row; ``closed`` closes the file."""
        if not self.on:
            return
        now = self._clock()
        with self._lock:
            last, self._phase = self._phase, (name, now)
        if last is not None:
            self.span(last[0], "controller", last[1], now)
        if name == "closed":
            self.close()

    def close(self) -> None:
        """End the array: the file is complete JSON after this, and takes no more events."""
        if not self.on:
            return
        with self._lock:
            if self._file is not None:
                self._file.seek(-2, os.SEEK_END)  # over the last event's ",\n"
                self._file.write(b"\n]\n")
                self._file.close()
                self._file = None
            self.on = False

    # -- the file -------------------------------------------------------------
    def _event(self, event: Dict[str, Any], rank: Optional[int], node: Optional[str], args: Mapping[str, Any]) -> None:
        pid, tid = self._row(rank, node, args)
        event["pid"], event["tid"] = pid, tid
        shown = {key: value for key, value in args.items() if value is not None}
        if rank is not None:
            shown["rank"] = rank
        if node is not None:
            shown["node"] = node
        if shown:
            event["args"] = shown
        self._emit(event)

    def _row(self, rank: Optional[int], node: Optional[str], args: Mapping[str, Any]) -> Tuple[int, int]:
        if rank is None:
            return DRIVER_PID, 0
        key = node or "unknown"
        with self._lock:
            pid = self._nodes.setdefault(key, len(self._nodes) + 1)
            named_node, named_row = (pid, None) in self._rows, (pid, rank + 1) in self._rows
        if not named_node:
            self._meta("process_name", pid, None, f"node {key[:12]}")
            self._meta("process_sort_index", pid, None, pid)
        if not named_row:
            self._meta("thread_name", pid, rank + 1, f"rank {rank}" + (f" (pid {args['pid']})" if args.get("pid") else ""))
            self._meta("thread_sort_index", pid, rank + 1, rank)
        return pid, rank + 1

    def _meta(self, what: str, pid: int, tid: Optional[int], value: Any) -> None:
        self._rows.add((pid, tid))
        key = "sort_index" if what.endswith("sort_index") else "name"
        event = {"ph": "M", "name": what, "pid": pid, "args": {key: value}}
        if tid is not None:
            event["tid"] = tid
        self._emit(event)

    def _emit(self, event: Dict[str, Any]) -> None:
        text = json.dumps(event, separators=(",", ":"), default=str) + ",\n"
        with self._lock:
            if self._batches:
                self._held.append(text)
                return
        self._write(text)

    def _write(self, text: str) -> None:
        with self._lock:
            if self._file is None or self._full:
                return
            if self._written + len(text) > self._max_bytes:
                self._full = True
                text = json.dumps(
                    {
                        "ph": "i",
                        "s": "g",
                        "name": "timeline full: later events dropped",
                        "cat": "controller",
                        "pid": 0,
                        "tid": 0,
                        "ts": _us(self._clock()),
                    }
                )
                text += ",\n"
            self._file.write(text.encode())
            self._file.flush()  # a driver killed next leaves this event in the file
            self._written += len(text)


class SpanBuffer:
    """A rank's records since its last result: its start-up steps and its
    calls of at least ``OWN_CALL_SPAN_S`` (always: the run's summary shows
    them; the start-up is kept before the run's environment says whether the
    timeline is on), the seconds it waited for data and in ``save_state`` /
    ``load_state`` (always: two sums), and, only with the timeline on
    (``switch``), a span for each wait and state step."""

    ALWAYS = ("start", "init", "call")  # the categories kept with the timeline off (the summary's)

    def __init__(self, limit: int = 10_000) -> None:
        self.on = False
        self.started = False  # the process's start was recorded (it is described again at each warm restart)
        self._limit = limit  # a rank whose results never come back keeps at most this many
        self._spans: List[Span] = []
        self._waits: Dict[str, float] = {}
        self._lock = threading.Lock()

    def switch(self, on: bool) -> None:
        self.on = on

    def add(self, name: str, cat: str, start: float, end: float, **args: Any) -> None:
        if self.on or cat in self.ALWAYS:
            with self._lock:
                if len(self._spans) < self._limit:
                    self._spans.append((name, cat, start, end, args))

    def waited(self, name: str, cat: str, start: float, end: float, **args: Any) -> None:
        """A wait of ``cat`` (``data``, ``state``): summed always, a span with the timeline on."""
        with self._lock:
            self._waits[cat] = self._waits.get(cat, 0.0) + (end - start)
        self.add(name, cat, start, end, **args)

    def take(self) -> Tuple[Tuple[Span, ...], Tuple[Tuple[str, float], ...]]:
        """The spans and the waits' sums kept since the last take (often both empty)."""
        if not self._spans and not self._waits:  # a warm call with nothing to say takes no lock
            return (), ()
        with self._lock:
            spans, self._spans = tuple(self._spans), []
            waits, self._waits = tuple(self._waits.items()), {}
        return spans, waits


SPANS = SpanBuffer()  # this process's (a rank's): its records travel with its next result


def process_started() -> float:
    """When this process started (seconds since the epoch)."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - without psutil: from now
        return time.time()


def _us(seconds: float) -> int:
    return round(seconds * 1e6)
