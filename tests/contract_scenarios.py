"""The engine's contract: scenarios that must end the same way on the fake
cluster (``tests/unit/driver/test_contract_fake.py``, every one in the unit
tier) and on a real Ray (``tests/live/test_contract.py``: a few in ``make
test``, all in ``make soak``). Where the two differ, the fake is wrong.

A scenario is what the user does (``raydist.run``, or a ``WorkerGroup`` with
calls in flight read in a given order, a ``shutdown()`` or ``cancel()`` from
another thread, Ctrl-C) and what goes wrong in the ranks (``Step``s). Code that
raises or exits is the user's function on both sides; a rank that dies or
hangs is a ``Fault`` on the fake and ``os._exit`` / a long sleep on Ray.
The ending every side must give (``Ending``) is written out, so both are
checked against the table, not only against each other.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

WORKERS = 2
HANG_S = 3600.0  # "never" for a hung rank on Ray; the group's timeout ends it
TIMEOUT_S = 8.0  # the group's timeout, where a scenario hangs a rank
NODE_TAKEN_S = 150.0  # how long a rank waits for the test to take its node away (on Ray), then says it did not


@dataclass(frozen=True)
class Step:
    """What rank ``rank`` does in its call number ``call`` (0: the first a world
    gets) of attempt ``attempt``: "die", "hang", "raise", "exit",
    "lose-node" (its node is taken away while it is in the call) or
    "drain-node" (its node is told to drain while it is in the call)."""

    kind: str
    rank: int
    attempt: int = 0
    call: int = 0


@dataclass(frozen=True)
class Ending:
    """How one call ended: its values' attempt, or the error type, whether the
    group restarted in place, and the root cause's rank (WorkerGroupError)."""

    kind: str  # "values" or the error's class name
    attempt: Optional[int] = None  # of the values (every rank's value comes from one world)
    restarted_in_place: bool = False
    root_rank: Optional[int] = None


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: Tuple[Step, ...]
    endings: Tuple[Ending, ...]  # one per call, in call order
    options: Dict[str, Any] = field(default_factory=dict)
    group: bool = False  # a WorkerGroup (else raydist.run)
    calls: int = 1  # sent before any is read (a WorkerGroup)
    read_order: Tuple[int, ...] = (0,)
    other_thread: Optional[str] = None  # "shutdown", "cancel" or "interrupt" (Ctrl-C), once rank 0 is in the first call
    phase: str = "closed"  # the group's phase after the calls were read
    restart_count: int = 0  # a WorkerGroup's attempt after the calls
    in_make_test: bool = False  # the live side runs in `make test` (else in soak)
    spread: bool = False  # one worker per node, a node to spare (else all on one node)


def rank_failed(rank: int, restarted: bool = False) -> Ending:
    return Ending("WorkerGroupError", restarted_in_place=restarted, root_rank=rank)


