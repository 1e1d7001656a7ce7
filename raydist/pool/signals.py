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
from typing import Any, Dict, Iterator, Optional, Sequence


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


_deferring = [0]  # >0 inside ``deferred()``: record a signal, raise it on leaving


def _handle(signum: int, frame: Any) -> None:
    with _lock:
        _received["count"] = _received.get("count", 0) + 1
        first = "first" not in _received
        _received.setdefault("first", signum)
        if first and _deferring[0]:
            _received["deferred"] = signum
            return
    if first:
        raise SignalReceived(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a handled signal until the block ends, then raise it.

    For ``ray.init`` starting a private Ray: interrupted half-way it leaves
    a raylet and agents that no ``ray.shutdown`` knows about (the caller
    stops that Ray before the signal propagates). Only the main thread,
    where the handlers run, holds a signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _lock:
        _deferring[0] += 1
    try:
        yield
    finally:
        with _lock:
            _deferring[0] -= 1
    raise_pending()


def raise_pending() -> None:
    """Raise the signal ``deferred()`` held, once outside every such block."""
    with _lock:
        signum = None if _deferring[0] else _received.pop("deferred", None)
    if signum is not None:
        raise SignalReceived(signum)


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
