"""The engine on the fake cluster: every fault at every moment of a run, in
each restart mode, with what the user gets and nothing left behind.

A row of ``TABLE`` is one run of ``raydist.run``'s loop (``run_with_restarts``)
on a ``FakeCluster`` of three nodes (2 + 2 + 1 CPUs; 4 ranks of 1 CPU, so a
spare fits and a lost 2-CPU node leaves room for 3), with faults injected at
a moment; it states the outcome: the values' attempt and world size, or the
error and the rank (and node) it names, and how many worker processes were
started in all (a warm restart replaces only the dead: 4 + 1; a fresh one
starts over: 4 + 4). Every row also checks that the run left nothing: no
worker, agent, placement or timer. ``WAITING`` does the same for the moment
before any worker exists, while the run waits for room. Time is virtual: a row that waits out a
60 s timeout takes milliseconds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Type, Union

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raydist.config import RunConfig
from raydist.errors import InfeasibleResourcesError, WorkerGroupClosed, WorkerGroupError, WorkerGroupTimeout, WorkerStartupTimeout
from raydist.pool.driver.calls import prepare_call
from raydist.pool.driver.controller import RunController, run_call
from raydist.testing.fake import FakeCluster, Fault
from raydist.testing.workers import current_attempt, current_rank

NODES = {"node-a": {"CPU": 2}, "node-b": {"CPU": 2}, "node-c": {"CPU": 1}}
MODES: Dict[str, Dict[str, Any]] = {
    "none": dict(num_workers=4),  # no restarts
    "warm": dict(num_workers=4, max_restarts=1),
    "fresh": dict(num_workers=4, max_restarts=1, restart_mode="fresh"),
    "spare": dict(num_workers=4, max_restarts=1, spare_workers=1),
    "elastic": dict(num_workers=(2, 4), max_restarts=1),
}
LONG_CALL_S = 60.0  # how long a call on a draining node runs: it outlives the drain's deadline
Moment = List[Tuple[str, Optional[str], int, int]]  # faults: (method, kind (None: the row's), rank or slot, nth call)
DEATH = ("execute", "die", 1, 0)  # rank 1 dies in the call: what starts a restart
MOMENTS: Dict[str, Moment] = {
    "starting": [("describe", None, 1, 0)],  # a worker reports where it runs
    "initialising": [("setup", None, 1, 0)],  # the launcher environment and init_process_group
    "running": [("execute", None, 1, 0)],  # the user's call
    "settling": [DEATH, ("teardown", None, 0, 0)],  # a warm restart makes the survivors leave their group
    "spare joining": [DEATH, ("setup", None, 4, 0)],  # the spare (slot 4) set up as rank 1
    "rebuilding": [DEATH, ("describe", None, 0, 1)],  # the restart describes its world again
    "re-initialising": [DEATH, ("setup", None, 0, 1)],  # the restart's world initialises
    "rerunning": [DEATH, ("execute", None, 0, 1)],  # the call, retried
    "shutting down": [("teardown", None, 0, 0)],  # the graceful shutdown after success
}


@dataclass(frozen=True)
class Ok:
    attempt: int  # the world the values came from (TORCHELASTIC_RESTART_COUNT)
    size: int
    started: int  # worker processes started in all


@dataclass(frozen=True)
class Fails:
    error: Type[BaseException]
    says: str  # a part of its message: the rank, node or place it names
    started: int


Outcome = Union[Ok, Fails]

# Every moment x fault x mode where the fault can strike (a spare's moment
# needs spares; a restart's moments need a restart).
TABLE: List[Tuple[str, str, str, Outcome]] = [
    ("starting", "raise", "none", Fails(WorkerGroupError, "root cause: worker 1 before it reported where it runs", started=4)),
    ("starting", "raise", "warm", Fails(WorkerGroupError, "root cause: worker 1 before it reported where it runs", started=4)),
    ("starting", "raise", "fresh", Fails(WorkerGroupError, "root cause: worker 1 before it reported where it runs", started=4)),
    ("starting", "raise", "spare", Fails(WorkerGroupError, "root cause: worker 1 before it reported where it runs", started=5)),
    ("starting", "raise", "elastic", Fails(WorkerGroupError, "root cause: worker 1 before it reported where it runs", started=4)),
    ("starting", "die", "none", Fails(WorkerGroupError, "root cause: worker 1 before it reported where it runs", started=4)),
    ("starting", "die", "warm", Ok(attempt=1, size=4, started=8)),
    ("starting", "die", "fresh", Ok(attempt=1, size=4, started=8)),
    ("starting", "die", "spare", Ok(attempt=1, size=4, started=10)),
    ("starting", "die", "elastic", Ok(attempt=1, size=4, started=8)),
    ("starting", "hang", "none", Fails(WorkerStartupTimeout, "worker 1 (not yet reported where it runs) still starting", started=4)),
    ("starting", "hang", "warm", Fails(WorkerStartupTimeout, "worker 1 (not yet reported where it runs) still starting", started=4)),
    ("starting", "hang", "fresh", Fails(WorkerStartupTimeout, "worker 1 (not yet reported where it runs) still starting", started=4)),
    ("starting", "hang", "spare", Fails(WorkerStartupTimeout, "worker 1 (not yet reported where it runs) still starting", started=5)),
    ("starting", "hang", "elastic", Fails(WorkerStartupTimeout, "worker 1 (not yet reported where it runs) still starting", started=4)),
    ("starting", "lose-node", "none", Fails(WorkerGroupError, "root cause: worker 1 before it reported where it runs", started=4)),
    ("starting", "lose-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("starting", "lose-node", "fresh", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("starting", "lose-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("starting", "lose-node", "elastic", Ok(attempt=1, size=3, started=7)),
    ("starting", "interrupt", "none", Fails(KeyboardInterrupt, "", started=4)),
    ("starting", "interrupt", "warm", Fails(KeyboardInterrupt, "", started=4)),
    ("starting", "interrupt", "fresh", Fails(KeyboardInterrupt, "", started=4)),
    ("starting", "interrupt", "spare", Fails(KeyboardInterrupt, "", started=5)),
    ("starting", "interrupt", "elastic", Fails(KeyboardInterrupt, "", started=4)),
    ("initialising", "raise", "none", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("initialising", "raise", "warm", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("initialising", "raise", "fresh", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("initialising", "raise", "spare", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=5)),
    ("initialising", "raise", "elastic", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("initialising", "die", "none", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("initialising", "die", "warm", Ok(attempt=1, size=4, started=8)),
    ("initialising", "die", "fresh", Ok(attempt=1, size=4, started=8)),
    ("initialising", "die", "spare", Ok(attempt=1, size=4, started=10)),
    ("initialising", "die", "elastic", Ok(attempt=1, size=4, started=8)),
    ("initialising", "hang", "none", Fails(WorkerStartupTimeout, "rank 1 (node node-a, 10.0.0.65) still initialising", started=4)),
    ("initialising", "hang", "warm", Fails(WorkerStartupTimeout, "rank 1 (node node-a, 10.0.0.65) still initialising", started=4)),
    ("initialising", "hang", "fresh", Fails(WorkerStartupTimeout, "rank 1 (node node-a, 10.0.0.65) still initialising", started=4)),
    ("initialising", "hang", "spare", Fails(WorkerStartupTimeout, "rank 1 (node node-a, 10.0.0.65) still initialising", started=5)),
    ("initialising", "hang", "elastic", Fails(WorkerStartupTimeout, "rank 1 (node node-a, 10.0.0.65) still initialising", started=4)),
    ("initialising", "lose-node", "none", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("initialising", "lose-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("initialising", "lose-node", "fresh", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("initialising", "lose-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("initialising", "lose-node", "elastic", Ok(attempt=1, size=3, started=7)),
    ("initialising", "interrupt", "none", Fails(KeyboardInterrupt, "", started=4)),
    ("initialising", "interrupt", "warm", Fails(KeyboardInterrupt, "", started=4)),
    ("initialising", "interrupt", "fresh", Fails(KeyboardInterrupt, "", started=4)),
    ("initialising", "interrupt", "spare", Fails(KeyboardInterrupt, "", started=5)),
    ("initialising", "interrupt", "elastic", Fails(KeyboardInterrupt, "", started=4)),
    ("running", "raise", "none", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("running", "raise", "warm", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("running", "raise", "fresh", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("running", "raise", "spare", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=5)),
    ("running", "raise", "elastic", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("running", "die", "none", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("running", "die", "warm", Ok(attempt=1, size=4, started=5)),
    ("running", "die", "fresh", Ok(attempt=1, size=4, started=8)),
    ("running", "die", "spare", Ok(attempt=1, size=4, started=5)),
    ("running", "die", "elastic", Ok(attempt=1, size=4, started=5)),
    ("running", "hang", "none", Fails(WorkerGroupTimeout, "rank 1 had not finished", started=4)),
    ("running", "hang", "warm", Fails(WorkerGroupTimeout, "rank 1 had not finished", started=4)),
    ("running", "hang", "fresh", Fails(WorkerGroupTimeout, "rank 1 had not finished", started=4)),
    ("running", "hang", "spare", Fails(WorkerGroupTimeout, "rank 1 had not finished", started=5)),
    ("running", "hang", "elastic", Fails(WorkerGroupTimeout, "rank 1 had not finished", started=4)),
    ("running", "lose-node", "none", Fails(WorkerGroupError, "root cause: rank 1 on node node-a", started=4)),
    ("running", "lose-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("running", "lose-node", "fresh", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("running", "lose-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("running", "lose-node", "elastic", Ok(attempt=1, size=3, started=5)),
    ("running", "interrupt", "none", Fails(KeyboardInterrupt, "", started=4)),
    ("running", "interrupt", "warm", Fails(KeyboardInterrupt, "", started=4)),
    ("running", "interrupt", "fresh", Fails(KeyboardInterrupt, "", started=4)),
    ("running", "interrupt", "spare", Fails(KeyboardInterrupt, "", started=5)),
    ("running", "interrupt", "elastic", Fails(KeyboardInterrupt, "", started=4)),
    ("settling", "raise", "warm", Ok(attempt=1, size=4, started=5)),
    ("settling", "raise", "fresh", Ok(attempt=1, size=4, started=8)),
    ("settling", "raise", "spare", Ok(attempt=1, size=4, started=5)),
    ("settling", "raise", "elastic", Ok(attempt=1, size=4, started=5)),
    ("settling", "die", "warm", Ok(attempt=1, size=4, started=6)),
    ("settling", "die", "fresh", Ok(attempt=1, size=4, started=8)),
    ("settling", "die", "spare", Ok(attempt=1, size=4, started=6)),
    ("settling", "die", "elastic", Ok(attempt=1, size=4, started=6)),
    ("settling", "hang", "warm", Ok(attempt=1, size=4, started=6)),
    ("settling", "hang", "fresh", Ok(attempt=1, size=4, started=8)),
    ("settling", "hang", "spare", Ok(attempt=1, size=4, started=6)),
    ("settling", "hang", "elastic", Ok(attempt=1, size=4, started=6)),
    ("settling", "lose-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("settling", "lose-node", "fresh", Ok(attempt=1, size=4, started=8)),
    ("settling", "lose-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("settling", "lose-node", "elastic", Ok(attempt=1, size=3, started=5)),
    ("settling", "interrupt", "warm", Fails(KeyboardInterrupt, "", started=4)),
    ("settling", "interrupt", "fresh", Fails(KeyboardInterrupt, "", started=8)),
    ("settling", "interrupt", "spare", Fails(KeyboardInterrupt, "", started=5)),
    ("settling", "interrupt", "elastic", Fails(KeyboardInterrupt, "", started=4)),
    ("spare joining", "raise", "spare", Ok(attempt=1, size=4, started=10)),
    ("spare joining", "die", "spare", Ok(attempt=1, size=4, started=10)),
    ("spare joining", "hang", "spare", Ok(attempt=1, size=4, started=10)),
    ("spare joining", "lose-node", "spare", Fails(InfeasibleResourcesError, "at most 4 such workers fit", started=5)),
    ("spare joining", "interrupt", "spare", Fails(KeyboardInterrupt, "", started=5)),
    ("rebuilding", "raise", "warm", Ok(attempt=1, size=4, started=9)),
    ("rebuilding", "raise", "fresh", Fails(WorkerGroupError, "root cause: worker 0 before it reported where it runs", started=8)),
    ("rebuilding", "raise", "spare", Ok(attempt=1, size=4, started=10)),
    ("rebuilding", "raise", "elastic", Ok(attempt=1, size=4, started=9)),
    ("rebuilding", "die", "warm", Ok(attempt=1, size=4, started=9)),
    ("rebuilding", "die", "fresh", Fails(WorkerGroupError, "root cause: worker 0 before it reported where it runs", started=8)),
    ("rebuilding", "die", "spare", Ok(attempt=1, size=4, started=10)),
    ("rebuilding", "die", "elastic", Ok(attempt=1, size=4, started=9)),
    ("rebuilding", "hang", "warm", Ok(attempt=1, size=4, started=9)),
    ("rebuilding", "hang", "fresh", Fails(WorkerStartupTimeout, "worker 0 (not yet reported where it runs) still starting", started=8)),
    ("rebuilding", "hang", "spare", Ok(attempt=1, size=4, started=10)),
    ("rebuilding", "hang", "elastic", Ok(attempt=1, size=4, started=9)),
    ("rebuilding", "lose-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("rebuilding", "lose-node", "fresh", Fails(WorkerGroupError, "root cause: worker 0 before it reported where it runs", started=8)),
    ("rebuilding", "lose-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("rebuilding", "lose-node", "elastic", Ok(attempt=1, size=3, started=8)),
    ("rebuilding", "interrupt", "warm", Fails(KeyboardInterrupt, "", started=5)),
    ("rebuilding", "interrupt", "fresh", Fails(KeyboardInterrupt, "", started=8)),
    ("rebuilding", "interrupt", "spare", Fails(KeyboardInterrupt, "", started=5)),
    ("rebuilding", "interrupt", "elastic", Fails(KeyboardInterrupt, "", started=5)),
    ("re-initialising", "raise", "warm", Ok(attempt=1, size=4, started=9)),
    ("re-initialising", "raise", "fresh", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=8)),
    ("re-initialising", "raise", "spare", Ok(attempt=1, size=4, started=10)),
    ("re-initialising", "raise", "elastic", Ok(attempt=1, size=4, started=9)),
    ("re-initialising", "die", "warm", Ok(attempt=1, size=4, started=9)),
    ("re-initialising", "die", "fresh", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=8)),
    ("re-initialising", "die", "spare", Ok(attempt=1, size=4, started=10)),
    ("re-initialising", "die", "elastic", Ok(attempt=1, size=4, started=9)),
    ("re-initialising", "hang", "warm", Ok(attempt=1, size=4, started=9)),
    ("re-initialising", "hang", "fresh", Fails(WorkerStartupTimeout, "rank 0 (node node-a, 10.0.0.65) still initialising", started=8)),
    ("re-initialising", "hang", "spare", Ok(attempt=1, size=4, started=10)),
    ("re-initialising", "hang", "elastic", Ok(attempt=1, size=4, started=9)),
    ("re-initialising", "lose-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("re-initialising", "lose-node", "fresh", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=8)),
    ("re-initialising", "lose-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("re-initialising", "lose-node", "elastic", Ok(attempt=1, size=3, started=8)),
    ("re-initialising", "interrupt", "warm", Fails(KeyboardInterrupt, "", started=5)),
    ("re-initialising", "interrupt", "fresh", Fails(KeyboardInterrupt, "", started=8)),
    ("re-initialising", "interrupt", "spare", Fails(KeyboardInterrupt, "", started=5)),
    ("re-initialising", "interrupt", "elastic", Fails(KeyboardInterrupt, "", started=5)),
    ("rerunning", "raise", "warm", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=5)),
    ("rerunning", "raise", "fresh", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=8)),
    ("rerunning", "raise", "spare", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=5)),
    ("rerunning", "raise", "elastic", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=5)),
    ("rerunning", "die", "warm", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=5)),
    ("rerunning", "die", "fresh", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=8)),
    ("rerunning", "die", "spare", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=5)),
    ("rerunning", "die", "elastic", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=5)),
    ("rerunning", "hang", "warm", Fails(WorkerGroupTimeout, "rank 0 had not finished", started=5)),
    ("rerunning", "hang", "fresh", Fails(WorkerGroupTimeout, "rank 0 had not finished", started=8)),
    ("rerunning", "hang", "spare", Fails(WorkerGroupTimeout, "rank 0 had not finished", started=6)),
    ("rerunning", "hang", "elastic", Fails(WorkerGroupTimeout, "rank 0 had not finished", started=5)),
    ("rerunning", "lose-node", "warm", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=5)),
    ("rerunning", "lose-node", "fresh", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=8)),
    ("rerunning", "lose-node", "spare", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=5)),
    ("rerunning", "lose-node", "elastic", Fails(WorkerGroupError, "root cause: rank 0 on node node-a", started=5)),
    ("rerunning", "interrupt", "warm", Fails(KeyboardInterrupt, "", started=5)),
    ("rerunning", "interrupt", "fresh", Fails(KeyboardInterrupt, "", started=8)),
    ("rerunning", "interrupt", "spare", Fails(KeyboardInterrupt, "", started=5)),
    ("rerunning", "interrupt", "elastic", Fails(KeyboardInterrupt, "", started=5)),
    ("shutting down", "raise", "none", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "raise", "warm", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "raise", "fresh", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "raise", "spare", Ok(attempt=0, size=4, started=5)),
    ("shutting down", "raise", "elastic", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "die", "none", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "die", "warm", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "die", "fresh", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "die", "spare", Ok(attempt=0, size=4, started=5)),
    ("shutting down", "die", "elastic", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "hang", "none", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "hang", "warm", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "hang", "fresh", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "hang", "spare", Ok(attempt=0, size=4, started=5)),
    ("shutting down", "hang", "elastic", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "lose-node", "none", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "lose-node", "warm", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "lose-node", "fresh", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "lose-node", "spare", Ok(attempt=0, size=4, started=5)),
    ("shutting down", "lose-node", "elastic", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "interrupt", "none", Fails(KeyboardInterrupt, "", started=4)),
    ("shutting down", "interrupt", "warm", Fails(KeyboardInterrupt, "", started=4)),
    ("shutting down", "interrupt", "fresh", Fails(KeyboardInterrupt, "", started=4)),
    ("shutting down", "interrupt", "spare", Fails(KeyboardInterrupt, "", started=5)),
    ("shutting down", "interrupt", "elastic", Fails(KeyboardInterrupt, "", started=4)),
    # A drain: the node goes 20 s after its notice, under a call that runs 60 s; the
    # notice's SIGTERM ends the ranks there at once (the fake's code has no handler), so
    # an elastic world shrinks to the nodes that stay instead of waiting for the node to go.
    # A preemption is not counted against max_restarts, so even "none" restarts.
    ("starting", "drain-node", "none", Fails(WorkerGroupError, "root cause: worker 1 before it reported where it runs", started=4)),
    ("starting", "drain-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("starting", "drain-node", "fresh", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("starting", "drain-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("starting", "drain-node", "elastic", Ok(attempt=1, size=3, started=7)),
    ("initialising", "drain-node", "none", Fails(WorkerGroupError, "root cause: rank 1 on node node-a (10.0.0.65)", started=4)),
    ("initialising", "drain-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("initialising", "drain-node", "fresh", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("initialising", "drain-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("initialising", "drain-node", "elastic", Ok(attempt=1, size=3, started=7)),
    ("running", "drain-node", "none", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("running", "drain-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("running", "drain-node", "fresh", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("running", "drain-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("running", "drain-node", "elastic", Ok(attempt=1, size=2, started=4)),
    ("settling", "drain-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=4)),
    ("settling", "drain-node", "fresh", Ok(attempt=1, size=4, started=8)),
    ("settling", "drain-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("settling", "drain-node", "elastic", Ok(attempt=1, size=2, started=4)),
    ("spare joining", "drain-node", "spare", Fails(InfeasibleResourcesError, "at most 4 such workers fit", started=5)),
    ("rebuilding", "drain-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("rebuilding", "drain-node", "fresh", Fails(WorkerGroupError, "root cause: worker 0 before it reported where it runs", started=8)),
    ("rebuilding", "drain-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("rebuilding", "drain-node", "elastic", Ok(attempt=1, size=3, started=8)),
    ("re-initialising", "drain-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("re-initialising", "drain-node", "fresh", Fails(WorkerGroupError, "root cause: rank 0 on node node-a (10.0.0.65)", started=8)),
    ("re-initialising", "drain-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("re-initialising", "drain-node", "elastic", Ok(attempt=1, size=3, started=8)),
    ("rerunning", "drain-node", "warm", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=5)),
    ("rerunning", "drain-node", "fresh", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=8)),
    ("rerunning", "drain-node", "spare", Fails(InfeasibleResourcesError, "at most 3 such workers fit", started=6)),
    ("rerunning", "drain-node", "elastic", Ok(attempt=2, size=2, started=5)),
    ("shutting down", "drain-node", "none", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "drain-node", "warm", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "drain-node", "fresh", Ok(attempt=0, size=4, started=4)),
    ("shutting down", "drain-node", "spare", Ok(attempt=0, size=4, started=5)),
    ("shutting down", "drain-node", "elastic", Ok(attempt=0, size=4, started=4)),
]


def run(faults: List[Fault], mode: str, cluster: Optional[FakeCluster] = None, **options: Any) -> Tuple[FakeCluster, Outcome]:
    cluster = cluster or FakeCluster(NODES, faults)
    config = RunConfig(**{"flight_recorder": False, "timeout": 60, "startup_timeout": 30, **MODES[mode], **options})
    try:
        values = run_call(
            RunController(cluster, config, fresh_restarts=True), prepare_call(cluster, lambda: (current_rank(), current_attempt()))
        )
    except BaseException as error:  # noqa: BLE001 - KeyboardInterrupt included: what the user gets
        return cluster, Fails(type(error), str(error), len(cluster.processes.workers))
    assert [rank for rank, _ in values] == list(range(len(values)))  # each rank's value, in rank order
    assert len({attempt for _, attempt in values}) == 1  # all from one world
    return cluster, Ok(values[0][1], len(values), len(cluster.processes.workers))


def assert_outcome(outcome: Outcome, expected: Outcome) -> None:
    """The run ended as ``expected``: the same values' world, or the same error naming what it says."""
    if isinstance(expected, Fails):
        assert isinstance(outcome, Fails) and outcome.error is expected.error, outcome
        assert expected.says in outcome.says and outcome.started == expected.started, outcome
    else:
        assert outcome == expected


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="raydist")


