"""raydist's own figures as Ray application metrics (``ray.util.metrics``),
and a rank's waits recorded for them, its timeline and its run's summary.

Ray exports them with its own (Prometheus, as ``ray_<name>``; Ray's
dashboard and Grafana read them there): the driver records restarts and how
long each took to recover (through the cluster seam, ``Cluster.record``);
each rank records the seconds ``save_state`` blocked it, the seconds it
waited for data, and the last step committed. ``FIGURES`` is the one list;
``Figures`` makes each metric the first time it is recorded (Ray is imported
then, never at import).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

from raydist.pool.timeline import SPANS

logger = logging.getLogger("raydist")


class Figure(NamedTuple):
    kind: str  # "counter", "gauge" or "histogram"
    description: str
    tags: Tuple[str, ...]


FIGURES: Dict[str, Figure] = {
    "raydist_restarts": Figure("counter", "restarts of a run, by kind (warm, fresh, ...)", ("kind",)),
    "raydist_recovery_seconds": Figure("gauge", "the last restart's time from the fault to the new world set up", ()),
    "raydist_save_state_blocking_seconds": Figure("histogram", "seconds save_state blocked a rank's loop", ("rank",)),
    "raydist_data_wait_seconds": Figure("counter", "seconds a rank waited for its next batch of a Ray Data shard", ("rank",)),
    "raydist_committed_step": Figure("gauge", "the last training-state step a rank saw committed", ("rank",)),
    "raydist_health_gflops": Figure("gauge", "a new worker's pre-flight matrix multiply, GFLOP/s", ("node",)),
    "raydist_health_allreduce_gbps": Figure("gauge", "a world's pre-flight all_reduce, bus GB/s", ()),
    "raydist_health_excluded_nodes": Figure("counter", "nodes the pre-flight check excluded", ()),
}
BOUNDARIES = [0.001, 0.01, 0.1, 1.0, 10.0, 100.0]  # seconds, for the histogram


class Figures:
    """This process's metrics, made on first use."""

    def __init__(self) -> None:
        self._made: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self._broken = False

    def record(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        """Add ``value`` to ``name`` (a ``FIGURES`` key); a metric that cannot be recorded never stops a run."""
        figure = FIGURES[name]
        if self._broken:
            return
        try:
            metric = self._metric(name, figure)
            if figure.kind == "counter":
                metric.inc(value, tags=dict(tags))
            elif figure.kind == "gauge":
                metric.set(value, tags=dict(tags))
            else:
                metric.observe(value, tags=dict(tags))
        except Exception as error:  # noqa: BLE001 - not connected to Ray, an old Ray: the run goes on without
            self._broken = True
            logger.debug("raydist: metrics are off in this process: %s", error)

    def _metric(self, name: str, figure: Figure) -> Any:
        with self._lock:
            if name not in self._made:
                from ray.util import metrics

                if figure.kind == "histogram":
                    self._made[name] = metrics.Histogram(name, figure.description, boundaries=BOUNDARIES, tag_keys=figure.tags)
                else:
                    kind = metrics.Counter if figure.kind == "counter" else metrics.Gauge
                    self._made[name] = kind(name, figure.description, tag_keys=figure.tags)
            return self._made[name]


FIGURES_HERE = Figures()  # this process's


def data_waited(started: float, ended: float, dataset: str) -> None:
    """This rank waited for its next batch of ``dataset``."""
    SPANS.waited("waiting for data", "data", started, ended, dataset=dataset or None)
    FIGURES_HERE.record("raydist_data_wait_seconds", ended - started, {"rank": os.environ.get("RANK", "0")})


def state_waited(what: str, step: Optional[int], started: float, ended: float) -> None:
    """``save_state`` blocked this rank (or ``load_state`` took) from ``started`` to ``ended`` (``raydist.core.state.Observer``)."""
    SPANS.waited(what if step is None else f"{what} step {step}", "state", started, ended, step=step)
    if what == "save_state":
        FIGURES_HERE.record("raydist_save_state_blocking_seconds", ended - started, {"rank": os.environ.get("RANK", "0")})
