"""The cluster seam: everything a worker group asks of the cluster, and nothing more.

The engine (start-up, calls, warm and fresh restarts, spares, shutdown, in
``raydist.pool.driver``) reaches the cluster only through a ``Cluster``:
reserve a placement, start a worker (or a node agent) in it, call a method
on it, wait for the first of many calls to end and read their results, kill
a worker, free the placement, and read the nodes (alive, draining, free
resources). ``RayCluster`` (``pool/cluster/ray_cluster.py``) does it with Ray;
everything above this seam is plain Python. Handles are opaque to the engine:
a worker is whatever ``start_worker`` returned, a pending call whatever
``call`` returned.

Ray-free: the unit tier imports it without Ray.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from raydist.pool.records import ClusterNode
from raydist.pool.rules.sizing import Request

Worker = Any  # a started worker or node agent (Ray: an actor handle)
Pending = Any  # a call not yet read (Ray: an ObjectRef)
Reservation = Any  # the group's placed bundles (Ray: a placement group)
Printer = Callable[[Dict[str, Any]], None]  # prints one batch of a worker's forwarded lines ("lines", "pid", "ip", "is_err")


class WorkerDied(Exception):
    """The process a call ran in is gone (``str``: how the cluster saw it die)."""


class CallFailed(Exception):
    """The call ended without a result to read: a raydist method raised on
    the worker, or (for the user's code, whose own errors come back in an
    ``Outcome``) the value it returned could not be pickled there; or
    (``unreadable``) it arrived and cannot be unpickled here. ``str``: the
    cluster's whole text (the worker's traceback); ``cause``: the error itself."""

    def __init__(self, text: str, cause: BaseException, unreadable: bool = False):
        super().__init__(text)
        self.cause = cause
        self.unreadable = unreadable


class Timer(Protocol):
    """A function ``Cluster.after`` will run, until cancelled."""

    def cancel(self) -> None: ...

    def join(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until the function has returned if it
        had started (at once if it was cancelled first, or when called from the
        function itself): a run that has ended makes no cluster call after, which
        once the user shuts the cluster down would end their process (Ray)."""
        ...


class LoopRunner(Protocol):
    """Runs a run's control loop (``Cluster.run_loop``): one turn at a time, never two at once."""

    def wake(self) -> None:
        """Turn the loop soon (from any thread, or from within a turn: then once more after it)."""
        ...

    def stop(self) -> None:
        """No more turns after the one in progress (if any)."""
        ...

    def in_turn(self) -> bool:
        """Whether the calling thread is the loop's, in a turn."""
        ...