@pytest.mark.parametrize(("moment", "kind", "mode", "expected"), TABLE, ids=[f"{m}-{k}-{o}" for m, k, o, _ in TABLE])
def test_a_fault_at_each_moment(moment: str, kind: str, mode: str, expected: Outcome) -> None:
    faults = [
        Fault(method, chosen or kind, who=who, nth=nth, seconds=0 if chosen else LONG_CALL_S)
        for method, chosen, who, nth in MOMENTS[moment]
    ]
    cluster, outcome = run(faults, mode)
    assert all(fault.fired for fault in faults)
    assert_outcome(outcome, expected)
    assert cluster.leftovers() == []


def test_the_table_covers_every_moment_fault_and_mode() -> None:
    covered = {(moment, kind) for moment, kind, _, _ in TABLE}
    assert covered == {(moment, kind) for moment in MOMENTS for kind in ("raise", "die", "hang", "lose-node", "drain-node", "interrupt")}
    assert {mode for _, _, mode, _ in TABLE} == set(MODES)
    assert len(TABLE) + len(WAITING) >= 80
    assert {kind for kind, _, _ in WAITING} == {"room", "hang", "lose-node", "drain-node", "interrupt"}


# A hang acted on (hang_timeout=5): rank 1 never reaches all_reduce #3, the others
# wait in it (``HUNG``): in the first call, or in the call retried after rank 1 died
# (the restart then spent). The rank is killed at the timeout, the others' collective
# fails (their peer gone), and the death is decided on as any other.
HANG_TIMEOUT_S = 5.0
HUNG_MOMENTS: Dict[str, int] = {"running": 0, "rerunning": 1}  # the call (nth execute) the ranks hang in
NEVER_ARRIVED = "killed by raydist: it did not reach all_reduce #3 (float32 [1]), which ranks 0, 2-3 waited in for"
HUNG: List[Tuple[str, str, Outcome]] = [
    ("running", "none", Fails(WorkerGroupError, NEVER_ARRIVED, started=4)),
    ("running", "warm", Ok(attempt=1, size=4, started=5)),
    ("running", "fresh", Ok(attempt=1, size=4, started=8)),
    ("running", "spare", Ok(attempt=1, size=4, started=5)),
    ("running", "elastic", Ok(attempt=1, size=4, started=5)),
    ("rerunning", "warm", Fails(WorkerGroupError, NEVER_ARRIVED, started=5)),
    ("rerunning", "fresh", Fails(WorkerGroupError, NEVER_ARRIVED, started=8)),
    ("rerunning", "spare", Fails(WorkerGroupError, NEVER_ARRIVED, started=6)),  # the used spare refilled meanwhile (5 s on)
    ("rerunning", "elastic", Fails(WorkerGroupError, NEVER_ARRIVED, started=5)),
]


