"""How often a rank sends a step of training state (``SendPace``): never more
often than the loop can afford, as measured, and at once where sending costs
the loop nothing."""

from __future__ import annotations

from typing import List, Optional, Tuple

from hypothesis import given, settings
from hypothesis import strategies as st

from raydist.pool.rules.pacing import SendPace


def test_unpaced_every_step_may_go() -> None:
    pace = SendPace(None)
    for now in range(5):
        pace.saved(float(now), busy=now > 0)
        assert pace.due(float(now))
        pace.sending(float(now))


def test_a_send_that_cost_c_lets_the_next_go_c_over_budget_later() -> None:
    pace = SendPace(0.1)
    pace.saved(0.0, busy=False)
    assert pace.due(0.0)  # the first step always goes: nothing is committed yet
    pace.sending(0.0)
    pace.saved(1.5, busy=True)  # 1.0 s steps: this one and the next paid 0.5 s each for the send
    assert not pace.due(1.5)
    pace.saved(3.0, busy=True)
    assert not pace.due(3.0)  # the loop's own pace is not known yet
    pace.saved(4.0, busy=False)
    assert pace.cost() == 1.0
    assert not pace.due(4.0)
    for now in range(5, 10):
        pace.saved(float(now), busy=False)
        assert not pace.due(float(now))
    pace.saved(10.0, busy=False)
    assert pace.due(10.0)  # 0.0 + 1.0 / 0.1
    pace.sending(10.0)
    pace.saved(11.0, busy=True)  # this send cost nothing: the next goes as soon as the rank is free
    pace.saved(12.0, busy=False)
    assert pace.cost() == 0.0 and pace.due(12.0)


def test_the_baseline_is_the_median_of_the_idle_steps() -> None:
    pace = SendPace(0.5)
    times = [0.0, 1.0, 2.0, 7.0, 8.0, 9.0]  # one slow step (5 s) among 1 s ones
    for now in times:
        pace.saved(now, busy=False)
    pace.sending(9.0)
    pace.saved(10.5, busy=True)
    assert pace.cost() == 0.5  # against the median (1 s), not the mean (1.8 s)


def test_a_busy_step_faster_than_the_baseline_costs_nothing_below_zero() -> None:
    pace = SendPace(0.1)
    for now in (0.0, 1.0, 2.0):
        pace.saved(now, busy=False)
    pace.sending(2.0)
    pace.saved(2.9, busy=True)  # (noise: a step a little faster than the median)
    assert pace.cost() == 0.0 and pace.due(2.9)


def test_a_loop_that_sped_up_is_measured_before_its_next_send() -> None:
    pace = SendPace(0.1)
    for now in (0.0, 2.0, 4.0):  # saves 2 s apart
        pace.saved(now, busy=False)
    pace.sending(4.0)
    pace.saved(4.4, busy=True)  # now 0.4 s apart: against the old baseline this send cost nothing
    pace.saved(4.8, busy=True)
    assert not pace.due(4.8)
    pace.saved(5.0, busy=False)  # the loop's pace now: 0.2 s (the old baseline is dropped)
    assert abs(pace.cost() - 0.4) < 1e-9  # (0.4 - 0.2) x 2
    assert not pace.due(5.0) and pace.due(8.0)  # 4.0 + 0.4 / 0.1


def test_a_loop_that_saves_more_often_is_measured_anew() -> None:
    pace = SendPace(0.1)
    now = 0.0
    for _ in range(10):  # saves 2 s apart (every 10 steps), each send free
        pace.saved(now, busy=False)
        if pace.due(now):
            pace.sending(now)
        now += 2.0
    sent = []
    for step in range(60):  # from here on every 0.2 s step, and a send slows the 3 steps it spans by 0.2 s each
        busy = bool(sent) and step - sent[-1] <= 3
        pace.saved(now, busy=busy)
        if not (sent and step - sent[-1] < 3) and pace.due(now):
            pace.sending(now)
            sent.append(step)
        now += 0.4 if sent and step - sent[-1] < 3 else 0.2
    # Each send costs 0.6 s: at most one in 0.6 / 0.1 = 6 s, about 27 steps, measured against the new pace at once.
    assert len(sent) >= 3 and all(b - a >= 25 for a, b in zip(sent, sent[1:])), sent


def loop(step_s: float, send_steps: int, extra_s: float, budget: Optional[float], steps: int) -> Tuple[float, List[int]]:
    """A loop of ``steps`` saves, each step ``step_s`` long; a send keeps the rank busy
    ``send_steps`` steps and slows each of them by ``extra_s``. The share of the
    loop's time the sends took, and the steps sent."""
    pace = SendPace(budget)
    now, busy_left, extra, sent = 0.0, 0, 0.0, []
    busy_since_save = False
    for step in range(steps):
        idle = busy_left == 0
        pace.saved(now, busy_since_save or not idle)
        busy_since_save = not idle
        if idle and pace.due(now):
            pace.sending(now)
            sent.append(step)
            busy_left, busy_since_save = send_steps, True
        slowed = extra_s if busy_left else 0.0
        busy_left = max(0, busy_left - 1)
        now += step_s + slowed
        extra += slowed
    return extra / now, sent


@settings(max_examples=200, deadline=None)
@given(
    step_s=st.floats(0.05, 2.0),
    send_steps=st.integers(1, 6),
    extra=st.floats(0.0, 1.5),
    budget=st.sampled_from([0.02, 0.05, 0.1, 0.3]),
)
def test_the_sends_cost_the_loop_at_most_the_budget(step_s: float, send_steps: int, extra: float, budget: float) -> None:
    steps = 400
    share, sent = loop(step_s, send_steps, extra * step_s, budget, steps)
    one_send = send_steps * extra * step_s / (steps * step_s)  # the last send may have begun just before the end
    assert share <= budget * 1.001 + one_send
    if extra == 0.0:  # sending costs the loop nothing: a step goes out whenever the last is done
        assert len(sent) >= steps // (send_steps + 2) - 1
    unpaced, every = loop(step_s, send_steps, extra * step_s, None, steps)
    assert len(sent) <= len(every) and share <= unpaced + 1e-9


def test_a_wait_for_a_commit_is_no_step() -> None:
    pace = SendPace(0.1)
    for now in (0.0, 1.0, 2.0):
        pace.saved(now, busy=False)
    pace.sending(2.0)
    pace.waited()  # wait_committed: 5 s until the step was committed
    pace.saved(8.0, busy=True)  # (the next save, a step later)
    pace.saved(9.0, busy=False)
    pace.saved(10.0, busy=False)
    assert pace.cost() == 0.0 and pace.due(10.0)
