"""The unit tier: pure logic, no Ray. Ray is made unimportable here, so a
rule that quietly needs Ray fails its test instead of passing slowly."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Optional, Sequence

import pytest


class _NoRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Optional[Sequence[str]] = None, target: Any = None) -> None:
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"the unit tier must not import Ray (tried {name!r}): move the test to tests/live/")
        return None


if any(name == "ray" or name.startswith("ray.") for name in sys.modules):
    raise RuntimeError("Ray was imported before the unit tier started: run tests/unit on its own (make test does)")
sys.meta_path.insert(0, _NoRay())


@pytest.fixture(autouse=True)
def _ray_stays_out() -> Any:
    yield
    assert "ray" not in sys.modules, "a unit test imported Ray"