@pytest.mark.parametrize(("moment", "mode", "expected"), HUNG, ids=[f"{m}-{o}" for m, o, _ in HUNG])
def test_a_rank_that_never_reaches_a_collective_at_each_moment(moment: str, mode: str, expected: Outcome) -> None:
    nth = HUNG_MOMENTS[moment]
    faults = [Fault(*DEATH)] if nth else []
    faults += [Fault("execute", "hang", who=rank, nth=nth, collective=3, entered=rank != 1) for rank in range(4)]
    cluster, outcome = run(faults, mode, flight_recorder=True, hang_timeout=HANG_TIMEOUT_S)
    assert all(fault.fired for fault in faults)
    assert_outcome(outcome, expected)
    assert cluster.monotonic() < 60  # the hang timeout acted, not the call's own timeout
    assert cluster.leftovers() == []


# A straggler (rank 1 enters every all_reduce 200 ms late; its call would take 60 s) in
# the first call, or in the call retried after rank 1 died (the restart then spent).
# With a spare, straggler_action="replace" (the default windows) puts the spare in its
# place, not counted; without one (replace needs a spare), it is only reported and the
# call runs to its end.
STRAGGLED: List[Tuple[str, str, Outcome]] = [
    ("running", "none", Ok(attempt=0, size=4, started=4)),
    ("running", "warm", Ok(attempt=0, size=4, started=4)),
    ("running", "fresh", Ok(attempt=0, size=4, started=4)),
    ("running", "spare", Ok(attempt=1, size=4, started=5)),
    ("running", "elastic", Ok(attempt=0, size=4, started=4)),
    ("rerunning", "warm", Ok(attempt=1, size=4, started=5)),
    ("rerunning", "fresh", Ok(attempt=1, size=4, started=8)),
    ("rerunning", "spare", Ok(attempt=2, size=4, started=6)),
    ("rerunning", "elastic", Ok(attempt=1, size=4, started=5)),
]


