"""A pure rule that names the rank that drags every step: from the ranks'
flight recorders, the rank that enters collectives consistently later than
the others (every rank then waits for it inside the collective).

A rank's lateness at one collective is when it entered it minus the median
of when the other ranks entered it, on one clock (``offsets_ns`` moves each
rank's wall clock onto the driver's). A rank is named when it is late by at
least ``min_late_s`` in ``share`` of the last ``window`` collectives that
every rank recorded, with at least ``min_samples`` of them; one late
collective (a checkpoint, a page fault) names no one.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from raydist.pool.records import CollectiveEntry

WINDOW = 20  # collectives looked at
MIN_SAMPLES = 8  # the fewest common collectives a verdict needs
MIN_LATE_S = 0.010  # lateness below this is scheduling noise
SHARE = 0.8  # late in at least this share of the window

_Key = Tuple[str, int]  # (process group, sequence number)


@dataclass(frozen=True)
class Straggler:
    """A rank that reaches collectives later than the others."""

    rank: int
    late_s: float  # median lateness over the window, in seconds
    collectives: int  # how many collectives the verdict rests on
    last_seq: int  # the sequence number of the window's last collective

    def line(self, where: str = "") -> str:
        at = f" on {where}" if where else ""
        return (
            f"rank {self.rank}{at} reaches collectives {self.late_s * 1e3:.0f} ms after the others, "
            f"over the last {self.collectives} collectives"
        )


def _entered(recorders: Mapping[int, Sequence[CollectiveEntry]], offsets_ns: Optional[Mapping[int, int]]) -> Dict[_Key, Dict[int, int]]:
    """When each rank entered each collective that every rank recorded (on one clock)."""
    offsets = offsets_ns or {}
    entered: Dict[_Key, Dict[int, int]] = {}
    for rank, entries in recorders.items():
        for entry in entries:
            entered.setdefault((entry.group, entry.seq), {})[rank] = entry.created_ns - offsets.get(rank, 0)
    ranks = set(recorders)
    return {key: times for key, times in entered.items() if set(times) == ranks and len(ranks) >= 2}


def _late_at(times: Mapping[int, int]) -> Dict[int, float]:
    """Each rank's lateness at one collective, in seconds: its entry time minus
    the median of the others'. One sort serves every rank (the others' median
    is read off the sorted times with the rank's own left out): n log n, where
    a median per rank would cost n times that."""
    ordered = sorted(times.values())
    middle, even = (len(ordered) - 1) // 2, (len(ordered) - 1) % 2 == 0
    late: Dict[int, float] = {}
    for rank, time in times.items():
        own = bisect.bisect_left(ordered, time)  # any copy of an equal time leaves the same others
        # The others' i-th smallest is ordered[i] below the rank's own place, ordered[i + 1] from it on.
        upper = ordered[middle if middle < own else middle + 1]
        if even:
            lower = ordered[middle - 1 if middle - 1 < own else middle]
            median: float = (lower + upper) / 2
        else:
            median = upper
        late[rank] = (time - median) / 1e9
    return late


def lateness(
    recorders: Mapping[int, Sequence[CollectiveEntry]], offsets_ns: Optional[Mapping[int, int]] = None
) -> Dict[_Key, Dict[int, float]]:
    """Per collective every rank recorded: each rank's lateness in seconds."""
    return {key: _late_at(times) for key, times in _entered(recorders, offsets_ns).items()}


def find_stragglers(
    recorders: Mapping[int, Sequence[CollectiveEntry]],
    offsets_ns: Optional[Mapping[int, int]] = None,
    *,
    window: int = WINDOW,
    min_samples: int = MIN_SAMPLES,
    min_late_s: float = MIN_LATE_S,
    share: float = SHARE,
) -> List[Straggler]:
    """The ranks consistently late over the last ``window`` common collectives."""
    entered = _entered(recorders, offsets_ns)
    # Ordered by when they happened (the median entry time), across process groups.
    keys = sorted(entered, key=lambda key: (statistics.median(entered[key].values()), key))[-window:]
    if len(keys) < min_samples:
        return []
    late = {key: _late_at(entered[key]) for key in keys}  # only the window's
    found = []
    for rank in sorted(recorders):
        values = [late[key][rank] for key in keys]
        if sum(value >= min_late_s for value in values) >= share * len(values):
            found.append(Straggler(rank, statistics.median(values), len(keys), keys[-1][1]))
    return found


@dataclass(frozen=True)
class Streak:
    """A rank late by at least a threshold in ``windows`` windows in a row; the
    last one ended when ``at`` common collectives had been seen."""

    windows: int
    at: int


def lengthen_streaks(
    streaks: Mapping[int, Streak], verdict: Sequence[Straggler], seen: int, threshold_s: float, window: int = WINDOW
) -> Dict[int, Streak]:
    """The streaks after a verdict read when ``seen`` common collectives had
    been seen in all: a rank named at least ``threshold_s`` late over a full
    window starts one, or adds a window once ``window`` new collectives came
    since its last; a rank no longer named (or less late) loses its streak."""
    lengthened: Dict[int, Streak] = {}
    for straggler in verdict:
        if straggler.late_s < threshold_s or straggler.collectives < window:
            continue
        streak = streaks.get(straggler.rank)
        if streak is None:
            lengthened[straggler.rank] = Streak(1, seen)
        elif seen - streak.at >= window:
            lengthened[straggler.rank] = Streak(streak.windows + 1, seen)
        else:
            lengthened[straggler.rank] = streak
    return lengthened
