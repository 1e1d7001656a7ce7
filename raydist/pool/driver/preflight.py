"""``PreFlight``: the health check's round trips and what they measured.

The builder (``raydist.pool.driver.startup``) asks it to probe new workers
(``probe``: the compute and memory probes, ``raydist.pool.worker.health``)
before they host a rank, and a world whose process group raydist
initialised to time a checked all_reduce (``collective``). The verdict is
the pure rule's (``raydist.pool.rules.health.judge``), held to the run's
first median once there was one; what to do with it (exclude a node, let a
spare in, place again) is the builder's. Every figure goes to the run's
summary, its timeline and Ray's metrics.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from raydist.core.accelerators import Accelerator
from raydist.pool.cluster.seam import Cluster, Pending, Worker
from raydist.pool.driver.summary import HealthFigures, RunSummary
from raydist.pool.records import Placement, WorkerInfo
from raydist.pool.rules.health import Probed, Verdict, judge, judged
from raydist.pool.rules.layout import pinning_envs
from raydist.pool.timeline import Timeline

logger = logging.getLogger("raydist")

# How the builder waits for one round trip on every worker (``GroupBuilder._await``).
Wait = Callable[[Sequence[WorkerInfo], List[Pending], str], List[Any]]


class PreFlight:
    """A run's health checks: the probes' round trips, the verdicts and the figures recorded."""

    def __init__(self, cluster: Cluster, option: str, threshold: float, summary: RunSummary, timeline: Timeline, wait: Wait):
        self._cluster = cluster
        self._option, self._threshold = option, threshold  # ``health_check``, ``health_threshold``
        self._summary, self._timeline = summary, timeline
        self._wait = wait
        self._median: Optional[float] = None  # the first check's median GFLOP/s: later workers' reference
        self._off = False  # set when a probe found nothing to judge ("auto", devices not visible): no all_reduce either

    def probe(
        self,
        accelerator: Accelerator,
        bundle: Mapping[str, float],
        actors: Sequence[Worker],
        placements: Sequence[Placement],
        mode: str,
        envs: Sequence[Mapping[str, str]] = (),
    ) -> Optional[Tuple[List[Probed], Verdict]]:
        """Round trip: the probes on ``actors`` (at ``placements``, each pinned to its
        device by ``envs``, else as a spare among ``placements`` would be) and the
        verdict on them; the figures recorded, each exclusion said. None: not judged
        (``judged``: "auto" where torch sees none of the workers' accelerators)."""
        cluster = self._cluster
        threads = max(1, int(bundle.get("CPU", 1)))  # the worker's CPU share: as many torch threads
        started = cluster.time()
        envs = list(envs) or pinning_envs(placements, placements, accelerator)
        # Two round trips: every worker imports and pins first, then all are timed together.
        devices = self._wait(
            (), [cluster.call(actor, "probe_ready", env, accelerator.device_type) for actor, env in zip(actors, envs)], "ready to probe"
        )
        if not judged(self._option, accelerator, devices):
            self._off = True
            logger.info("raydist: health check off: torch sees none of the workers' %s devices (each runs on its CPU)", accelerator.name)
            return None
        results = self._wait((), [cluster.call(actor, "probe", mode, threads) for actor in actors], "probed")
        probed = [Probed(p.index, p.node_id, gflops, error) for p, (gflops, error) in zip(placements, results)]
        verdict = judge(probed, self._threshold, self._median)
        if self._median is None:
            self._median = verdict.median
        figures = [p.gflops for p in probed if p.gflops is not None]
        excluded = {bad.node_id: bad.why for bad in reversed(verdict.unhealthy)}  # each node's first reason
        self._summary.health_checked(
            HealthFigures(len(probed), verdict.median, min(figures) if figures else None, cluster.time() - started, excluded)
        )
        self._timeline.span("health check", "health", started, cluster.time(), workers=len(probed), mode=mode)
        for p in probed:
            if p.gflops is not None:
                cluster.record("raydist_health_gflops", p.gflops, {"node": p.node_id})
        for node, why in excluded.items():
            cluster.record("raydist_health_excluded_nodes", 1, {})
            self._timeline.instant(f"node {node[:12]} excluded", "health", node=node, why=why)
            logger.warning("raydist: health check: node %s (%s) excluded for the rest of the run: %s", node[:12], mode, why)
        return probed, verdict

    def collective(self, actors: Sequence[Worker], workers: Sequence[WorkerInfo], mode: str, wait: Wait) -> None:
        """Round trip: a timed all_reduce on the world's process group whose sum every
        rank checks (a rank that raises fails the start, as a set-up step does); the
        world's figure (its slowest rank's) recorded."""
        if len(workers) < 2 or self._off:
            return
        started = self._cluster.time()
        calls = [self._cluster.call(actor, "probe_collective", mode) for actor in actors]
        gbps = min(figure for figure, _ in wait(workers, calls, "probed (all_reduce)"))
        self._summary.bandwidth_checked(gbps)
        self._timeline.span("health check: all_reduce", "health", started, self._cluster.time(), gbps=round(gbps, 3))
        self._cluster.record("raydist_health_allreduce_gbps", gbps, {})