@pytest.mark.parametrize(("moment", "mode", "expected"), STRAGGLED, ids=[f"{m}-{o}" for m, o, _ in STRAGGLED])
def test_a_straggler_at_each_moment(moment: str, mode: str, expected: Outcome) -> None:
    nth = HUNG_MOMENTS[moment]
    faults = [Fault(*DEATH)] if nth else []
    faults.append(Fault("execute", "straggle", who=1, nth=nth, seconds=LONG_CALL_S - 1, late=0.2))
    replacing = {"straggler_action": "replace"} if MODES[mode].get("spare_workers") else {}
    cluster, outcome = run(faults, mode, flight_recorder=True, **replacing)
    assert all(fault.fired for fault in faults)
    assert_outcome(outcome, expected)
    assert cluster.leftovers() == []


# The pre-flight check (health_check="quick") finds node-b's workers healthy, slow
# (10 GFLOP/s against 100) or failing their probe. An unhealthy node is excluded:
# spares fill in, an elastic world shrinks, else the workers are placed again
# without it; here no placement without node-b fits 4 (node-a 2 + node-c 1).
NO_ROOM_WITHOUT_B = "(health check: {left} healthy worker(s) left, 4 needed: node node-b: {why})"
SLOW_WHY = "10 GFLOP/s, below 0.5 x the median 100 GFLOP/s"  # node-b against the other nodes' workers
FAILED_WHY = "its probe failed: RuntimeError: the device did not answer"
SPEEDS = {"healthy": {}, "slow": {"node-b": 10.0}, "failed probe": {"node-b": 0.0}}
HEALTH: List[Tuple[str, str, Outcome]] = [
    ("healthy", "none", Ok(attempt=0, size=4, started=4)),
    ("healthy", "warm", Ok(attempt=0, size=4, started=4)),
    ("healthy", "fresh", Ok(attempt=0, size=4, started=4)),
    ("healthy", "spare", Ok(attempt=0, size=4, started=5)),
    ("healthy", "elastic", Ok(attempt=0, size=4, started=4)),
    ("slow", "none", Fails(InfeasibleResourcesError, NO_ROOM_WITHOUT_B.format(left=2, why=SLOW_WHY), started=4)),
    ("slow", "warm", Fails(InfeasibleResourcesError, NO_ROOM_WITHOUT_B.format(left=2, why=SLOW_WHY), started=4)),
    ("slow", "fresh", Fails(InfeasibleResourcesError, NO_ROOM_WITHOUT_B.format(left=2, why=SLOW_WHY), started=4)),
    ("slow", "spare", Fails(InfeasibleResourcesError, NO_ROOM_WITHOUT_B.format(left=3, why=SLOW_WHY), started=5)),
    ("slow", "elastic", Ok(attempt=0, size=2, started=4)),
    ("failed probe", "none", Fails(InfeasibleResourcesError, NO_ROOM_WITHOUT_B.format(left=2, why=FAILED_WHY), started=4)),
    ("failed probe", "warm", Fails(InfeasibleResourcesError, NO_ROOM_WITHOUT_B.format(left=2, why=FAILED_WHY), started=4)),
    ("failed probe", "fresh", Fails(InfeasibleResourcesError, NO_ROOM_WITHOUT_B.format(left=2, why=FAILED_WHY), started=4)),
    ("failed probe", "spare", Fails(InfeasibleResourcesError, NO_ROOM_WITHOUT_B.format(left=3, why=FAILED_WHY), started=5)),
    ("failed probe", "elastic", Ok(attempt=0, size=2, started=4)),
]


