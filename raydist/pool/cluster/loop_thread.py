"""``LoopThread``: a run's control loop on a thread of its own (``RayCluster.run_loop``);
``PollTimer``: a poll's (``RayCluster.after``).

The thread turns the loop whenever it is woken and at the moment the last
turn asked for, one turn at a time; it holds the turn function weakly, so a
run dropped without a shutdown is still collected (and its thread ends).
Ray-free: a real cluster's loop is plain Python threading.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Callable, Optional

logger = logging.getLogger("raydist")

Turn = Callable[[], Optional[float]]

# Longest sleep between turns when none was asked for: the thread notices a
# collected run this often (a wake comes at once).
IDLE_CHECK_S = 5.0


class LoopThread:
    def __init__(self, turn: Turn, name: str):
        self._turn = weakref.WeakMethod(turn) if hasattr(turn, "__self__") else (lambda: turn)
        self._woken = threading.Condition()
        self._pending = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        with self._woken:
            self._pending = True
            self._woken.notify()

    def stop(self) -> None:
        with self._woken:
            self._stopped = True
            self._woken.notify()

    def in_turn(self) -> bool:
        return threading.current_thread() is self._thread

    def _run(self) -> None:
        due: Optional[float] = None
        while True:
            with self._woken:
                while not self._pending and not self._stopped:
                    if due is not None and time.monotonic() >= due:
                        break
                    self._woken.wait(IDLE_CHECK_S if due is None else min(IDLE_CHECK_S, due - time.monotonic()))
                    if self._turn() is None:
                        return  # the run was collected
                if self._stopped:
                    return
                self._pending = False
            turn = self._turn()
            if turn is None:
                return
            try:
                due = turn()
            except Exception:
                logger.exception("raydist: the run's control loop failed a turn")
                due = None
            del turn  # not held between turns: the run stays collectable


class PollTimer(threading.Timer):
    """``Cluster.after``'s timer: a thread, joined (``Timer.join``) from any thread but its
    own (a poll that ends the run itself goes on; joining itself would raise)."""

    def join(self, timeout: Optional[float] = None) -> None:
        if threading.current_thread() is not self:
            super().join(timeout)
