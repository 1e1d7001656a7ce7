"""How often a rank sends a step of training state: no more than the loop can afford.

Sending a step costs the training loop more than its copy: the transfer to
the other node and the holders' work run on the same cores (or the same
memory bandwidth) as the loop. Where the node has cores to spare that costs
nothing and a step goes out as soon as the last is committed; where it has
none, sending every step it can would take most of the machine. The pace
measures what a send costs and spaces the sends so that their cost stays
within ``budget`` of the loop's time (CheckFreq's idea, FAST '21: a
checkpoint frequency set by the overhead measured, not guessed).

It measures at the only place every loop passes: the start of each
``save_state``. An interval between two saves during which nothing of this
rank was on its way out is the loop's own pace (the median of the last few
is the baseline); the intervals while a step was on its way out, less the
baseline, are what that step cost (its copy included). An interval in which
the loop waited for a commit itself (``wait_committed``) is no step's and
measures neither. A step sent at time
T that cost C seconds lets the next one go at T + C / budget: the loop then
spent at most ``budget`` of its time on sending, and the committed step
trails the saved one by about C / budget of training. A loop that changes
its pace (saves every step where it saved every 10) is measured anew: an
idle interval twice as long or short as the baseline starts it afresh. Ray-free: the rank's
store calls it (``RayStateStore``), and the sends themselves are still the
keeper's word (``SendPlan``).
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Deque, List, Optional

BASELINE_SAVES = 3  # idle intervals the baseline is the median of: one slow step does not move it
CHANGED = 2.0  # an idle interval this many times longer or shorter than the baseline: the loop changed its pace


class SendPace:
    """Whether this rank may send the step it saves now. ``budget``: the share of
    the loop's time sending may cost (None: every step it can, as soon as the last
    is committed)."""

    def __init__(self, budget: Optional[float]) -> None:
        self.budget = budget
        self._idle: Deque[float] = deque(maxlen=BASELINE_SAVES)  # intervals with nothing on its way out
        self._busy: List[float] = []  # intervals since the last send began, while something was on its way out
        self._last: Optional[float] = None  # when the last save began
        self._sent_at: Optional[float] = None  # when the save of the last step sent began
        self._fresh = 0  # idle intervals measured since then

    def saved(self, now: float, busy: bool) -> None:
        """A save begins at ``now``; ``busy``: a step of this rank was on its way out
        at some time since the save before began (that interval paid for it)."""
        if self._last is not None:
            interval = now - self._last
            if busy:
                self._busy.append(interval)
            else:
                baseline = self._baseline()
                if baseline is not None and not baseline / CHANGED <= interval <= baseline * CHANGED:
                    self._idle.clear()  # saves every step now, where it saved every 10 (or the reverse)
                self._idle.append(interval)
                self._fresh += 1
        self._last = now

    def waited(self) -> None:
        """The loop waited for a commit (``wait_committed``) since its last save: the
        time until its next save is not a step's, and measures neither."""
        self._last = None

    def cost(self) -> Optional[float]:
        """The loop's seconds the last send cost so far (None: no baseline yet)."""
        baseline = self._baseline()
        if baseline is None:
            return None
        return max(0.0, sum(interval - baseline for interval in self._busy))

    def due(self, now: float) -> bool:
        """Whether a step saved at ``now`` may be sent (the first always is)."""
        if self.budget is None or self._sent_at is None:
            return True
        cost, baseline = self.cost(), self._baseline()
        if cost is None or baseline is None:  # no interval free of a send yet: the loop's own pace is unknown
            return False
        if not self._fresh and any(interval < baseline / CHANGED for interval in self._busy):
            return False  # the loop saves more often than when its pace was measured: measured anew first
        return now - self._sent_at >= cost / self.budget

    def sending(self, now: float) -> None:
        """The step saved at ``now`` goes out: its cost is measured from here."""
        self._sent_at, self._busy, self._fresh = now, [], 0

    def _baseline(self) -> Optional[float]:
        return statistics.median(self._idle) if self._idle else None
