"""Every kind of return value comes back exactly as the function returned it,
or the call fails with an error naming the rank and the value's type; never
a different value in silence. Ray reads some values itself when an actor
method returns them bare (a generator as several return values, a Ray error
as the task's own failure): each kind goes through each way a call travels
(a new call's bytes, a kept call sent without them, a large call through the
object store, ``submit``, ``raydist.run`` on a new group)."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Dict, List

import pytest
import ray
import torch
from conftest import assert_nothing_left

import raydist

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("ray_local")]

BIG = b"x" * (128 * 1024)  # an argument that makes the call larger than INLINE_CALL_BYTES


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


def _ray_error() -> Any:
    return ray.exceptions.RayTaskError("f", "a traceback", ValueError("kept as a value"))


# name -> (what each rank returns, how the driver checks what it got)
KINDS: Dict[str, "tuple[Callable[[], Any], Callable[[Any], bool]]"] = {
    "none": (lambda: None, lambda v: v is None),
    "int": (lambda: 7, lambda v: v == 7 and type(v) is int),
    "str": (lambda: "abc", lambda v: v == "abc"),
    "tuple": (lambda: (1, "a"), lambda v: v == (1, "a")),
    "dict": (lambda: {"loss": 1.5}, lambda v: v == {"loss": 1.5}),
    "ordered dict": (lambda: collections.OrderedDict(a=1), lambda v: v == {"a": 1} and type(v) is collections.OrderedDict),
    "dataclass": (lambda: Point(1, 2), lambda v: v == Point(1, 2)),
    "tensor": (lambda: torch.arange(3), lambda v: torch.equal(v, torch.arange(3))),
    "range": (lambda: range(3), lambda v: v == range(3)),
    "list iterator": (lambda: iter([1, 2, 3]), lambda v: list(v) == [1, 2, 3]),
    "exception as a value": (lambda: ValueError("a value"), lambda v: isinstance(v, ValueError) and str(v) == "a value"),
    "ray error as a value": (_ray_error, lambda v: isinstance(v, ray.exceptions.RayTaskError)),
    "object ref": (lambda: ray.put([4, 5]), lambda v: isinstance(v, ray.ObjectRef) and ray.get(v) == [4, 5]),
}

GENERATORS: Dict[str, Callable[[], Any]] = {
    "generator of three": lambda: (i for i in range(3)),
    "generator of characters": lambda: (c for c in "abc"),
    "generator of one": lambda: (i for i in [42]),
}


def returns(kind: str, padding: bytes = b"") -> Any:
    table = {**{name: made for name, (made, _) in KINDS.items()}, **GENERATORS}
    return table[kind]()


def check_values(kind: str, values: List[Any], size: int) -> None:
    ok = KINDS[kind][1]
    assert len(values) == size and all(ok(v) for v in values), f"{kind}: {values!r}"


def test_each_kind_of_value_arrives_as_returned_by_every_path() -> None:
    with raydist.WorkerGroup(2) as group:
        for kind in KINDS:
            check_values(kind, group.run(returns, args=(kind,)), 2)  # the call's bytes sent
            check_values(kind, group.run(returns, args=(kind,)), 2)  # the same call again: kept by the ranks
            check_values(kind, group.run(returns, args=(kind, BIG)), 2)  # a large call: through the object store
            check_values(kind, group.submit(returns, args=(kind,)).result(), 2)
    assert_nothing_left()


def check_generator_error(error: raydist.WorkerGroupError, size: int) -> None:
    message = str(error)
    assert "(a builtins.generator) cannot be pickled" in message and "return a list of its items" in message, message
    assert {f.rank for f in error.failures} == set(range(size)), message


@pytest.mark.parametrize(
    "kind",
    # The other two only differ in what they yield: soak (the warm test below returns a generator of one).
    [pytest.param(kind, marks=[pytest.mark.soak] if i else []) for i, kind in enumerate(GENERATORS)],
)
def test_a_generator_returned_by_a_new_run_fails_naming_the_rank_and_type(kind: str) -> None:
    with pytest.raises(raydist.WorkerGroupError) as caught:
        raydist.run(returns, args=(kind,), num_workers=2)
    check_generator_error(caught.value, 2)
    assert_nothing_left()


@pytest.mark.soak  # make test: test_a_generator_returned_by_a_new_run_fails_naming_the_rank_and_type
def test_a_generator_returned_by_a_warm_group_fails_on_each_path() -> None:
    # A failed call ends its group: one group per path, each warm (a call done before).
    for send in (
        lambda g: g.run(returns, args=("generator of one",)),
        lambda g: g.run(returns, args=("generator of one", BIG)),
        lambda g: g.submit(returns, args=("generator of one",)).result(),
    ):
        with raydist.WorkerGroup(1) as group:
            check_values("int", group.run(returns, args=("int",)), 1)
            with pytest.raises(raydist.WorkerGroupError) as caught:
                send(group)
            check_generator_error(caught.value, 1)
    assert_nothing_left()


def _rank_plus(offset: int) -> int:
    return raydist.get_context().rank + offset


def _nested_run() -> Any:
    inner = raydist.run(_rank_plus, args=(10,), num_workers=2, accelerator="cpu")
    return inner, "beside it"


def test_a_nested_runs_results_and_summary_come_back_from_a_rank() -> None:
    # raydist.run's result (a list with its summary) inside a value a rank returns.
    [(inner, beside)] = raydist.run(_nested_run, num_workers=1, accelerator="cpu")
    assert inner == [10, 11] and beside == "beside it"
    assert isinstance(inner.summary, raydist.RunSummary) and [a.size for a in inner.summary.attempts] == [2]
    assert inner.summary.attempts[-1].ended == "succeeded"
    assert_nothing_left()
