"""The unit tier: pure logic, no Ray. Run on its own (``pytest tests/unit``,
as ``make test`` runs it), Ray is made unimportable, so a rule that quietly
needs Ray fails its test instead of passing slowly. In a run that includes
the live tier, Ray is imported by those tests and the guard stands aside."""

from __future__ import annotations

import importlib.abc
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import pytest

UNIT_DIR = Path(__file__).resolve().parent


class _NoRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Optional[Sequence[str]] = None, target: Any = None) -> None:
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"the unit tier must not import Ray (tried {name!r}): move the test to tests/live/")
        return None


def _unit_tier_alone() -> bool:
    targets = [arg.split("::")[0] for arg in sys.argv[1:] if not arg.startswith("-") and "tests" in arg]
    return bool(targets) and all(UNIT_DIR in (Path(t).resolve(), *Path(t).resolve().parents) for t in targets)


GUARDED = _unit_tier_alone() and "ray" not in sys.modules
if GUARDED:
    sys.meta_path.insert(0, _NoRay())


@pytest.fixture(autouse=True)
def _ray_stays_out() -> Iterator[None]:
    yield
    if GUARDED:
        assert "ray" not in sys.modules, "a unit test imported Ray"


@pytest.fixture
def count_calls() -> Callable[[Callable[[], Any]], int]:
    """The work a function does, counted rather than timed (the same on any
    machine, however loaded): the Python and built-in calls it makes on this
    thread, each step of a generator included. A test of how work grows
    compares the counts at two sizes."""

    def count(fn: Callable[[], Any]) -> int:
        calls = 0

        def profile(frame: Any, event: str, arg: Any) -> None:
            nonlocal calls
            if event in ("call", "c_call"):
                calls += 1

        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            fn()
        finally:
            sys.setprofile(previous)
        return calls

    return count
