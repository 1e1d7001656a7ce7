"""A run's phase, changed in one place (``Lifecycle.move``) along the
transitions ``raydist.pool.records.PHASE_TRANSITIONS`` lists, by the run's
loop alone (other threads only read it)."""

from __future__ import annotations

import weakref
from typing import Any, Callable, TypeVar

from raydist.pool.records import GroupPhase, check_transition

T = TypeVar("T")


class Lifecycle:
    """The phase; each move is told to ``on_move`` (the run's timeline)."""

    def __init__(self, on_move: Callable[[str], None] = lambda phase: None) -> None:
        self._on_move = on_move
        self.phase = GroupPhase.STARTING
        on_move(self.phase.name.lower())

    def move(self, to: GroupPhase) -> None:
        """Change the phase; RuntimeError for a move the table does not list."""
        check_transition(self.phase, to)
        self.phase = to
        self._on_move(to.name.lower())

    def stop(self) -> bool:
        """Enter SHUTTING_DOWN; False when a stop had begun already."""
        if self.closing:
            return False
        self.move(GroupPhase.SHUTTING_DOWN)
        return True

    def close(self) -> None:
        if self.phase is GroupPhase.SHUTTING_DOWN:
            self.move(GroupPhase.CLOSED)

    @property
    def closing(self) -> bool:
        return self.phase in (GroupPhase.SHUTTING_DOWN, GroupPhase.CLOSED)


def weakly(method: Callable[..., T], gone: T) -> Callable[..., T]:
    """``method(...)`` for a watcher or a slow step to call, holding its object
    weakly (a run dropped without shutdown() is still freed); ``gone`` once it is."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> T:
        alive = ref()
        return gone if alive is None else alive(*args)

    return call
