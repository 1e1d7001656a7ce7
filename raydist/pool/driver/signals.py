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

import signal
import threading
from typing import Any, Dict, Optional, Sequence


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
_lock = threading.Lock()
_previous: Dict[int, Any] = {}


def _handle(signum: int, frame: Any) -> None:
    with _lock:
        _received["count"] = _received.get("count", 0) + 1
        first = "first" not in _received
        _received.setdefault("first", signum)
    if first:
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
