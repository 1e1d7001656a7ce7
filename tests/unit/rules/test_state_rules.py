"""The rules of training state without Ray: when a step is committed, which
snapshot files count, what a world of another size gets, and the plain
(torchrun / python) store in a directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest
import torch

from raydist.core import state, state_files
from raydist.core.state_files import SnapshotMeta
from raydist.pool.rules.commits import CommitLog, store_room_warning


def meta(step: int, size: int = 2, own: bool = True) -> SnapshotMeta:
    return SnapshotMeta(step, size, ("model",), ("rng",) if own else ())


def test_a_step_commits_once_every_rank_holds_every_part() -> None:
    log = CommitLog()
    assert log.ack(0, 0, meta(3), {"shared": [0, 1], "rank_00000": [0, 1]}) == (False, [])
    assert log.committed is None
    assert log.ack(0, 1, meta(3), {"rank_00001": [1, 0]}) == (True, [])
    assert log.committed is not None and log.committed.meta.step == 3
    assert log.committed.locations["rank_00001"] == [0, 1]


def test_a_newer_world_aborts_what_an_older_one_left_and_ignores_its_stragglers() -> None:
    log = CommitLog()
    log.ack(0, 0, meta(1), {"shared": [0], "rank_00000": [0, 1]})
    log.ack(0, 1, meta(1), {"rank_00001": [0, 1]})
    log.ack(0, 0, meta(2), {"shared": [0], "rank_00000": [0, 1]})  # rank 1 died before step 2
    assert log.enter(1) == (True, [2])
    assert log.ack(0, 1, meta(2), {"rank_00001": [0, 1]}) == (False, [])  # a straggler of attempt 0
    assert log.committed is not None and log.committed.meta.step == 1


def test_a_dropped_step_never_commits_and_the_next_one_does() -> None:
    log = CommitLog()
    log.ack(0, 0, meta(4), {"shared": [0], "rank_00000": [0, 1]})
    assert log.drop(0, 4) == [4]  # rank 1 could not keep it: rank 0's wait ends
    assert log.ack(0, 1, meta(4), {"rank_00001": [0, 1]}) == (False, [4])  # a late ack ends at once too
    log.ack(0, 0, meta(5), {"shared": [0], "rank_00000": [0, 1]})
    assert log.ack(0, 1, meta(5), {"rank_00001": [0, 1]}) == (True, [])
    assert log.drop(-1, 6) == [] and 6 not in log.needed()  # a dead attempt's word changes nothing


def test_a_step_without_its_shared_part_is_not_committed() -> None:
    log = CommitLog()
    log.ack(0, 0, meta(5), {"rank_00000": [0, 1]})
    assert log.ack(0, 1, meta(5), {"rank_00001": [0, 1]}) == (False, [])


class CountedHolder(int):
    """A holder's index that counts how often it is ordered against another."""

    ordered = 0

    def __lt__(self, other: int) -> bool:
        CountedHolder.ordered += 1
        return int(self) < other


def test_a_shared_part_acknowledged_on_every_node_is_ordered_once_at_the_commit() -> None:
    # Every node's first rank names the shared part's holders: sorting the list
    # gathered so far at each of them was quadratic in the nodes.
    nodes = 1000
    log, shared_only = CommitLog(), SnapshotMeta(1, nodes, ("model",), ())
    CountedHolder.ordered = 0
    for node in range(nodes):
        log.ack(0, node, shared_only, {"shared": [CountedHolder(node + 1), CountedHolder((node + 1) % nodes + 1)]})
    assert log.committed is not None and log.committed.locations["shared"] == list(range(1, nodes + 1))
    assert CountedHolder.ordered <= 20 * nodes


class CountingStore(state.StateStore):
    def __init__(self) -> None:
        self.saved: list = []
        self.waits = 0

    def save(self, snapshot: state.Snapshot) -> None:
        self.saved.append(snapshot)

    def load(self, rank: int, world_size: int) -> None:
        return None

    def wait_copied(self) -> None:
        self.waits += 1