SCENARIOS: List[Scenario] = [
    Scenario("a crash, no restart", (Step("die", 1),), (rank_failed(1),), {"max_restarts": 0}, in_make_test=True),
    Scenario("a crash, one restart", (Step("die", 1),), (Ending("values", attempt=1),), {"max_restarts": 1}),
    Scenario(
        "a crash, a spare takes its place", (Step("die", 1),), (Ending("values", attempt=1),), {"max_restarts": 1, "spare_workers": 1}
    ),
    Scenario("a crash in each attempt, one restart", (Step("die", 1), Step("die", 0, attempt=1)), (rank_failed(0),), {"max_restarts": 1}),
    Scenario("code that raises", (Step("raise", 0),), (rank_failed(0),), {"max_restarts": 1}),
    Scenario(
        "code that raises, retried", (Step("raise", 1),), (Ending("values", attempt=1),), {"max_restarts": 1, "retry_on_exception": True}
    ),
    Scenario("an exit status", (Step("exit", 1),), (rank_failed(1),), {"max_restarts": 1}),
    Scenario("a hang, the group's timeout", (Step("hang", 1),), (Ending("WorkerGroupTimeout"),), {"timeout": TIMEOUT_S}),
    Scenario(
        "two calls in flight, a crash, read newest first",
        (Step("die", 1),),
        (rank_failed(1, restarted=True), rank_failed(1, restarted=True)),
        {"max_restarts": 1},
        group=True,
        calls=2,
        read_order=(1, 0),
        phase="running",
        restart_count=1,
        in_make_test=True,
    ),
    Scenario(
        "two calls in flight, a crash, read oldest first",
        (Step("die", 1),),
        (rank_failed(1, restarted=True), rank_failed(1, restarted=True)),
        {"max_restarts": 1},
        group=True,
        calls=2,
        read_order=(0, 1),
        phase="running",
        restart_count=1,
    ),
    Scenario(
        "two calls in flight, a crash, no restart, read newest first",
        (Step("die", 1),),
        (rank_failed(1), rank_failed(1)),
        group=True,
        calls=2,
        read_order=(1, 0),
    ),
    Scenario(
        "two calls in flight, a crash, no restart, read oldest first",
        (Step("die", 1),),
        (rank_failed(1), rank_failed(1)),
        group=True,
        calls=2,
        read_order=(0, 1),
    ),
    Scenario(
        "a group's crash with a spare",
        (Step("die", 0),),
        (rank_failed(0, restarted=True),),
        {"max_restarts": 1, "spare_workers": 1},
        group=True,
        phase="running",
        restart_count=1,
    ),
    Scenario(
        "a shutdown from another thread",
        (Step("hang", 1),),
        (Ending("WorkerGroupClosed"),),
        group=True,
        other_thread="shutdown",
        in_make_test=True,
    ),
    Scenario("a cancel from another thread", (Step("hang", 1),), (Ending("WorkerCallCancelled"),), group=True, other_thread="cancel"),
    Scenario("a node lost, one restart", (Step("lose-node", 1),), (Ending("values", attempt=1),), {"max_restarts": 1}, spread=True),
    Scenario("a node lost, no restart", (Step("lose-node", 1),), (rank_failed(1),), {"max_restarts": 0}, spread=True),
    Scenario(
        "a group's node lost, one restart",
        (Step("lose-node", 1),),
        (rank_failed(1, restarted=True),),
        {"max_restarts": 1},
        group=True,
        phase="running",
        restart_count=1,
        spread=True,
    ),
    # A drain (a spot preemption): the notice's SIGTERM ends rank 1 (its code has no handler); the
    # elastic world goes on without its node, the restart not counted against max_restarts.
    Scenario(
        "a node drained, the world shrinks",
        (Step("drain-node", 1),),
        (Ending("values", attempt=1),),
        {"max_restarts": 0, "num_workers": (1, WORKERS), "restart_to_grow": False},
        spread=True,
    ),
    # Ctrl-C lands in the thread that reads; the call itself ends with the stop (read again: WorkerGroupClosed).
    Scenario("Ctrl-C while a call runs", (Step("hang", 1),), (Ending("KeyboardInterrupt"),), group=True, other_thread="interrupt"),
]


def rank_and_attempt() -> Tuple[int, int]:
    """This rank and attempt: from the fake worker running the call, else from raydist."""
    try:
        from raydist.testing.workers import current_attempt, current_rank

        return current_rank(), current_attempt()
    except RuntimeError:  # not on a FakeCluster
        import raydist

        return raydist.get_context().rank, int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def behave(steps: Sequence[Step], call: int, mark_dir: Optional[str] = None) -> Tuple[int, int]:
    """The scenario's user function: what ``steps`` say this rank does in
    call ``call`` of this attempt, else its (rank, attempt). A death or a
    hang reaches here only on Ray (the fake's ``Fault`` strikes first)."""
    rank, attempt = rank_and_attempt()
    if mark_dir is not None and rank == 0:
        with open(os.path.join(mark_dir, f"call-{call}.started"), "w"):
            pass  # another thread acts once rank 0 is in the call
    for step in steps:
        if (step.rank, step.attempt, step.call) != (rank, attempt, call):
            continue
        if step.kind == "raise":
            raise RuntimeError(f"rank {rank} raised in attempt {attempt}")
        if step.kind == "exit":
            sys.exit(3)
        if step.kind == "die":
            os._exit(1)
        if step.kind == "hang":
            time.sleep(HANG_S)
        if step.kind in ("lose-node", "drain-node"):  # (on Ray: the test takes or drains this rank's node once it is written)
            import ray

            # Written under another name and renamed: the test never reads it half-written
            # (an empty node id once made it take no node away, and the rank waited on).
            final = os.path.join(mark_dir or ".", f"rank-{rank}.node")
            with open(final + ".partial", "w") as mark:
                mark.write(ray.get_runtime_context().get_node_id())
            os.replace(final + ".partial", final)
            time.sleep(NODE_TAKEN_S)  # the node goes first; if it does not, the scenario fails saying so (not the test's timeout)
            raise RuntimeError(f"rank {rank}'s node was still there {NODE_TAKEN_S:.0f} s after it asked for it to go")
    return rank, attempt


def ending_of(outcome: Any) -> Ending:
    """The ``Ending`` of a call's values or error."""
    if isinstance(outcome, BaseException):
        root = getattr(outcome, "root_cause", None)
        return Ending(type(outcome).__name__, None, bool(getattr(outcome, "restarted_in_place", False)), root.rank if root else None)
    attempts = {attempt for _, attempt in outcome}
    assert [rank for rank, _ in outcome] == list(range(len(outcome))) and len(attempts) == 1, outcome
    return Ending("values", attempts.pop())
