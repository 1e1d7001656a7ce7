"""``VirtualClock``: time that passes only when the engine waits.

The fake cluster's clock (``raydist.testing.fake``). ``after`` keeps a
function to run at a virtual moment; ``soon`` one to run at the next step.
``run_until`` is every wait of the engine: it runs what can run (the
cluster's ``step``), then the functions due, each on a thread of its own as
the real ones run, one at a time while the waiting thread is held; when
nothing is left to run it moves time to the next timer or the deadline.
Nothing runs by itself, so a schedule replays exactly.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable, List, Optional

EPOCH = 1_800_000_000.0  # what time() reads at monotonic() == 0
HORIZON_S = 1e6  # virtual seconds after which a wait is taken to wait forever
ACTION_LIMIT_S = 30.0  # real seconds a timer's function may take before it is taken to be blocked


class EngineStuck(AssertionError):
    """The engine waits for something that can never happen (a real run would hang)."""


@dataclass(order=True)
class VirtualTimer:
    """A function due at ``due`` (``Cluster.after``), until cancelled."""

    due: float
    order: int
    fn: Callable[[], None] = field(compare=False)
    name: str = field(compare=False, default="")
    cancelled: bool = field(compare=False, default=False)

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self._timers: List[VirtualTimer] = []
        self._actions: List[Callable[[], None]] = []  # to run at the next step, in order
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._interrupted = False

    def interrupt(self) -> None:
        """Ctrl-C: the engine's wait in progress, or its next, raises KeyboardInterrupt."""
        self._interrupted = True

    def after(self, delay: float, fn: Callable[[], None], name: str) -> VirtualTimer:
        with self._lock:
            timer = VirtualTimer(self.now + max(0.0, delay), next(self._order), fn, name)
            heapq.heappush(self._timers, timer)
            return timer

    def soon(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._actions.append(fn)

    @property
    def busy(self) -> bool:
        """Whether functions wait to run before anything else happens."""
        return bool(self._actions)

    def run_until(
        self, settled: Callable[[], bool], deadline: Optional[float], step: Callable[[], None], waiting_for: Callable[[], str] = str
    ) -> None:
        """Until ``settled()`` or ``deadline``: ``step()``, the functions due, and time moving on.
        ``waiting_for()`` names what the engine waits for, should it wait forever."""
        while True:
            self._run_actions()
            step()
            if self._interrupted:
                self._interrupted = False
                raise KeyboardInterrupt  # Ctrl-C reaches the driver where it blocks
            if self.busy:
                continue
            if settled():
                return
            due = self._next_due()
            if deadline is not None and (due is None or due > deadline):
                self.now = max(self.now, deadline)
                return
            if due is None or due > HORIZON_S:
                what = waiting_for()
                raise EngineStuck(f"the engine waits forever{' for ' + what if what else ''}")
            with self._lock:
                self.now = max(self.now, due)
                while self._timers and self._timers[0].due <= self.now:
                    timer = heapq.heappop(self._timers)
                    if not timer.cancelled:
                        self._actions.append(timer.fn)

    def pending(self) -> List[str]:
        """The names of the timers still to run (the ledger's)."""
        return [timer.name for timer in sorted(self._timers) if not timer.cancelled]

    def _next_due(self) -> Optional[float]:
        with self._lock:
            while self._timers and self._timers[0].cancelled:
                heapq.heappop(self._timers)
            return self._timers[0].due if self._timers else None

    def _run_actions(self) -> None:
        while True:
            with self._lock:
                if not self._actions:
                    return
                action = self._actions.pop(0)
            thread = threading.Thread(target=action, name="virtual-clock-action", daemon=True)
            thread.start()
            thread.join(timeout=ACTION_LIMIT_S)
            if thread.is_alive():
                raise EngineStuck(f"{action} blocked: the engine held a lock while it waited")
