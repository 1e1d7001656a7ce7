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

import contextlib
import heapq
import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional

EPOCH = 1_800_000_000.0  # what time() reads at monotonic() == 0
HORIZON_S = 1e6  # virtual seconds after which a wait is taken to wait forever
ACTION_LIMIT_S = 30.0  # real seconds a timer's function may take before it is taken to be blocked


ACTION_THREAD = "virtual-clock-action"


def in_action() -> bool:
    """Whether the calling thread runs one of the clock's functions (a timer, an action, a loop's turn)."""
    return threading.current_thread().name == ACTION_THREAD


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

    def join(self, timeout: float) -> None:
        """At once: the clock runs one function at a time, so a timer's function
        under way now is one waiting below the caller (its wait moved the clock
        into the caller), which goes on once the caller returns."""


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self._timers: List[VirtualTimer] = []
        self._actions: List[Callable[[], None]] = []  # to run at the next step, in order
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._interrupted = False
        self._running = 0  # functions running now (each on its thread, joined by a waiting thread)
        self._done_running = threading.Condition(self._lock)
        self._parked: List[Callable[[], None]] = []  # each waiting user's thread's Ctrl-C handler, oldest first
        self._driving = threading.Lock()  # held by the user's thread that moves the clock now (run_until)

    def interrupt(self) -> None:
        """Ctrl-C: the user's thread waiting on the run says so at once (its
        ``parked`` handler), then its wait raises KeyboardInterrupt."""
        self._interrupted = True
        with self._lock:
            handler = self._parked[0] if self._parked else None
        if handler is not None:
            handler()

    @contextlib.contextmanager
    def parked(self, on_interrupt: Callable[[], None]) -> Iterator[None]:
        """A user's thread waits on the run meanwhile (``on_interrupt``: what it does on Ctrl-C)."""
        with self._lock:
            self._parked.append(on_interrupt)
        try:
            yield
        finally:
            with self._lock:
                self._parked.remove(on_interrupt)

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
        ``waiting_for()`` names what the engine waits for, should it wait forever.

        Several user threads may wait at once: one of them moves the clock at a
        time (``_driving``), each move whole (the functions due, then the calls
        that can run), so that no thread runs calls while another runs a
        function, whatever the machine's load. A function of the clock that
        waits itself (a sleep in the run's loop) moves it from within."""
        while True:
            with contextlib.nullcontext() if in_action() else self._driving:
                if self._move(settled, deadline, step, waiting_for):
                    return

    def _move(
        self, settled: Callable[[], bool], deadline: Optional[float], step: Callable[[], None], waiting_for: Callable[[], str]
    ) -> bool:
        """One move of ``run_until``; True once it is done."""
        if self._wait_for_other_driver():
            return False  # nothing else moves while another waiting thread runs a function
        self._run_actions()
        self._deliver_interrupt()
        if settled():  # before anything more runs: a user's thread goes on as soon as its answer came
            return True
        step()
        self._deliver_interrupt()
        if self.busy:
            return False
        if settled():
            return True
        if self._wait_for_other_driver():
            return False
        due = self._next_due()
        if deadline is not None and (due is None or due > deadline):
            self.now = max(self.now, deadline)
            return True
        if due is None or due > HORIZON_S:
            what = waiting_for()
            raise EngineStuck(f"the engine waits forever{' for ' + what if what else ''}")
        with self._lock:
            self.now = max(self.now, due)
            while self._timers and self._timers[0].due <= self.now:
                timer = heapq.heappop(self._timers)
                if not timer.cancelled:
                    self._actions.append(timer.fn)
        return False

    def _wait_for_other_driver(self) -> bool:
        """Another user's thread runs a function of the clock (the engine is
        busy there): a second waiting thread waits for it, and neither time
        moves nor does the engine count as stuck meanwhile."""
        if in_action():
            return False
        with self._lock:
            if not self._running:
                return False
            self._done_running.wait(ACTION_LIMIT_S)
            return True

    def _deliver_interrupt(self) -> None:
        """Ctrl-C lands in the user's thread where it waits, never in the engine's."""
        if self._interrupted and not in_action():
            self._interrupted = False
            raise KeyboardInterrupt

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
                self._running += 1  # with the pop: no other waiting thread moves on meanwhile
            thread = threading.Thread(target=action, name=ACTION_THREAD, daemon=True)
            try:
                thread.start()
                thread.join(timeout=ACTION_LIMIT_S)
            finally:
                with self._lock:
                    self._running -= 1
                    self._done_running.notify_all()
            if thread.is_alive():
                raise EngineStuck(f"{action} blocked: the engine held a lock while it waited")