class Cluster(Protocol):
    """What the engine needs of a cluster. A call's result is read with
    ``get``, which raises ``WorkerDied`` or ``CallFailed``
    instead of the cluster's own errors."""

    # -- who is there ---------------------------------------------------------
    def connect(self, address: Optional[str], startup_timeout: float) -> None:
        """Join the cluster at ``address`` (None: the default one) unless this process has."""
        ...

    def session(self) -> Optional[str]:
        """An id of the cluster session this process is connected to; None once it is gone."""
        ...

    def driver_node(self) -> Optional[str]:
        """The node this driver runs on; None where its files are elsewhere (a remote client)."""
        ...

    def driver_ip(self) -> str: ...

    def alive_nodes(self) -> List[ClusterNode]: ...

    def draining_nodes(self) -> Dict[str, float]:
        """Nodes being drained, each with its deadline (seconds since the epoch; inf: none)."""
        ...

    def free_resources(self) -> Dict[str, Dict[str, float]]:
        """What is free now on each alive node (node id -> amounts)."""
        ...

    def forward_output(self, wrap: Callable[[Printer], Printer], drop: Callable[[List[str]], bool]) -> bool:
        """Pass the worker output this cluster forwards to the driver through
        ``wrap`` (around its own printer), and leave out its own messages
        for which ``drop`` is True; False where it forwards none here."""
        ...

    # -- its clock (the engine's deadlines and waits; a fake cluster's is virtual) --
    def monotonic(self) -> float: ...

    def time(self) -> float:
        """Seconds since the epoch, as the workers' failure times are stamped."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def record(self, figure: str, value: float, tags: Mapping[str, str]) -> None:
        """Add ``value`` to the run's figure ``figure`` (``raydist.pool.worker.metrics.FIGURES``)
        where the cluster's own metrics are (Ray: ``ray.util.metrics``)."""
        ...

    def after(self, delay: float, fn: Callable[[], None], name: str) -> Timer:
        """Run ``fn`` once, ``delay`` seconds from now, off the caller's thread
        (thread ``name``): the engine's polls and background starts, so that a
        fake cluster can run them on its own clock, in a fixed order."""
        ...

    def run_loop(self, turn: Callable[[], Optional[float]], name: str) -> LoopRunner:
        """Run ``turn`` whenever the returned runner is woken, one turn at a time,
        and again at the ``monotonic()`` moment a turn returns (None: only when
        woken). Ray: a thread of its own (``name``); a fake cluster turns it at
        its virtual moments, so that a run replays exactly."""
        ...

    def park(self, done: threading.Event, timeout: Optional[float], on_interrupt: Callable[[], None] = lambda: None) -> bool:
        """Wait (a user's thread, on the run's loop) until ``done`` is set or
        ``timeout`` passes; whether it was set (False early once the
        cluster's session is gone). Ctrl-C: ``on_interrupt()``, then
        KeyboardInterrupt."""
        ...

    def when_ended(self, pending: Sequence[Pending], notify: Callable[[], None]) -> None:
        """Call ``notify()`` (from any thread) each time one of ``pending`` ends."""
        ...

    # -- placement ------------------------------------------------------------
    def reserve(self, request: Request, timeout: float, stopping: Callable[[], bool] = lambda: False) -> Tuple[Reservation, int]:
        """Bundles for ``request``, placed, and how many (an elastic size
        takes what fits); InfeasibleResourcesError when it cannot, at once
        or after ``timeout`` seconds; WorkerGroupClosed once ``stopping()``
        (the run was asked to stop while it waited for room)."""
        ...

    def bundle_nodes(self, reservation: Reservation) -> Dict[int, str]:
        """Where each placed bundle of ``reservation`` is now (bundle -> node id)."""
        ...

    def free(self, reservation: Reservation) -> None:
        """Give the bundles back (the workers in them die with them)."""
        ...

    def wait_released(self, held: Mapping[str, Mapping[str, float]]) -> None:
        """Until resources a freed group held (node id -> amounts) show as free again, briefly."""
        ...

    def room_for(self, request: Request, taken: Sequence[str] = ()) -> int:
        """How many more of ``request``'s bundles fit now, leaving out the nodes in ``taken``."""
        ...

    # -- workers --------------------------------------------------------------
    def start_worker(
        self, reservation: Reservation, slot: int, bundle: Mapping[str, float], accelerator_resource: Optional[str], per_bundle: int = 1
    ) -> Worker:
        """A new worker (``raydist.pool.worker.actor.RayWorker``) in slot
        ``slot`` of ``reservation``: its bundle ``slot // per_bundle``."""
        ...

    def start_agent(self, node_id: str) -> Worker:
        """A node agent (``raydist.pool.worker.evidence.NodeAgent``) on ``node_id``."""
        ...

    def find(self, name: str, namespace: str) -> Optional[Worker]:
        """The worker-made service of that name (a run's state keeper); None where there is none."""
        ...

    def call(self, worker: Worker, method: str, *args: Any) -> Pending:
        """Queue ``worker.method(*args)``; calls to one worker run in the order sent."""
        ...

    def pickle(self, value: Any) -> bytes:
        """``value`` as the workers unpickle it (the cluster's own handles in it included)."""
        ...

    def share(self, data: bytes) -> Any:
        """``data`` stored once, to be passed to many calls (each reads the one copy)."""
        ...

    def wait(self, pending: Sequence[Pending], num_returns: int, timeout: Optional[float]) -> Tuple[List[Pending], List[Pending]]:
        """(ended, not ended) once ``num_returns`` of ``pending`` have ended or ``timeout`` passed."""
        ...

    def get(self, pending: Sequence[Pending], timeout: Optional[float] = None) -> List[Any]:
        """The results of ``pending`` (ended calls), in order; raises for the
        first that failed (``WorkerDied``, ``CallFailed``)
        and TimeoutError when one has not ended within ``timeout``."""
        ...

    def kill(self, worker: Worker) -> None:
        """End ``worker``'s process now (its calls fail with ``WorkerDied``); returns at once."""
        ...
