"""What goes wrong on the fake cluster, and when: a ``Fault`` strikes the
nth call of a method on a chosen worker (``FaultBook`` counts the calls and
keeps the order the faults struck in). ``FakeCluster`` does what it says."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from raydist.testing.workers import FakeWorker

KINDS = ("raise", "die", "hang", "slow", "straggle", "lose-node", "drain-node", "act", "interrupt")


@dataclass(eq=False)
class Fault:
    """On the ``nth`` (0: first) call of ``method`` on the worker ``who`` names,
    ``kind`` happens: ``raise`` (the call raises: the user's code, or raydist's
    own step), ``die`` (its process is killed: ``exit_code``), ``hang`` (the
    call never returns; with ``collective`` N, its rank completed all_reduces
    1 to N-1 and waits in #N, or, not ``entered``, never reaches #N; a
    rank's death fails the calls that wait in a collective, as gloo does), ``slow`` (it returns after ``seconds``),
    ``straggle`` (it returns after ``seconds``, and meanwhile every rank of
    its world completes an all_reduce every ``STRAGGLE_STEP_S``, this rank
    entering each ``late`` seconds after the others), ``lose-node`` / ``drain-node`` (its node), ``act``
    (``action`` runs, as another thread would, before the call), ``interrupt``
    (Ctrl-C: the engine's wait raises KeyboardInterrupt). ``who``: the
    worker's rank once it has one, its slot before; None: any worker."""

    method: str
    kind: str
    who: Optional[int] = None
    nth: int = 0
    action: Optional[Callable[[], None]] = None
    exit_code: int = -9
    seconds: float = 0.0  # how long a "slow" or "straggle" call takes
    late: float = 0.0  # how late a "straggle" rank enters each collective
    collective: int = 0  # a "hang" at all_reduce #collective (0: none)
    entered: bool = True  # the hung call waits in that collective (else it never reached it)
    fired: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Fault kind must be one of {KINDS}, got {self.kind!r}")

    def strikes(self, method: str, who: int, counts: Mapping[Tuple[str, Optional[int]], int]) -> bool:
        """Whether this call (of ``method`` on worker ``who``) is the one:
        ``counts`` says how many such calls came before it (per worker, and on any)."""
        if self.fired or method != self.method or self.who not in (None, who):
            return False
        self.fired = counts.get((method, self.who), 0) == self.nth
        return self.fired


class FaultBook:
    """The faults of one fake cluster, the calls counted for them, and which struck."""

    def __init__(self, faults: Iterable[Fault] = ()):
        self._faults = list(faults)
        self.fired: List[Fault] = []  # the faults that struck, in the order they did
        self._counts: Dict[Tuple[str, Optional[int]], int] = {}  # calls run so far, by (method, worker) and (method, any)

    def add(self, *faults: Fault) -> None:
        self._faults.extend(faults)

    def __iter__(self) -> Iterator[Fault]:
        return iter(list(self._faults))

    def strike(self, method: str, worker: FakeWorker) -> Optional[Fault]:
        """The fault for this call of ``method`` on ``worker``, if one strikes it; the call is counted."""
        who = worker.rank if worker.rank is not None else worker.slot
        fault = next((f for f in self._faults if f.strikes(method, who, self._counts)), None)
        for key in ((method, who), (method, None)):
            self._counts[key] = self._counts.get(key, 0) + 1
        if fault is not None:
            self.fired.append(fault)
        return fault
