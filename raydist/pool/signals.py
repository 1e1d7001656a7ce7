"""The driver's handlers for the signals torchrun handles (``raydist run``).

torchrun installs its own handlers for SIGTERM, SIGINT, SIGHUP and SIGQUIT
(``--signals-to-handle``), whatever it inherited: a background job of a
non-interactive shell starts with SIGINT ignored, and Python keeps an
inherited "ignore", so without its own handler such a run could not be
stopped with SIGINT. On the first signal the handler raises
``SignalReceived`` in the main thread; the worker group forwards the signal
to every rank (their handlers can save state), waits up to
``shutdown_timeout`` for them, and kills what is left. A second signal only
cuts that wait short (``hurried``), so the clean-up itself is never interrupted.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence


class SignalReceived(KeyboardInterrupt):
    """The driver got one of the signals it handles (torch's ``SignalException``).

    A KeyboardInterrupt: no ``except Exception`` on the way out swallows it,
    and Ray's waits let only that kind through (raising a plain
    KeyboardInterrupt in its place: ``received()`` says which signal came)."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"got {self.name}")


_received: Dict[str, int] = {}  # "first": the first signal's number, "count": how many
_lock = threading.RLock()  # reentrant: the handler may run while the main thread holds it
_previous: Dict[int, Any] = {}


def _handle(signum: int, frame: Any) -> None:
    with _lock:
        _received["count"] = _received.get("count", 0) + 1
        first = "first" not in _received
        _received.setdefault("first", signum)
    if first:
        raise SignalReceived(signum)


@contextlib.contextmanager
def deferred(deliver: bool = True) -> Iterator[None]:
    """Hold every signal that has a Python handler until the block ends, then
    deliver each one held (``deliver=False``: drop them; the process is exiting).

    For ``ray.init`` and ``ray.shutdown``. A Python handler runs between any
    two bytecodes of the main thread, so its exception (Python's
    KeyboardInterrupt, raydist's ``SignalReceived``) can land inside
    ``ray.init`` after Ray has built its C++ core worker and before Python
    holds it: no ``ray.shutdown`` can stop that worker then, and at exit Ray's
    C++ exit handler destroys it while its I/O thread still runs (a SIGSEGV
    in ``TaskManager::RecordMetrics``). Held, the signal arrives once Ray is
    whole, and the ordinary shutdown stops it. A handler the block installed
    (``ray.init`` sets one for SIGTERM) stays. Only the main thread, where
    Python runs handlers, holds signals: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: List[int] = []

    def hold(signum: int, frame: Any) -> None:
        held.append(signum)

    replaced: Dict[int, Any] = {}
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):  # one Python cannot handle
            handler = signal.getsignal(number)
            if callable(handler):
                signal.signal(number, hold)
                replaced[number] = handler
    try:
        yield
    finally:
        for signum, handler in replaced.items():
            if signal.getsignal(signum) is hold:
                signal.signal(signum, handler)
        for signum in dict.fromkeys(held) if deliver else ():
            signal.raise_signal(signum)  # its handler runs now; one that raises ends the delivery


def install(names: Sequence[str]) -> None:
    """Handle ``names`` from now on (main thread only), replacing whatever
    was inherited or installed since (``ray.init`` sets its own SIGTERM handler)."""
    for name in names:
        signum = signal.Signals[name]
        previous = signal.signal(signum, _handle)
        if previous is not _handle:
            _previous.setdefault(signum, previous)


def restore() -> None:
    """The handlers from before ``install``; forget any signal received."""
    for signum, previous in _previous.items():
        signal.signal(signum, previous)
    _previous.clear()
    with _lock:
        _received.clear()


def received() -> Optional[int]:
    """The first handled signal's number since ``install``; None if none came."""
    with _lock:
        return _received.get("first")


def hurried() -> bool:
    """True once a second signal came: stop waiting for the ranks."""
    with _lock:
        return _received.get("count", 0) > 1
