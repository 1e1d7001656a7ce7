"""Several calls in flight on one ``WorkerGroup`` (the fake cluster): a
fault schedule ends the run the same way whatever order the futures are
read in, from one thread or from several, and whatever stops it meanwhile.

Hypothesis draws the faults (a rank that raises, dies or loses its node, in
any of the calls), how many calls are in flight, whether a spare is ready
and a restart allowed, a read order, whether each future is read on a
thread of its own, and what else happens at a drawn moment (rank 0's n-th
call): nothing, a ``cancel()`` of one of the calls, a ``shutdown()`` from
another thread, or Ctrl-C. Both runs of the schedule (calls read oldest
first on one thread, and as drawn) must agree on where the group is (its
phase, attempt and restarts used: one restart for one failure) and on how
every call ended: its values, or the error's type, whether the group
restarted in place and the rank it names as the root cause (safety: each
call ends once, within the restart budget, nothing left after the
shutdown). Liveness: a group left running serves the next call with every
rank's value, and every run ends within a bound of virtual time.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raydist.config import RunConfig
from raydist.errors import RaydistError
from raydist.pool.driver.calls import WorkerFuture
from raydist.pool.driver.group import WorkerGroup
from raydist.pool.records import GroupPhase
from raydist.testing.fake import FakeCluster, Fault
from raydist.testing.workers import current_rank

NODES = {"node-a": {"CPU": 2}, "node-b": {"CPU": 2}, "node-c": {"CPU": 2}}
FAULTS = st.builds(
    Fault,
    method=st.just("execute"),
    kind=st.sampled_from(("raise", "die", "die", "lose-node")),
    who=st.sampled_from((0, 1, 2, 3)),
    nth=st.sampled_from((0, 0, 1, 2)),
)
# What else happens, at rank 0's n-th call: (what, n, which call a cancel is for).
STOPS = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(("cancel", "shutdown", "interrupt")), st.integers(0, 2), st.integers(0, 2)),
)
# Each fault costs at most a survivor timeout (10 s) and a wait for seats (startup_timeout, 30 s here);
# the group's timeout (60 s) bounds a stuck call.
VIRTUAL_BOUND_S = 3 * (10 + 30) + 60 + 60


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="raydist")


def ending(outcome: Any) -> Tuple[str, Any, Any]:
    if isinstance(outcome, RaydistError):
        root = getattr(outcome, "root_cause", None)
        return type(outcome).__name__, outcome.restarted_in_place, None if root is None else root.rank
    return "values", outcome, None


def stop_fault(stop: Optional[Tuple[str, int, int]], calls: int, holder: List[Any]) -> List[Fault]:
    """The drawn stop, as the fake's fault at rank 0's n-th call (another thread's act, or Ctrl-C)."""
    if stop is None or stop[1] >= calls:
        return []
    what, nth, which = stop
    if what == "interrupt":
        return [Fault("execute", "interrupt", who=0, nth=nth)]
    act: Callable[[], Any] = (lambda: holder[0].shutdown()) if what == "shutdown" else (lambda: holder[1][which % calls].cancel())
    return [Fault("execute", "act", who=0, nth=nth, action=act)]


def read_all(futures: Sequence[WorkerFuture], order: Sequence[int], threads: bool) -> List[Any]:
    outcomes: List[Any] = [None] * len(futures)

    def read(index: int) -> None:
        try:
            outcomes[index] = futures[index].result()
        except KeyboardInterrupt:  # landed in this reader; the call itself ended as the stop says: read again
            read(index)
        except RaydistError as error:
            outcomes[index] = error

    if not threads:
        for index in order:
            read(index)
        return outcomes
    readers = [threading.Thread(target=read, args=(index,)) for index in order]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(timeout=120)
    assert not any(reader.is_alive() for reader in readers)
    return outcomes


def run(
    faults: Sequence[Fault], calls: int, order: Sequence[int], threads: bool, stop: Optional[Tuple[str, int, int]], **options: Any
) -> Tuple[List[Tuple[str, Any, Any]], Any]:
    holder: List[Any] = []
    # Faults strike the calls in flight (a rank's n-th execute), never the liveness check's call after them.
    chosen = [Fault(f.method, f.kind, f.who, f.nth) for f in faults if f.nth < calls]
    cluster = FakeCluster(NODES, chosen + stop_fault(stop, calls, holder))
    group = WorkerGroup(config=RunConfig(num_workers=4, flight_recorder=False, timeout=60, startup_timeout=30, **options), cluster=cluster)
    futures = [group.submit(current_rank) for _ in range(calls)]
    holder.extend([group, futures])
    outcomes = read_all(futures, order, threads)
    where = (group.phase, group.restart_count, group.restarts_used)
    assert group.restarts_used <= options.get("max_restarts", 0)
    unspent = [fault for fault in cluster.faults if not fault.fired]  # (a replaced rank's count of calls starts again)
    if group.phase is GroupPhase.RUNNING and not unspent:  # liveness: the group serves the next call, every rank's value
        assert group.run(current_rank) == [0, 1, 2, 3]
    elif group.phase is not GroupPhase.RUNNING:
        assert group.phase is GroupPhase.CLOSED
    assert cluster.monotonic() <= VIRTUAL_BOUND_S  # liveness: no schedule waits on what never comes
    group.shutdown()
    assert cluster.leftovers() == []
    return [ending(outcome) for outcome in outcomes], where


@settings(max_examples=1000, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(
    faults=st.lists(FAULTS, max_size=3),
    calls=st.integers(1, 3),
    max_restarts=st.integers(0, 2),
    spares=st.integers(0, 1),
    threads=st.booleans(),
    stop=STOPS,
    data=st.data(),
)
def test_calls_in_flight_end_the_same_whatever_the_read_order(
    faults: List[Fault], calls: int, max_restarts: int, spares: int, threads: bool, stop: Any, data: st.DataObject
) -> None:
    order = data.draw(st.permutations(range(calls)))
    options = dict(max_restarts=max_restarts, spare_workers=spares)
    endings, where = run(faults, calls, list(range(calls)), False, stop, **options)
    other_endings, other_where = run(faults, calls, order, threads, stop, **options)
    assert other_where == where, (faults, order, threads, stop)
    assert other_endings == endings, (faults, order, threads, stop)
