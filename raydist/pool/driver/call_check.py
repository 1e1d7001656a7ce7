"""The arguments of a call checked before anything is pickled or sent: Ray-free,
so bad input fails at once (``calls.prepare_call`` runs it first)."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Mapping, Tuple


def check_call(fn: Callable[..., Any], args: Any, kwargs: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """The call's arguments as a tuple and a dict; TypeError for what cannot run on a worker."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"fn {getattr(fn, '__name__', fn)!r} is an async function; pass a plain function")
    if inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"fn {getattr(fn, '__name__', fn)!r} is a generator function; its values would never run on the workers: return a list instead"
        )
    if isinstance(args, (str, bytes, bytearray, Mapping)) or not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list of positional arguments, not {type(args).__name__} {args!r}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise TypeError(f"kwargs must be a mapping of argument names to values, not {type(kwargs).__name__}")
    return tuple(args), dict(kwargs)
