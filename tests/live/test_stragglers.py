"""A rank that drags every step is named from the flight recorders, with no
change to the code it runs; an even run names no one."""

from __future__ import annotations

import logging
import time

import pytest
import torch
import torch.distributed as dist

import raydist

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("ray_local")]


def steps(count: int, slow_rank: int, delay: float) -> None:
    """``count`` steps of one all_reduce; ``slow_rank`` spends ``delay`` more in each."""
    t = torch.ones(1)
    for _ in range(count):
        if dist.get_rank() == slow_rank:
            time.sleep(delay)  # the slow rank's extra work per step
        dist.all_reduce(t)


def test_a_rank_50_ms_slower_per_step_is_named_within_20_steps() -> None:
    with raydist.WorkerGroup(2, resources_per_worker={"CPU": 1}) as group:
        group.run(steps, args=(20, 1, 0.05))
        found = group.stragglers(refresh=True)
    assert [s.rank for s in found] == [1], found
    assert 0.035 < found[0].late_s < 0.2 and found[0].collectives <= 20
    assert "rank 1 reaches collectives" in found[0].line()


def test_the_driver_names_the_straggler_once_while_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="raydist")
    with raydist.WorkerGroup(2, resources_per_worker={"CPU": 1}) as group:
        group.run(steps, args=(60, 1, 0.05))  # ~3 s: several looks by the watch
        named = [r.getMessage() for r in caplog.records if "reaches collectives" in r.getMessage()]
        first = group._diagnostics.watch.first_named[1]  # type: ignore[union-attr]
    assert len(named) == 1, named
    assert named[0].startswith("raydist: rank 1 on node ") and "ms after the others, over the last" in named[0]
    # Named while the run went on (how soon depends on the 0.5 s looks reaching
    # the ranks; the 20-step bound is the test above, which looks at once).
    assert first.last_seq < 60, first


def test_200_even_steps_name_no_one(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="raydist")
    with raydist.WorkerGroup(2, resources_per_worker={"CPU": 1}) as group:
        group.run(steps, args=(200, -1, 0.0))
        assert group.stragglers(refresh=True) == []
    assert not [r for r in caplog.records if "reaches collectives" in r.getMessage()]
