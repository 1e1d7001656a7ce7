"""A script's ``atexit`` handlers, run when the script ends on a rank.

A Ray actor's process does not exit when a script run in it ends, so
without this the handlers a script (or a library it used: experiment
trackers, profilers, TorchDynamo's statistics) registered would never run.
The recorder notes every handler registered from the actor's start on
(Ray's own, registered when Ray was imported, is not among them and keeps
its place), and ``run_recorded`` runs them last-registered first, as the
interpreter does at exit, reporting a handler that raises as Python does.
Each ran handler is unregistered, so the next script starts clean.

``weakref.finalize``'s handler is left to the real exit: it registers itself
the first time any code makes a finalizer, and it runs every finalizer still
alive in the process (the worker's own too: a ``TemporaryDirectory`` it
holds), then switches finalizers off for good. A script's own objects are
finalized when its namespace goes, as any object's are.
"""

from __future__ import annotations

import atexit
import sys
import threading
import traceback
import weakref
from typing import Any, Callable, List, Tuple

Handler = Tuple[Callable[..., Any], Tuple[Any, ...], dict]

_recorded: List[Handler] = []
_lock = threading.Lock()
_real_register = atexit.register
_real_unregister = atexit.unregister
_FINALIZERS_AT_EXIT = getattr(weakref.finalize, "_exitfunc", None)  # runs every live weakref.finalize


def _register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
    if func != _FINALIZERS_AT_EXIT:  # the whole process's (see the module docstring)
        with _lock:
            _recorded.append((func, args, kwargs))
    return _real_register(func, *args, **kwargs)


def _unregister(func: Callable[..., Any]) -> None:
    with _lock:
        _recorded[:] = [handler for handler in _recorded if handler[0] != func]
    _real_unregister(func)


def install_recorder() -> None:
    """Record ``atexit`` registrations from now on (in a worker process only)."""
    atexit.register = _register  # type: ignore[assignment]
    atexit.unregister = _unregister


def run_recorded() -> None:
    """Run the recorded handlers as the interpreter would at exit, then forget them."""
    while True:
        with _lock:
            if not _recorded:
                return
            func, args, kwargs = _recorded.pop()
        if not any(handler[0] == func for handler in _recorded):
            _real_unregister(func)  # so it does not run again when the process exits
        try:
            func(*args, **kwargs)
        except SystemExit:
            pass  # ignored at exit too
        except BaseException as error:  # noqa: BLE001 - as Python's atexit: report and go on
            _report(func, error)


def _report(func: Callable[..., Any], error: BaseException) -> None:
    """Python's own report of a handler that raised (``sys.unraisablehook``'s format, which 3.13 changed)."""
    if sys.version_info >= (3, 13):
        text = f"Exception ignored in atexit callback {func!r}:\n"
    else:
        text = f"Exception ignored in atexit callback: {func!r}\n"
    text += "".join(traceback.format_exception(type(error), error, error.__traceback__.tb_next if error.__traceback__ else None))
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stream: nothing else to tell
        pass
