"""A call run ahead, to its first ``load_state``, before this process has its rank.

With ``run_ahead=True`` a spare standing by, and a kept process between its
warm restart's teardown and its next world, start the run's call in a thread
of their own. The function runs with no rank, no launcher environment and no
process group, and parks in its first ``load_state``. The process joins the
next world only once the function parked there (or ended): its set-up then
gives it the environment and the process group, and when the same call
arrives, the parked ``load_state`` goes on, loads the new world's state and
returns, the imports done and the model built before the rank was known.

A function that ends before it parks (most often by raising because it needed
its rank: a read of ``RANK``, a collective, ``get_dataset_shard``) is not
used: the call then runs from the top, as without ``run_ahead``.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from raydist.core.environment import run_ahead_of_rank
from raydist.core.state import set_load_gate

Load = Callable[[bytes], Tuple[Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]]  # a call's bytes -> (fn, args, kwargs)


# The main thread waits for the function in ticks: a signal handled by another
# thread does not wake a wait without a timeout, and Ctrl-C must reach the function.
JOIN_TICK_S = 0.2


class Discarded(BaseException):
    """Raised at the parked ``load_state`` of a function run ahead that is not used
    (a BaseException: the user's ``except Exception`` must not swallow it)."""


def digest(call: bytes) -> bytes:
    """What tells two calls apart without keeping a big one's bytes."""
    return hashlib.blake2b(call, digest_size=16).digest()


class RunAhead:
    """One call's function run ahead in its own thread, parked at its first ``load_state``."""

    def __init__(self, call: bytes, load: Load, pin: Callable[[], None]) -> None:
        self.digest = digest(call)
        self._call, self._load = call, load  # unpickled in the thread: its imports are part of what runs ahead
        self._pin = pin  # the process's device, made current in this thread too (CUDA's is per thread)
        self._released = threading.Event()
        self._discarded = False
        self._reached = threading.Event()  # parked at its load_state, or ended before it
        self.passed = False  # went on from its load_state in a world: what it ends with is the rank's
        self.ended = threading.Event()
        self.started_at = self.parked_at = 0.0  # epoch seconds: the function's start, its park in load_state
        self.value: Any = None
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="raydist-run-ahead", daemon=True)

    def start(self) -> None:
        set_load_gate(self._gate)
        self.started_at = time.time()
        self._thread.start()

    def _run(self) -> None:
        run_ahead_of_rank(True)  # raydist.get_context() raises until the load: no world of one made up
        try:
            self._pin()
            fn, args, kwargs = self._load(self._call)
            self._call = b""
            self.value = fn(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - what the rank ends with, once it passed its load_state
            self.error = error
        finally:
            self.ended.set()
            self._reached.set()

    def _gate(self) -> None:
        """``load_state``'s first step: this thread's first one parks until released (or discarded)."""
        if threading.current_thread() is not self._thread or self.passed:
            return
        self.parked_at = time.time()
        self._reached.set()
        self._released.wait()
        if self._discarded:
            raise Discarded("raydist: a function run ahead that is not used")
        self.passed = True
        run_ahead_of_rank(False)

    def settle(self) -> None:
        """Return once the function parked at its ``load_state`` or ended: only then
        may the process take its new launcher environment (the function must not
        see it half-way, nor initialise a process group of its own with it)."""
        self._reached.wait()

    def release(self, call: bytes) -> bool:
        """Let the parked function go on for ``call``; False when it was run ahead
        for another call (then discarded) or ended before it parked (run ``call`` from the top)."""
        if self.digest != digest(call) or (self.ended.is_set() and not self.passed):
            self.discard()
            return False
        self._released.set()
        return True

    def join(self) -> None:
        """Wait for the released function to end. A Ctrl-C forwarded to this
        process (the main thread's KeyboardInterrupt) is raised in the function,
        as it would be in a call run on the main thread."""
        try:
            while not self.ended.wait(JOIN_TICK_S):
                pass
        except KeyboardInterrupt:
            ident = self._thread.ident
            if ident is not None:  # the documented way to raise in another thread, at its next bytecode
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))
            self.ended.wait()
        finally:
            set_load_gate(None)

    def discard(self) -> None:
        """Not used: a parked function unwinds (``Discarded`` at its ``load_state``)."""
        self._discarded = True
        self._released.set()
        set_load_gate(None)
