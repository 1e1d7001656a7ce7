"""Which steps of training state the ranks send (``SendPlan``): a save never
waits for the step before it, yet every rank sends the same steps, a newer
one goes out once the last is committed, and the newest step of a loop that
stops saving is committed when every rank asks for it again.

The ranks are modelled as the rank's store uses the plan: at each save a
rank asks whether the step is sent (it is "free" when nothing of its own is
on its way out), its sender takes its steps in order and sends the ones the
plan wants, and a step is committed once every rank has sent it. Hypothesis
draws the interleavings (which rank saves, which sender moves, when a
commit is seen)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

from hypothesis import given, settings
from hypothesis import strategies as st

from raydist.pool.rules.commits import SendPlan


def test_the_first_rank_to_ask_decides_for_every_rank() -> None:
    plan = SendPlan()
    assert plan.want(0, 1, free=False) is False and plan.want(0, 1, free=True) is False  # rank 0 was busy: not sent
    assert plan.want(0, 2, free=True) is True and plan.want(0, 2, free=False) is True  # rank 1 still sends step 2
    assert plan.want(1, 1, free=True) is True  # a new attempt decides afresh


def test_a_step_asked_for_again_is_sent_once_every_rank_asked() -> None:
    plan = SendPlan()
    assert plan.want(0, 7, free=False) is False
    assert plan.ask_again(0, 0, 7, 3) is None and plan.ask_again(0, 2, 7, 3) is None
    assert plan.ask_again(0, 1, 7, 3) is True
    assert plan.ask_again(0, 0, 7, 3) is True  # (asked twice: already sent)


def test_a_commit_forgets_older_steps_and_an_ended_world_its_own() -> None:
    plan = SendPlan()
    plan.want(0, 3, free=False)
    plan.ask_again(0, 0, 4, 2)
    plan.settled(0, 4)
    assert plan.want(0, 3, free=True) is True  # forgotten: asked again it is decided again (the keeper refuses a step that old)
    plan.want(0, 9, free=False)
    plan.ended(1)
    assert plan.want(0, 9, free=True) is True


@dataclass
class Rank:
    saved: int = 0  # steps saved so far
    queue: List[int] = field(default_factory=list)  # saved, not yet taken by the sender (with the plan's word)
    sending: Optional[int] = None  # sent, waiting for its commit
    newest_unsent: Optional[int] = None


@dataclass
class Model:
    ranks: List[Rank]
    plan: SendPlan = field(default_factory=SendPlan)
    sent_by: Dict[int, Set[int]] = field(default_factory=dict)  # step -> ranks that sent it
    committed: int = -1

    def save(self, r: int) -> None:
        rank = self.ranks[r]
        free = rank.sending is None and not rank.queue
        step = rank.saved
        rank.saved += 1
        rank.newest_unsent = None  # a newer step: the one not sent is let go
        self.plan.want(0, step, free)
        rank.queue.append(step)

    def take(self, r: int) -> None:
        rank = self.ranks[r]
        if rank.sending is not None or not rank.queue:
            return
        step = rank.queue.pop(0)
        if self.plan.want(0, step, False):  # (asked before: the decision made then)
            rank.sending = step
            self.sent_by.setdefault(step, set()).add(r)
        elif step == rank.saved - 1:
            rank.newest_unsent = step

    def commit(self) -> None:
        for step in sorted(self.sent_by):
            if step > self.committed and len(self.sent_by[step]) == len(self.ranks):
                self.committed = step
                self.plan.settled(0, step)
        for rank in self.ranks:
            if rank.sending is not None and rank.sending <= self.committed:
                rank.sending = None

    def ask_again(self) -> None:
        for r, rank in enumerate(self.ranks):
            newest = rank.newest_unsent
            if newest is not None and newest > self.committed and self.plan.ask_again(0, r, newest, len(self.ranks)):
                rank.queue.append(newest)
                rank.newest_unsent = None

    def drain(self) -> None:
        for _ in range(10 * sum(rank.saved + 1 for rank in self.ranks)):
            for r in range(len(self.ranks)):
                self.take(r)
            self.commit()

    def check(self) -> None:
        for rank in self.ranks:  # memory: besides the step being sent, at most one more of its steps is sent later
            assert sum(1 for step in rank.queue if self.plan.want(0, step, False)) <= 1


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    world=st.integers(2, 4),
    steps=st.integers(1, 25),
    moves=st.lists(st.tuples(st.sampled_from(["save", "take", "commit"]), st.integers(0, 3)), max_size=200),
)
def test_whatever_the_interleaving_every_rank_sends_the_same_steps_and_the_last_is_committed(world: int, steps: int, moves: List) -> None:
    model = Model([Rank() for _ in range(world)])
    for what, who in moves:
        r = who % world
        if what == "save" and model.ranks[r].saved < steps and max(x.saved for x in model.ranks) - model.ranks[r].saved < 2:
            model.save(r)  # the ranks' collectives keep them within a step of each other
        elif what == "take":
            model.take(r)
        elif what == "commit":
            model.commit()
        model.check()
    for r, rank in enumerate(model.ranks):  # the loops run to their end
        while rank.saved < steps:
            model.save(r)
    model.drain()
    # No rank waits on a step another did not send: each one sent was sent by all, and committed.
    assert all(len(ranks) == world for ranks in model.sent_by.values()), model.sent_by
    assert all(rank.sending is None and not rank.queue for rank in model.ranks)
    for _ in range(2):  # the call's end: the newest step, if not sent, is asked for again (a rank waits for the others' asks)
        model.ask_again()
        model.drain()
    assert model.committed == steps - 1
