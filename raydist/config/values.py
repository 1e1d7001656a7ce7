"""Checks of one value, shared by every option: each takes the option's name
(for the message) and the value, and returns the value normalised, or raises
TypeError / ValueError naming the option."""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Sequence

# An option's check: (option name, value) -> the value normalised.
Check = Callable[[str, Any], Any]


def type_name(value: Any) -> str:
    return type(value).__name__


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type_name(value)} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_seconds(name: str, value: Any) -> float:
    if not is_number(value):
        raise TypeError(f"{name} must be a number of seconds, not {type_name(value)} {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {type_name(value)} {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` matched case-insensitively against ``choices``, or ValueError listing them."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string (one of {', '.join(choices)}), not {type_name(value)}")
    for choice in choices:
        if value.lower() == choice.lower():
            return choice
    raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(choices)}")


def check_name(name: str, value: Any) -> str:
    """A non-empty name such as a role."""
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"{name} must be a non-empty name, not {value!r}")
    return value


def at_least(minimum: int) -> Check:
    return lambda name, value: check_int(name, value, minimum)


def choice(choices: Sequence[str]) -> Check:
    return lambda name, value: check_choice(name, value, choices)


def optional(check: Check) -> Check:
    """``check``, with None passed through (the option's "not set")."""
    return lambda name, value: None if value is None else check(name, value)


def empty_if_none(check: Check, empty: Any) -> Check:
    """``check`` of ``empty`` where None was given (a mapping or sequence option)."""
    return lambda name, value: check(name, empty if value is None else value)


def check_path_text(name: str, value: Any, what: str) -> str:
    """``value`` as a path naming a ``what`` ("directory", "file"): a string or
    ``os.PathLike``, not blank."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a {what} path, not {type_name(value)} {value!r}")
    path = os.fspath(value)
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{name} must name a {what}, got {value!r}")
    return path