@pytest.mark.parametrize(("verdict", "mode", "expected"), HEALTH, ids=[f"{v}-{m}" for v, m, _ in HEALTH])
def test_a_health_verdict_in_each_mode(verdict: str, mode: str, expected: Outcome) -> None:
    cluster, outcome = run([], mode, FakeCluster(NODES, speeds=SPEEDS[verdict]), health_check="quick")
    assert_outcome(outcome, expected)
    assert cluster.leftovers() == []


# Waiting for placement: another program holds node-a's 2 CPUs until 5 s in
# ("hang": for good); at 2 s node-b is lost or starts draining, or Ctrl-C
# arrives. No worker exists yet, so nothing can raise or die. An elastic run
# starts at once with the 3 that fit.
WAITING: List[Tuple[str, str, Outcome]] = [
    ("room", "none", Ok(attempt=0, size=4, started=4)),
    ("room", "warm", Ok(attempt=0, size=4, started=4)),
    ("room", "fresh", Ok(attempt=0, size=4, started=4)),
    ("room", "spare", Ok(attempt=0, size=4, started=5)),
    ("room", "elastic", Ok(attempt=0, size=3, started=3)),
    ("hang", "none", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("hang", "warm", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("hang", "fresh", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("hang", "spare", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("hang", "elastic", Ok(attempt=0, size=3, started=3)),
    ("lose-node", "none", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("lose-node", "warm", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("lose-node", "fresh", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("lose-node", "spare", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("lose-node", "elastic", Ok(attempt=0, size=3, started=3)),
    ("drain-node", "none", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("drain-node", "warm", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("drain-node", "fresh", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("drain-node", "spare", Fails(InfeasibleResourcesError, "gave up after 30 s", started=0)),
    ("drain-node", "elastic", Ok(attempt=0, size=3, started=3)),
    ("interrupt", "none", Fails(KeyboardInterrupt, "", started=0)),
    ("interrupt", "warm", Fails(KeyboardInterrupt, "", started=0)),
    ("interrupt", "fresh", Fails(KeyboardInterrupt, "", started=0)),
    ("interrupt", "spare", Fails(KeyboardInterrupt, "", started=0)),
    ("interrupt", "elastic", Ok(attempt=0, size=3, started=3)),
]


@pytest.mark.parametrize(("kind", "mode", "expected"), WAITING, ids=[f"waiting-{k}-{m}" for k, m, _ in WAITING])
def test_a_fault_while_waiting_for_placement(kind: str, mode: str, expected: Outcome) -> None:
    cluster = FakeCluster(NODES)
    other = cluster.nodes.occupy("node-a", {"CPU": 2})  # another program's placement
    if kind != "hang":
        cluster.after(5.0, lambda: cluster.free(other), "fake-room")
    strike = {
        "lose-node": lambda: cluster.lose_node("node-b"),
        "drain-node": lambda: cluster.drain_node("node-b", cluster.time() + 20.0),
        "interrupt": cluster.clock.interrupt,
    }.get(kind)
    if strike is not None:
        cluster.after(2.0, strike, "fake-fault")
    _, outcome = run([], mode, cluster=cluster)
    assert_outcome(outcome, expected)
    cluster.free(other)
    assert cluster.leftovers() == []


KINDS = ("raise", "die", "hang", "lose-node", "drain-node", "interrupt")
# Weighted towards faults that strike: every run describes, sets up and calls
# each rank once; restarts do it again (nth 1); slot 4 is the spare's.
FAULTS = st.builds(
    Fault,
    method=st.sampled_from(("describe", "setup", "execute", "execute", "teardown", "stand_by", "ping")),
    kind=st.sampled_from(KINDS),
    who=st.sampled_from((0, 1, 2, 3, 4)),
    nth=st.sampled_from((0, 0, 0, 1, 2)),
)
ENDINGS = (WorkerGroupError, WorkerGroupTimeout, WorkerStartupTimeout, InfeasibleResourcesError, KeyboardInterrupt)


@settings(max_examples=1000, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(faults=st.lists(FAULTS, max_size=4), mode=st.sampled_from(sorted(MODES)))
def test_random_fault_schedules_keep_the_engines_promises(faults: List[Fault], mode: str) -> None:
    """Thousands of fault sequences (derandomized: the same ones every run, so a
    failure replays): every run ends with the values of one world or one of the
    documented errors, restarts no more than allowed, and leaves nothing behind;
    without restarts, a single rank that raised or died is the root cause named."""
    cluster, outcome = run(faults, mode)
    assert cluster.leftovers() == []
    preemptions = sum(fault.kind == "drain-node" for fault in cluster.faults.fired)  # restarts not counted
    allowed = MODES[mode].get("max_restarts", 0) + preemptions
    if isinstance(outcome, Ok):
        low, high = (4, 4) if isinstance(MODES[mode]["num_workers"], int) else MODES[mode]["num_workers"]
        assert outcome.attempt <= allowed and low <= outcome.size <= high, outcome
    else:
        assert issubclass(outcome.error, ENDINGS), outcome
    if mode == "none" and len(cluster.faults.fired) == 1:
        fault = cluster.faults.fired[0]
        if fault.kind in ("raise", "die") and fault.method in ("setup", "execute"):
            assert isinstance(outcome, Fails) and f"root cause: rank {fault.who} " in outcome.says, (fault, outcome)


# A user's request from another thread at every moment a run has begun: a
# shutdown() ends it (unless every rank's value came back first; the failure
# it was restarting for, if any, is what the call raises), never waits on
# what never comes, and leaves nothing behind.
# (Ctrl-C at every moment is the table's "interrupt" column.)
REQUESTS = [
    (moment, mode)
    for moment in MOMENTS
    if moment not in ("starting", "initialising")  # no run to shut down yet: Ctrl-C only (the table's)
    for mode in sorted(MODES)
    if moment != "spare joining" or mode == "spare"
]


@pytest.mark.parametrize(("moment", "mode"), REQUESTS, ids=[f"{moment}-{mode}" for moment, mode in REQUESTS])
def test_a_shutdown_from_another_thread_at_each_moment(moment: str, mode: str) -> None:
    holder: List[RunController] = []
    faults = [
        Fault(method, chosen, who=who, nth=nth) if chosen else Fault(method, "act", who=who, nth=nth, action=lambda: holder[0].shutdown())
        for method, chosen, who, nth in MOMENTS[moment]
    ]
    cluster = FakeCluster(NODES, faults)
    config = RunConfig(flight_recorder=False, timeout=60, startup_timeout=30, **MODES[mode])
    run = RunController(cluster, config, fresh_restarts=True)
    holder.append(run)
    try:
        values: Any = run_call(run, prepare_call(cluster, current_rank))
    except (WorkerGroupClosed, WorkerGroupError) as error:
        values = error
    if moment == "shutting down":
        assert values == [0, 1, 2, 3]  # every rank's value was back before the teardown
    else:  # the call's end may come first (its values), else the stop's, or the failure a restart was for
        assert values == [0, 1, 2, 3] or isinstance(values, (WorkerGroupClosed, WorkerGroupError)), values
    assert cluster.monotonic() < config.survivor_timeout + config.startup_timeout + 60  # never waits on what never comes
    assert cluster.leftovers() == []
