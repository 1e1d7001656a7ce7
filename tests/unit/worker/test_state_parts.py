"""A snapshot part as the object store keeps it, and the reused host copy,
without Ray: every kind of value comes back equal, in memory of its own."""

from __future__ import annotations

import io
import pickle
from typing import Any, Set

import numpy as np
import torch
from torch.utils._pytree import tree_leaves

from raydist.core.state import host_copy
from raydist.pool.worker.state_parts import nbytes, pack, pack_later, unpack


def trained() -> Any:
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "progress": {"seen": 7}}


def test_a_packed_state_comes_back_equal_in_writable_memory_of_its_own() -> None:
    state = trained()
    lazy = torch.tensor([1 + 2j, 3 - 1j]).conj()  # a conjugate bit, not yet applied to the bytes
    state["odd"] = [torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t(), torch.tensor(True), torch.empty(0, 5), (1, "a"), lazy]
    packed = pack(state)
    assert nbytes(packed) == sum(t.numel() * t.element_size() for t in _tensors(state))
    readonly = (packed[0], [np.frombuffer(a.tobytes(), dtype=np.uint8) for a in packed[1]])  # as the object store gives them
    back = unpack(readonly)
    before = [t.clone() for t in _tensors(state)]
    for mine, theirs in zip(_tensors(back), _tensors(state)):
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)
        mine.add_(1) if mine.dtype != torch.bool else mine.logical_not_()  # writable, and not the original
    assert all(torch.equal(a, b) for a, b in zip(_tensors(state), before))  # the unpacked state is memory of its own
    assert back["model"]._metadata == state["model"]._metadata  # load_state_dict reads versions from it
    assert back["progress"] == {"seen": 7} and back["odd"][3] == (1, "a")
    model = torch.nn.Linear(4, 3)
    model.load_state_dict(unpack(pack(state))["model"])


def test_a_packed_module_and_optimizer_unpickle_without_torch() -> None:
    """The keeper and the holders only hold parts: they never import torch for them."""
    skeleton, _ = pack(trained())
    modules: Set[str] = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            modules.add(module)
            return super().find_class(module, name)

    Recording(io.BytesIO(pickle.dumps(skeleton))).load()
    assert modules and not {m for m in modules if m.split(".")[0] == "torch"}, modules


def test_host_copy_reuses_the_memory_of_an_earlier_copy_where_it_fits() -> None:
    state = trained()
    first = host_copy(state)
    weight = first["model"]["weight"]
    with torch.no_grad():
        state["model"]["weight"].add_(1)
    second = host_copy(state, first)
    assert second["model"]["weight"] is weight and torch.equal(weight, state["model"]["weight"])
    state["model"]["weight"] = torch.zeros(5)  # another shape: fresh memory
    third = host_copy(state, second)
    assert third["model"]["weight"] is not weight and third["model"]["weight"].shape == (5,)
    assert third["model"]._metadata == state["model"]._metadata


def _tensors(value: Any) -> list:
    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def test_a_part_packed_for_later_reads_only_the_guarded_tensors_later_and_sees_them_change() -> None:
    model = torch.nn.Linear(4, 3)
    buffer = torch.zeros(3)  # not the optimizer's: copied when packed
    state = {"model": model.state_dict(), "extra": buffer, "progress": {"seen": [7]}, "done": {1, 2}}
    guarded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    later = pack_later(state, guarded)
    assert later is not None and len(later.watched) == 2 and later.changed() == 0
    weight = later.packed[0]["model"]["weight"]
    assert np.shares_memory(later.packed[1][weight.index], model.weight.detach().numpy())  # read later, not copied
    buffer.add_(1)
    state["progress"]["seen"].append(8)  # plain values are copied when packed too
    state["done"].add(3)  # (a value no container rebuilds)
    assert later.changed() == 0
    with torch.no_grad():
        model.weight.add_(1)  # outside the optimizer's step: the later read would see it
    assert later.changed() == 1
    back = unpack(later.packed)
    assert torch.equal(back["extra"], torch.zeros(3)) and back["progress"] == {"seen": [7]} and back["done"] == {1, 2}
    assert pack_later(state, set()) is None  # nothing guarded: put at once
    state["adjacency"] = torch.eye(3).to_sparse()  # no plain memory to read later: the whole part is put at once
    assert pack_later(state, guarded) is None
