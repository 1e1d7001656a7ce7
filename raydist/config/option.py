"""``Option``: one RunConfig option's facts in one record — its default, its
check, its ``raydist run`` flag (with the help text) and what it means.
``RunConfig`` declares each field with ``Option.field()``; the flags, the
checks and the class docstring are all read from these records."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any, Optional, cast

from raydist.config.flags import CliFlag
from raydist.config.values import Check

# The key of a RunConfig field's metadata that holds its Option.
OPTION = "raydist.option"


@dataclass(frozen=True)
class Option:
    """One option: ``check(name, value)`` normalises a value or raises
    TypeError / ValueError naming it; checks that read other options too run
    after every option's own (``RunConfig``'s combinations)."""

    default: Any
    doc: str  # what it means, as the class docstring lists it
    check: Check
    flag: Optional[CliFlag] = None  # None: ``raydist run`` sets it itself

    def field(self) -> Any:
        """The dataclass field (a fresh copy of a mutable default per config)."""
        metadata = {OPTION: self}
        if isinstance(self.default, dict):
            return dataclasses.field(default_factory=partial(dict, self.default), metadata=metadata)
        return dataclasses.field(default=self.default, metadata=metadata)


def option_of(field: "dataclasses.Field[Any]") -> Option:
    return cast(Option, field.metadata[OPTION])


def option_default(field: "dataclasses.Field[Any]") -> Any:
    """A RunConfig field's default value (a fresh one for a factory)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default
