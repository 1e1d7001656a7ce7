"""How raydist writes ranks, resources and deadlines in its messages (one
way each, so every message reads alike)."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from raydist.errors import ranks_text  # noqa: F401 - re-exported: the rules name it from here


def fmt_resources(resources: Mapping[str, float]) -> str:
    """{"CPU": 1.0, "GPU": 2.0} -> "{CPU: 1, GPU: 2}"."""
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in resources.items()) + "}"


def per_node_text(per_node: Sequence[Mapping[str, float]]) -> str:
    return "[" + ", ".join(fmt_resources(r) for r in per_node) + "]"


def deadline_text(deadline: float, now: float) -> str:
    """A drain's deadline (seconds since the epoch) as seen at ``now``."""
    return "no deadline" if math.isinf(deadline) else f"deadline in {max(0.0, deadline - now):.0f} s"