def test_an_optimizer_given_to_save_state_waits_for_the_copy_before_each_step(monkeypatch: pytest.MonkeyPatch) -> None:
    store = CountingStore()
    monkeypatch.setattr(state, "_store", store)
    model, other = torch.nn.Linear(3, 2), torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state.save_state(0, model=model, other=other, optimizer=optimizer)
    state.save_state(1, model=model, other=other, optimizer=optimizer)  # the wait is added once
    pointers = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert store.saved[1].guarded == pointers  # another module's tensors are not the optimizer's: copied at once
    optimizer.step()
    assert store.waits == 1
    state.load_state(model=model)  # it writes the objects: a copy still being made goes first
    assert store.waits == 2

    class Wrapper(torch.optim.Optimizer):  # never initialised as an optimizer: no hooks to add
        def __init__(self, inner: torch.optim.Optimizer) -> None:
            self.inner = inner

        def state_dict(self) -> Dict[str, Any]:
            return self.inner.state_dict()

    state.save_state(2, model=model, optimizer=Wrapper(optimizer))
    assert store.saved[2].guarded == frozenset()  # its tensors are copied before save_state returns


def test_per_rank_state_refuses_a_world_of_another_size_naming_both() -> None:
    with pytest.raises(state.StateSizeError, match="saved by 4 ranks.*this world has 2 ranks"):
        state.check_world(meta(7, size=4), 2)
    state.check_world(meta(7, size=4, own=False), 2)  # shared state loads anywhere


def test_without_a_store_save_does_nothing_and_load_returns_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(state.STATE_DIR_VAR, raising=False)
    model = torch.nn.Linear(2, 1)
    state.save_state(0, model=model)
    assert state.load_state(model=model) is None
    with pytest.raises(ValueError, match="step must be an int"):
        state.save_state(-1, model=model)
    with pytest.raises(ValueError, match="shared names optimizer"):
        state.save_state(0, shared=["optimizer"], model=model)


def test_the_directory_store_resumes_skips_a_cut_short_step_and_keeps_the_last_n(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", state.STATE_DIR_VAR: str(tmp_path), state.STATE_KEEP_VAR: "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(state, "_dir_stores", {})
    model, progress = torch.nn.Linear(2, 1), {"seen": 0}
    for step in range(4):
        progress["seen"] = step
        state.save_state(step, shared=["model"], model=model, progress=progress)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    state.load_state()  # waits for the last write
    assert state_files.committed_steps(str(tmp_path)) == [2, 3]
    cut = Path(state_files.step_dir(str(tmp_path), 9))
    cut.mkdir()
    (cut / "meta.json").write_text(meta(9, size=1).to_json())  # a writer that died: no marker
    with torch.no_grad():
        model.weight.zero_()
    fresh: dict = {}
    assert state.load_state(model=model, progress=fresh) == 3
    assert fresh == {"seen": 3} and all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    state_files.prune(str(tmp_path), 2)
    assert cut.exists()  # newer than the newest committed: it may still be being written


def test_the_host_copy_is_independent_of_later_training() -> None:
    model = torch.nn.Linear(2, 1)
    copy = state.host_copy(model.state_dict())
    with torch.no_grad():
        model.weight.add_(1)
    assert not torch.equal(copy["weight"], model.weight)
    assert hasattr(copy, "_metadata")


def test_a_state_that_does_not_fit_the_object_store_is_said_with_both_sizes() -> None:
    mb = 2**20
    # One node, two ranks of 100 MB each and 50 MB shared: two steps are 500 MB.
    assert store_room_warning(100 * mb, 50 * mb, 2, False, 500 * mb) is None
    line = store_room_warning(100 * mb, 50 * mb, 2, False, 150 * mb)
    assert line is not None and "0.49 GiB" in line and "0.15 GiB" in line and "--object-store-memory" in line
    # On several nodes a node also keeps other ranks' second copies: twice the per-rank bytes.
    assert store_room_warning(100 * mb, 0, 2, True, 500 * mb) is not None
    assert store_room_warning(100 * mb, 0, 2, True, 800 * mb) is None
    assert store_room_warning(100 * mb, 0, 2, True, 0) is None  # no figure from Ray: nothing said
