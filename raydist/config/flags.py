"""How ``raydist run`` spells and reads an option: ``CliFlag``, and the
argparse converters its flags use. Converters only convert text; the option's
own check (in its ``Option``) judges the value."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple


@dataclass(frozen=True)
class CliFlag:
    """How ``raydist run`` spells and reads one RunConfig option."""

    flags: Tuple[str, ...]  # every spelling, torchrun's underscore aliases included
    help: str  # "{default}" is replaced with the option's default
    parse: Optional[Callable[[str], Any]] = None  # argparse type: text -> value (the option's check judges it)
    metavar: Optional[str] = None
    action: Optional[str] = None  # argparse action: "store_true", "append"
    choices: Optional[Tuple[str, ...]] = None
    to_option: Optional[Callable[[Any], Any]] = None  # parsed flag value -> option value
    # False: the option comes from CLI-only flags (num_workers from -n and
    # --nnodes); ``flag`` still names it in messages.
    generated: bool = True

    @property
    def flag(self) -> str:
        """The spelling that messages use: the first long one."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])

    def help_for(self, default: Any) -> str:
        return self.help.format(default=default)


def flag(*flags: str, help: str, **kwargs: Any) -> CliFlag:
    """An option's ``raydist run`` flag."""
    return CliFlag(flags=flags, help=help, **kwargs)


def _converter(kind: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """An argparse type that only converts (the option's check judges the value)."""

    def parse(value: str) -> Any:
        try:
            return kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None

    return parse


parse_int = _converter(int, "a whole number")
parse_seconds = _converter(float, "a number of seconds")
_parse_share = _converter(float, "a number between 0 and 1")


def parse_share_or_none(value: str) -> Any:
    """A share such as 0.05, or the word ``none`` (any case; ``none_share`` makes it None: "no limit")."""
    return "none" if value.lower() == "none" else _parse_share(value)


def none_share(value: Any) -> Optional[float]:
    return None if value == "none" else value


def parse_resources(value: str) -> Dict[str, Any]:
    """``--resources-per-worker``'s JSON object."""
    try:
        resources = json.loads(value)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {value!r}") from None
    if not isinstance(resources, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"CPU\": 2}}', got {value!r}")
    return resources


def parse_env_pair(value: str) -> Tuple[str, str]:
    """One ``--env KEY=VALUE``."""
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key, val


def none_word(value: str) -> Optional[str]:
    """``none`` (any case) as None: "no signal"."""
    return None if value.lower() == "none" else value
