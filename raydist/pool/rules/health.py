"""The pre-flight health check's verdict (pure): which workers are too slow or
broken to host a rank, from what each one's probes measured.

Before a world's ranks are chosen, every worker of it (spares included)
times a matrix multiply on its device (``raydist.pool.worker.health``) and,
on an accelerator, allocates and checks some of its memory. A worker is
unhealthy when a probe failed, or when its compute figure falls below
``threshold`` times the median of the workers probed with it on the other
nodes (or of a reference median: a spare started later is held to the run's
first one): workers that share a node's cores slow each other down, so a
node is compared with the others, never with itself.
The figures of ranks on one node are not independent (a node's own
slowness slows each of them), so the unit excluded is the node.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from raydist.core.accelerators import Accelerator


def health_mode(option: str, accelerator: "Accelerator") -> Optional[str]:
    """The probes' mode for ``health_check=option`` ("quick", "thorough"), or None: off.
    "auto" is "quick" on accelerators and off on CPU workers: ranks that share a
    machine's cores slow each other, so one's figure says nothing about its node."""
    if option == "auto":
        return None if accelerator.device_type == "cpu" else "quick"
    return None if option == "off" else option


def judged(option: str, accelerator: "Accelerator", devices: Sequence[str]) -> bool:
    """Whether the probes on ``devices`` (what each worker pinned: "cuda:0", "cpu")
    are judged. Under "auto", not when no worker's accelerator is visible to
    torch (every one fell back to its CPU, as on a cluster whose GPUs Ray only
    counts): that is the CPU case, where "auto" is off. One worker that falls
    back beside others that do not is judged, and its figure is far below theirs."""
    fell_back = accelerator.device_type != "cpu" and all(device == "cpu" for device in devices)
    return not (option == "auto" and fell_back)


@dataclass(frozen=True)
class Probed:
    """What one worker's probes measured: ``gflops`` (None: the probe failed,
    ``error`` says how), on node ``node_id``; ``index``: the worker's bundle slot."""

    index: int
    node_id: str
    gflops: Optional[float]
    error: str = ""

    @property
    def failed(self) -> bool:
        return self.gflops is None


@dataclass(frozen=True)
class Unhealthy:
    """A worker that may not host a rank, and why (the line its node's exclusion says)."""

    index: int
    node_id: str
    why: str


@dataclass(frozen=True)
class Verdict:
    """The probed workers' median compute figure and the unhealthy ones (best first: none)."""

    median: Optional[float]
    unhealthy: Tuple[Unhealthy, ...]

    @property
    def nodes(self) -> List[str]:
        """The nodes to exclude, in the order their workers were found."""
        return list(dict.fromkeys(u.node_id for u in self.unhealthy))

    def text(self) -> str:
        """One line per excluded node (its first worker's reason)."""
        first: Dict[str, str] = {}
        for bad in self.unhealthy:
            first.setdefault(bad.node_id, bad.why)
        return "; ".join(f"node {node[:12]}: {why}" for node, why in first.items())


def judge(probed: Sequence[Probed], threshold: float, reference: Optional[float] = None) -> Verdict:
    """The verdict on ``probed``: a failed probe is unhealthy; so is a compute
    figure below ``threshold`` x the median of the workers on the other nodes
    (``reference`` where given: a later worker is held to the run's first
    check). A node is compared with the others, never with itself: workers
    that share a node's cores slow each other down, and a one-node run has
    nothing to compare with (only a failed probe counts there)."""
    figures = sorted(p.gflops for p in probed if p.gflops is not None)
    by_node: Dict[str, List[float]] = {}
    for p in probed:
        if p.gflops is not None:
            by_node.setdefault(p.node_id, []).append(p.gflops)
    others = {node: _median_without(figures, sorted(own)) for node, own in by_node.items()}
    unhealthy: List[Unhealthy] = []
    for p in probed:
        if p.gflops is None:
            unhealthy.append(Unhealthy(p.index, p.node_id, f"its probe failed: {p.error}"))
            continue
        median = reference if reference is not None else others[p.node_id]
        if median is not None and p.gflops < threshold * median:
            unhealthy.append(
                Unhealthy(p.index, p.node_id, f"{p.gflops:.3g} GFLOP/s, below {threshold:g} x the median {median:.3g} GFLOP/s")
            )
    overall = reference if reference is not None else (statistics.median(figures) if figures else None)
    return Verdict(overall, tuple(unhealthy))


def _median_without(ordered: Sequence[float], removed: Sequence[float]) -> Optional[float]:
    """The median of ``ordered`` (sorted) less the values ``removed`` (sorted, all
    in it), None when nothing is left; log^2 n, so that every node's may be taken."""
    left = len(ordered) - len(removed)
    if left <= 0:
        return None

    def smallest(k: int) -> float:  # the k-th smallest left (0-based): the first value with more than k left at or below it
        lo, hi = 0, len(ordered) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            value = ordered[mid]
            if bisect.bisect_right(ordered, value) - bisect.bisect_right(removed, value) > k:
                hi = mid
            else:
                lo = mid + 1
        return ordered[lo]

    middle = left // 2
    return smallest(middle) if left % 2 else (smallest(middle - 1) + smallest(middle)) / 2


def split_healthy(probed: Sequence[Probed], verdict: Verdict, world: int, minimum: int) -> Tuple[List[int], int, Optional[str]]:
    """(the indices that stay: every worker not on an excluded node; how many
    of them are spares; why the run cannot start, or None). A world of
    ``world`` ranks stays whole while enough healthy workers remain (spares
    fill in for the excluded); an elastic one shrinks down to ``minimum``."""
    excluded = set(verdict.nodes)
    kept = [p.index for p in probed if p.node_id not in excluded]
    if len(kept) < minimum:
        need = f"{minimum}" if minimum == world else f"at least {minimum}"
        return kept, 0, f"{len(kept)} healthy worker(s) left, {need} needed: {verdict.text()}"
    return kept, max(0, len(kept) - world), None
