"""A group's phase, changed in one place (``Lifecycle.move``) along the
transitions ``raydist.pool.records.PHASE_TRANSITIONS`` lists, and why the
group was stopped (the first cause wins: a shutdown, a cancel, a growth)."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional

from raydist.pool.records import CallEnd, GroupPhase, check_transition


class Lifecycle:
    """The phase, under one short lock; ``changed`` wakes waiters on each move."""

    def __init__(self, on_move: Callable[[str], None] = lambda phase: None) -> None:
        self._on_move = on_move  # told each new phase's name (the run's timeline), under the lock
        self.lock = threading.RLock()  # also orders submissions; held only briefly
        self.changed = threading.Condition(self.lock)
        self.phase = GroupPhase.STARTING
        on_move(self.phase.name.lower())
        self.stopped: Optional[CallEnd] = None  # why the group was stopped (CANCELLED, GROW, SHUT_DOWN)

    def move(self, to: GroupPhase) -> None:
        """Change the phase; RuntimeError for a move the table does not list."""
        with self.lock:
            check_transition(self.phase, to)
            self.phase = to
            self._on_move(to.name.lower())
            self.changed.notify_all()

    def move_if(self, current: GroupPhase, to: GroupPhase, when: Callable[[], bool] = lambda: True) -> bool:
        """Move from ``current`` to ``to`` if the phase is ``current`` and ``when()`` holds (checked under the lock)."""
        with self.lock:
            if self.phase is not current or not when():
                return False
            self.move(to)
            return True

    def stop(self, cause: CallEnd) -> bool:
        """Enter SHUTTING_DOWN for ``cause``; False when a stop had begun already."""
        with self.lock:
            if self.phase in (GroupPhase.SHUTTING_DOWN, GroupPhase.CLOSED):
                return False
            self.stopped = cause
            self.move(GroupPhase.SHUTTING_DOWN)
            return True

    def close(self) -> None:
        with self.lock:
            if self.phase is GroupPhase.SHUTTING_DOWN:
                self.move(GroupPhase.CLOSED)

    @property
    def closing(self) -> bool:
        return self.phase in (GroupPhase.SHUTTING_DOWN, GroupPhase.CLOSED)


def weakly(method: Callable[[], Any]) -> Callable[[], None]:
    """``method()`` for a watcher to call, holding its object weakly (a run dropped without shutdown() is still freed)."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        alive = ref()
        if alive is not None:
            alive()

    return call


def weakly_asks(method: Callable[[], bool]) -> Callable[[], bool]:
    """``method()`` for a slow step to ask, holding its object weakly (True once the object is gone)."""
    ref = weakref.WeakMethod(method)

    def ask() -> bool:
        alive = ref()
        return True if alive is None else bool(alive())

    return ask
