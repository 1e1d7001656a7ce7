"""A rank that drags every step is named from the flight recorders, with no
change to the code it runs; an even run names no one; with
``straggler_action="replace"``, a spare on another node takes its place."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Tuple

import pytest
import ray
import ray.cloudpickle
import torch
import torch.distributed as dist
from conftest import assert_nothing_left

import raydist

pytestmark = pytest.mark.timeout(240)
# The workers need not import this module (tests/live may not be on their path): ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def steps(count: int, slow_rank: int, delay: float) -> None:
    """``count`` steps of one all_reduce; ``slow_rank`` spends ``delay`` more in each."""
    t = torch.ones(1)
    for _ in range(count):
        if dist.get_rank() == slow_rank:
            time.sleep(delay)  # the slow rank's extra work per step
        dist.all_reduce(t)


@pytest.mark.usefixtures("ray_local")
def test_even_steps_name_no_one_and_a_rank_50_ms_slower_per_step_is_named_within_20_steps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="raydist")
    with raydist.WorkerGroup(2, resources_per_worker={"CPU": 1}) as group:
        group.run(steps, args=(200, -1, 0.0))
        assert group.stragglers(refresh=True) == [], "200 even steps named a rank"
        assert not [r for r in caplog.records if "reaches collectives" in r.getMessage()], "the driver named a rank of an even run"
        # The verdict rests on the last 20 collectives: these steps only.
        group.run(steps, args=(20, 1, 0.05))
        found = group.stragglers(refresh=True)
    assert [s.rank for s in found] == [1], found
    assert 0.035 < found[0].late_s < 0.2 and found[0].collectives <= 20
    assert "rank 1 reaches collectives" in found[0].line()
    # The run's summary names it too: rank 0 waited for it in each of those collectives, rank 1 hardly ever.
    summary = group.summary()
    table = str(summary)
    assert summary.slowest_rank() == 1 and "slowest rank: rank 1 " in table, table
    waits = {rank: times.waits["collective"] for rank, times in summary.attempts[-1].ranks.items()}
    assert waits[0] > 0.5 and waits[1] < 0.3, table


@pytest.mark.usefixtures("ray_local")
@pytest.mark.soak  # the warning's once-only rule: tests/unit/rules; a real straggler named: the test above
def test_the_driver_names_the_straggler_once_while_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="raydist")
    with raydist.WorkerGroup(2, resources_per_worker={"CPU": 1}) as group:
        group.run(steps, args=(60, 1, 0.05))  # ~3 s: several looks by the watch
        named = [r.getMessage() for r in caplog.records if "reaches collectives" in r.getMessage()]
        first = group._run.attempt.watch.first_named[1]  # type: ignore[union-attr]
    assert len(named) == 1, named
    assert named[0].startswith("raydist: rank 1 on node ") and "ms after the others, over the last" in named[0]
    # Named while the run went on (how soon depends on the 0.5 s looks reaching
    # the ranks; the 20-step bound is the test above, which looks at once).
    assert first.last_seq < 60, first


def crash_then_steps(crash_rank: int, count: int, slow_rank: int, delay: float) -> int:
    """Attempt 0: ``crash_rank`` dies while the others all-reduce; later attempts: ``steps``."""
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        dist.barrier()
        if dist.get_rank() == crash_rank:
            os._exit(7)
        while True:
            dist.all_reduce(torch.ones(1))
    steps(count, slow_rank, delay)
    return os.getpid()


@pytest.mark.usefixtures("ray_local")
@pytest.mark.soak  # each world's own watch: the engine (the watch is built with each world); a spare's process: test_state's crash
def test_after_a_warm_restart_the_new_worlds_straggler_is_named_not_the_old_worlds() -> None:
    with raydist.WorkerGroup(2, max_restarts=1, spare_workers=1, resources_per_worker={"CPU": 0.5}) as group:
        old_pids = [w.pid for w in group.workers]
        with pytest.raises(raydist.WorkerGroupError, match="rank 1"):
            group.run(crash_then_steps, args=(1, 0, -1, 0.0))
        assert group.restart_count == 1
        # Rank 1 is the spare's process now: the new world's rank, slow.
        pids = group.run(crash_then_steps, args=(1, 60, 1, 0.05))
        assert pids == [w.pid for w in group.workers]
        found = group.stragglers(refresh=True)
        watched = group._run.attempt.watch._workers  # type: ignore[union-attr]
    assert [s.rank for s in found] == [1], found
    assert [w.pid for w in watched] == pids and old_pids[1] not in pids


def slow_rank_in_the_first_attempt(slow_rank: int, count: int, delay: float) -> Tuple[int, float, str]:
    """``count`` steps of one all_reduce; in attempt 0, ``slow_rank`` spends ``delay`` more in each.
    (attempt, the last all_reduce's sum: the world's size, node)."""
    slow = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and dist.get_rank() == slow_rank
    for _ in range(count):
        if slow:
            time.sleep(delay)  # its node's slowness, as the others see it
        t = torch.ones(1)
        dist.all_reduce(t)
    return int(os.environ["TORCHELASTIC_RESTART_COUNT"]), float(t.item()), ray.get_runtime_context().get_node_id()


# soak: make test names a real straggler (the first test) and replaces a hung rank with a spare
# (test_hangs); which spare replaces a slow rank: tests/unit (test_engine_stragglers, test_rules)
@pytest.mark.soak
@pytest.mark.nodes(*[{"num_cpus": 2}] * 3)  # 4 ranks and a spare on three nodes of 2 CPUs
def test_a_rank_slow_every_step_is_replaced_by_a_spare_on_another_node(cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="raydist")
    options = dict(spare_workers=1, straggler_action="replace", straggler_windows=2, resources_per_worker={"CPU": 1})
    with raydist.WorkerGroup(4, **options) as group:  # type: ignore[arg-type]
        spare_node = group.spares[0].node_id
        # The slow rank: one whose node the spare is not on (its replacement must be elsewhere).
        slow = max(w.rank for w in group.workers if w.node_id != spare_node)
        slow_node = group.workers[slow].node_id
        start = time.monotonic()
        # 150 ms late in every all_reduce: after 2 windows of 20 collectives it is killed and the
        # spare takes its place, not counted against max_restarts=0.
        with pytest.raises(raydist.WorkerGroupError) as replaced:
            group.run(slow_rank_in_the_first_attempt, args=(slow, 400, 0.15))
        assert time.monotonic() - start < 400 * 0.15  # long before its slow call would have ended
        assert replaced.value.restarted_in_place and replaced.value.root_cause.rank == slow
        assert "replaced by raydist: it reached collectives" in str(replaced.value)
        assert group.restart_count == 1 and group.restarts_used == 0
        values = group.run(slow_rank_in_the_first_attempt, args=(slow, 50, 0.15))
    assert [(attempt, total) for attempt, total, _ in values] == [(1, 4.0)] * 4
    nodes = [node for _, _, node in values]
    # Its node keeps its other rank but took no one new; the spare's node hosts a rank now.
    assert nodes.count(slow_node) == 1 and spare_node in nodes
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith(f"raydist: straggler: rank {slow} on node ") and "replacing it with a spare" in line for line in lines), (
        lines
    )
    assert any("not counted against max_restarts" in line and f"straggler: rank {slow}" in line for line in lines), lines
    assert_nothing_left(within=30, files=False)  # the killed rank's files: the next start on its node removes them
