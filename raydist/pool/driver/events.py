"""What reaches a run's control loop: user requests and what the cluster
and the watchers saw, each a typed event with the reply its sender waits on.

User threads (``WorkerGroup``'s methods, a future's reader, Ctrl-C) only
post these and wait (``Reply``); the loop (``raydist.pool.driver.controller``)
is the one that acts on them. The ranks' results need no event: the loop
reads every call in flight on each turn, woken when one of them ends.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

from raydist.pool.driver.datasets import CallData
from raydist.pool.records import CallEnd
from raydist.pool.rules.hangs import NotArrived
from raydist.pool.rules.stragglers import Straggler

if TYPE_CHECKING:
    from raydist.pool.driver.calls import WorkerFuture


@dataclass(frozen=True)
class Start:
    """Place and start the run's first attempt (posted once, by the run's constructor)."""


@dataclass(frozen=True)
class Submit:
    """Send a call to the current world's ranks; the reply is its ``WorkerFuture``."""

    call: bytes
    data: Optional[CallData]


@dataclass(frozen=True)
class Cancel:
    """``WorkerFuture.cancel()``: stop the run, unless the call had already ended (reply: whether it stopped it)."""

    future: "WorkerFuture"


@dataclass(frozen=True)
class Stop:
    """``shutdown()`` (or the run's end): stop for ``cause``; ``graceful``: ranks leave their process group first."""

    cause: CallEnd
    graceful: bool = False


@dataclass(frozen=True)
class Interrupt:
    """Ctrl-C (or a handled signal, ``signum``) reached the user's thread while it waited for ``future``."""

    future: Optional["WorkerFuture"]
    signum: Optional[int]


@dataclass(frozen=True)
class RoomFound:
    """The drain watcher found room for ``more`` workers (``restart_to_grow``); nobody waits on the reply."""

    more: int


@dataclass(frozen=True)
class Hung:
    """The straggler watch saw ranks of attempt ``attempt`` not reach a collective
    for ``seconds`` (at least ``hang_timeout``); nobody waits on the reply."""

    attempt: int
    hang: NotArrived
    seconds: float


@dataclass(frozen=True)
class Slow:
    """The straggler watch saw ``straggler`` of attempt ``attempt`` stay late for
    ``windows`` windows in a row (with straggler_action="replace"); nobody waits on the reply."""

    attempt: int
    straggler: Straggler
    windows: int


Event = Union[Start, Submit, Cancel, Stop, Interrupt, RoomFound, Hung, Slow]
STOPPING = (Cancel, Stop, Interrupt)  # the events that end a run: a warm restart in progress gives way to them


@dataclass
class Reply:
    """The loop's answer to one event: set once, by the loop."""

    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: Optional[BaseException] = None

    def give(self, value: Any = None, error: Optional[BaseException] = None) -> None:
        self.value, self.error = value, error
        self.done.set()
