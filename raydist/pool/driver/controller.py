"""``RunController``: one run, driven by one control loop, the only writer of its state.

A run (``raydist.run``, ``raydist run``, or one ``WorkerGroup``) has one
loop (``Cluster.run_loop``: a thread on Ray; turns at virtual moments on
the fake cluster). User threads never change the run: they post an event
(``raydist.pool.driver.events``: start, submit, cancel, shutdown, Ctrl-C)
and wait for its reply or for their call's future. The drain watcher posts
the room it found; the straggler watch posts a hang (with ``hang_timeout``)
and a lasting straggler (with ``straggler_action="replace"``). On each turn the loop takes the events in order, then
reads the calls in flight, oldest first (woken when a rank's call ends, or
at a call's deadline), and acts:

- a call every rank finished ends with its values;
- a failed call is put to the policy (``raydist.pool.rules.policy.decide``,
  injectable), once, and every call in flight on its world ends as that
  decision says, whichever future is read first and from which thread: a
  warm restart in place (``raydist.pool.driver.restart``; if it cannot
  finish, the policy is asked again), a fresh attempt in new processes, or
  the run stopped with the error;
- room for more workers is put to the scaling rule (``policy.scale_to``):
  the world restarts larger, not counted, the call sent again by
  ``raydist.run``;
- a hang (ranks that have not reached a collective the others wait in,
  for ``hang_timeout``) is put to the policy (``policy.replace_hung``): the
  ranks it names are killed, and their death, said as the hang, is then a
  failed call like any other;
- a straggler late for ``straggler_windows`` windows in a row (with
  ``straggler_action="replace"``) is put to the policy
  (``policy.replace_straggler``): killed when a spare stands on another node,
  its node excluded, and its death is a replacement (a warm restart, not counted);
- a stop (shutdown, cancel, Ctrl-C) releases everything and ends every
  call in flight with it (a call every rank had finished keeps its values).

The phases (``raydist.pool.records.GroupPhase``) move only along
``PHASE_TRANSITIONS``::

    STARTING --> RUNNING --(a failed call: WARM)--> RESTARTING --> RUNNING
       |  ^         |                                   |
       |  +---------+--(FRESH, or growth: torn down, the next attempt placed)
       v
    SHUTTING_DOWN --> CLOSED   (from any phase: shutdown(), cancel(), Ctrl-C, or RAISE)

``attempts.number`` is the one attempt counter (TORCHELASTIC_RESTART_COUNT
of the world that runs); ``attempts.restarts_used`` counts the restarts
charged to ``max_restarts``. An error is built once, with what happened
(``end``, ``restarted_in_place``), and never changed after it is raised.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import deque
from functools import partial
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from raydist.config import RunConfig
from raydist.errors import InfeasibleResourcesError, RaydistError, UnhealthyWorkers, WorkerGroupClosed, WorkerGroupStopped, ranks_text
from raydist.pool import signals
from raydist.pool.cluster.seam import Cluster, LoopRunner
from raydist.pool.driver.attempt import Attachment, Attempt
from raydist.pool.driver.attempts import Attempts, Policy, RestartOptions
from raydist.pool.driver.calls import CallHooks, KeptCall, WorkerFuture, ending_of, forward_signal, send_call
from raydist.pool.driver.datasets import CallData, split_for_world, warn_without_cpus
from raydist.pool.driver.events import STOPPING, Cancel, Event, Hung, Interrupt, Reply, RoomFound, Slow, Start, Stop, Submit
from raydist.pool.driver.hooks import group_hooks
from raydist.pool.driver.lifecycle import Lifecycle, weakly
from raydist.pool.driver.log_files import RunLogs
from raydist.pool.driver.output import router_for
from raydist.pool.driver.restart import WarmRestart
from raydist.pool.driver.startup import POLL_END_S, GroupBuilder, Holdings
from raydist.pool.driver.state import RunState
from raydist.pool.driver.summary import RunResults, RunSummary
from raydist.pool.driver.waiting import CallWait, Waited
from raydist.pool.records import INLINE_CALL_BYTES, CallEnd, GroupPhase
from raydist.pool.rules.hangs import NotArrived
from raydist.pool.rules.policy import Action, Decision, scale_to
from raydist.pool.rules.stragglers import Straggler

logger = logging.getLogger("raydist")

SESSION_GONE = "the Ray this WorkerGroup was started in has been shut down (ray.shutdown()); its workers are gone: start a new WorkerGroup"
CLOSED = "this WorkerGroup has been shut down"
CALL_SESSION_GONE = "Ray was shut down (ray.shutdown()) while this WorkerGroup's call ran"


class RunController:
    """One run on ``cluster``: its loop, attempts, phase and holdings (see the module docstring)."""

    def __init__(self, cluster: Cluster, config: RunConfig, fresh_restarts: bool, policy: Optional[Policy] = None):
        self.config = config
        self.cluster = cluster
        restarts = RestartOptions(config.max_restarts, config.retry_on_exception, config.warm_restarts, config.survivor_timeout)
        self.attempts = Attempts(restarts, fresh_restarts, cluster, policy)
        self._state = RunState()  # save_state's copies outlive every attempt
        self._hooks = group_hooks(config)  # a missing backend library fails here, before the cluster
        self._calls = 0
        self._in_flight: Dict[int, WorkerFuture] = {}  # calls sent and not yet ended, by number
        self._last_call: KeptCall = None  # the call the current world's ranks keep (send_call)
        self._ahead: Optional[Tuple[bytes, Any]] = None  # (call, as sent) run ahead to its load_state (run_ahead)
        self._not_replaced: Set[Tuple[int, int]] = set()  # (attempt, rank) of stragglers said to stay for want of a spare
        self.holdings: Optional[Holdings] = None
        self.attempt: Optional[Attempt] = None  # the attempt that runs (or the last one, once stopped)
        cluster.connect(config.address, config.startup_timeout)
        self.session = cluster.session()
        self._builder = GroupBuilder(
            cluster,
            config,
            self._hooks,
            RunLogs(config),
            router_for(config, cluster),
            weakly(self._room_found, None),  # held weakly: a group dropped without shutdown() is freed
            extra_env=self._state.env(cluster, config.state_dir, config.state_keep, config.state_overhead),
            stopping=weakly(self._stop_requested, True),  # its waits give way to a stop asked meanwhile
            hang_seen=weakly(self._hang_seen, None),
            slow_seen=weakly(self._slow_seen, None),
        )
        self.life = Lifecycle(on_move=self._builder.timeline.phase)  # the run's phases, in its timeline
        self.summary: RunSummary = self._builder.summary  # where the run's time went, every attempt
        self._inbox: Deque[Tuple[Event, Reply]] = deque()
        self._inbox_lock = threading.Lock()
        self._open = True  # the loop takes events (False once the run closed and its last events were answered)
        self._closed = threading.Event()
        self._loop = cluster.run_loop(self._turn, "raydist-run-loop")
        self._ask(Start())

    # -- what user threads do: post an event, and wait ------------------------
    def send(self, call: bytes, data: Optional[CallData] = None) -> WorkerFuture:
        """Send ``call`` to the current world's ranks (queued in the same order
        on every rank); a call sent during a restart runs in the next world."""
        if data is not None and data.config.exactly_once:  # read whole now: say first if no CPU is left for it
            attempt = self.attempt
            warn_without_cpus(self.cluster, self.held_resources(), attempt.size if attempt is not None else 0)
        if data is not None:
            data.read()
        future = self._ask(Submit(call, data))
        if future is None:
            raise WorkerGroupClosed(CLOSED)
        return future

    def shutdown(self, graceful: bool = False, cause: CallEnd = CallEnd.SHUT_DOWN) -> None:
        """Stop the run (``graceful``: the ranks leave their process group
        first); returns once it is closed. Safe from any thread, and again
        (after ``ray.shutdown()`` too: there is nothing of Ray left to release)."""
        reply = self._post(Stop(cause, graceful))
        if reply is not None and not self._loop.in_turn():  # (asked on the loop's own thread: its next turn stops the run)
            self._wait(reply.done, None)

    def _post(self, event: Event) -> Optional[Reply]:
        """Queue ``event`` for the loop; None once the run is closed."""
        reply = Reply()
        with self._inbox_lock:
            if not self._open:
                return None
            self._inbox.append((event, reply))
        self._loop.wake()
        return reply

    def _ask(self, event: Event, future: Optional[WorkerFuture] = None) -> Any:
        """Post ``event`` and wait for the loop's answer: its value, or its error raised."""
        self.check_session()
        reply = self._post(event)
        if reply is None or self._loop.in_turn() or not self._wait(reply.done, None, future):
            self.check_session()
            return None  # closed, asked on the loop's own thread (answered on its next turn), or from a fake cluster's timer
        if reply.error is not None:
            raise reply.error
        return reply.value

    def _wait(self, done: threading.Event, timeout: Optional[float], future: Optional[WorkerFuture] = None) -> bool:
        """Wait for ``done`` (a user's thread). Ctrl-C: the loop forwards the
        signal to the ranks and stops the run; this waits for that, then re-raises."""
        try:
            if self.cluster.park(done, timeout, partial(self._interrupt, future)):
                return True
        except KeyboardInterrupt as interrupted:
            self.cluster.park(self._closed, None)
            if self.cluster.session() != self.session:
                raise WorkerGroupClosed(CALL_SESSION_GONE) from interrupted
            raise
        return False

    def _interrupt(self, future: Optional[WorkerFuture]) -> None:
        """Ctrl-C (or a handled signal) reached a user's wait: the loop is told at once, from where it landed."""
        self._post(Interrupt(future, signals.received()))

    def _wait_for_call(self, future: WorkerFuture, timeout: Optional[float]) -> bool:
        if future.ended or self._wait(future.ending, timeout, future):
            return True
        if self.cluster.session() != self.session:
            raise WorkerGroupClosed(CALL_SESSION_GONE)
        return False

    def _cancel_call(self, future: WorkerFuture) -> bool:
        return bool(self._ask(Cancel(future), future))

    def _room_found(self) -> None:
        """The drain watcher's poll found room for more workers (its thread only posts)."""
        attempt = self.attempt
        self._post(RoomFound(attempt.grow_by if attempt is not None else 0))

    def _hang_seen(self, attempt: int, hang: NotArrived, seconds: float) -> None:
        """The straggler watch saw a hang last ``hang_timeout`` (its thread only posts)."""
        self._post(Hung(attempt, hang, seconds))

    def _slow_seen(self, attempt: int, straggler: Straggler, windows: int) -> None:
        """The straggler watch saw a straggler stay late for ``windows`` windows (its thread only posts)."""
        self._post(Slow(attempt, straggler, windows))

    # -- the loop: its only writer -------------------------------------------
    def _turn(self) -> Optional[float]:
        """One turn: every event queued, in order, then the calls in flight;
        when to turn again (a call's deadline), or None (when woken)."""
        try:
            while True:
                while (item := self._next_event()) is not None:
                    self._handle(*item)
                if not self._end_calls() and not self._inbox:
                    break
        except Exception:
            logger.exception("raydist: the run's control loop failed; stopping the run")
            self.stop(CallEnd.SHUT_DOWN)
        with self._inbox_lock:
            if self.life.phase is GroupPhase.CLOSED and not self._inbox:
                self._open = False
        if not self._open:
            self._loop.stop()
            return None
        deadlines = [f.wait.deadline for f in self._in_flight.values() if f.wait.deadline is not None]
        return min(deadlines) if deadlines else None

    def _next_event(self) -> Optional[Tuple[Event, Reply]]:
        with self._inbox_lock:
            return self._inbox.popleft() if self._inbox else None

    def _stop_requested(self) -> bool:
        """A stop waits in the inbox: a start or warm restart in progress gives way to it."""
        with self._inbox_lock:
            return any(isinstance(event, STOPPING) for event, _ in self._inbox)

    def _handle(self, event: Event, reply: Reply) -> None:
        try:
            value: Any = None
            if isinstance(event, Start):
                self._start(None)
            elif isinstance(event, Submit):
                value = self._send(event.call, event.data)
            elif isinstance(event, Cancel):
                value = self._cancel(event.future)
            elif isinstance(event, Stop):
                self.stop(event.cause, event.graceful)
            elif isinstance(event, Interrupt):
                self._interrupted(event)
            elif isinstance(event, RoomFound):
                self._grow(event.more)
            elif isinstance(event, Hung):
                self._hung(event)
            elif isinstance(event, Slow):
                self._slow(event)
            reply.give(value)
        except BaseException as error:  # noqa: BLE001 - the asker raises it
            reply.give(error=error)

    def _send(self, call: bytes, data: Optional[CallData]) -> WorkerFuture:
        self.check_usable()
        attempt = self.attempt
        assert attempt is not None and self.life.phase is GroupPhase.RUNNING
        split = split_for_world(self.cluster, attempt, data, self.held_resources, self.attach)  # queued before the call
        refs, self._last_call = send_call(self.cluster, attempt, call, self._last_call)
        self._run_ahead(call)
        number, self._calls = self._calls, self._calls + 1
        deadline = None if self.config.timeout is None else self.cluster.monotonic() + self.config.timeout
        wait = CallWait(self.cluster, refs, attempt.workers, list(attempt.actors), deadline)
        hooks = CallHooks(self._wait_for_call, self._cancel_call)
        future = self._in_flight[number] = WorkerFuture(hooks, attempt, refs, number, wait, self.cluster.time(), split)
        self.cluster.when_ended(refs, partial(_news, wait, self._loop))
        return future

    def _run_ahead(self, call: bytes) -> None:
        """With ``run_ahead``, in a run that sends its call again after a restart:
        the spares run ``call`` ahead (a kept process does at its warm restart)."""
        if not (self.config.run_ahead and self.attempts.fresh_restarts) or self.holdings is None:
            return
        if self._ahead is None or self._ahead[0] is not call:
            self._ahead = (call, self.cluster.share(call) if len(call) > INLINE_CALL_BYTES else call)
        self.holdings.spares.run_ahead(self._ahead[1])

    def _end_calls(self) -> bool:
        """End the calls in flight whose ranks are back, oldest first (each rank
        runs its calls in order); whether any ended. After ``ray.shutdown()``
        nothing can be read: the run stops, its calls ending with why."""
        if self._in_flight and self.cluster.session() != self.session:
            self.stop(CallEnd.SHUT_DOWN)
            return True
        ended = False
        while self._in_flight:
            future = self._in_flight[min(self._in_flight)]
            if not future.wait.due() or not future.wait.take():
                break
            ended = True
            values, error = ending_of(future, None, self.config.timeout)
            if error is None:
                del self._in_flight[future.number]
                future.end(values)
            else:
                self._after_failure(error, future)
        return ended

    # -- after a failure: what the policy says, for every call of its world ----
    def _after_failure(self, error: RaydistError, future: WorkerFuture) -> None:
        """A failure is its world's: the policy is asked once, and every call in
        flight on that attempt ends as its decision says (a newer call queued on
        the old ranks ran before their teardown, which queues behind it)."""
        attempt, waited = future.attempt, future.wait.waited
        self._state.abort(self.cluster, attempt.number)  # no rank waits on a step a dead rank never saves
        calls = [self._in_flight.pop(n) for n in sorted(self._in_flight) if self._in_flight[n].attempt is attempt]
        decision = self._decide(error, started=True)
        if decision.action is Action.WARM:
            if self._restart_warm(decision, error, calls, waited):
                return
            decision = self._decide(error, started=True, warm_failed=True)
        if decision.action is Action.FRESH:
            self._restart_fresh(error, calls, waited, lambda old: self.attempts.count(decision, error, old))
            return
        final = self.attempts.final(error)
        self.stop(CallEnd.SHUT_DOWN, settle=(future.number, waited))  # peers stuck in a collective need not wait
        _end_all(calls, final)

    def _decide(self, error: BaseException, *, started: bool, warm_failed: bool = False) -> Decision:
        return self.attempts.decide(error, self.holdings, started=started, warm_failed=warm_failed, stopping=self._stop_requested())

    def _restart_warm(self, decision: Decision, error: RaydistError, calls: List[WorkerFuture], waited: Waited) -> bool:
        """Replace the failed ranks in place (``restart.WarmRestart``); False: it could not."""
        old, holdings = calls[0].attempt, self.holdings
        assert holdings is not None
        self.life.move(GroupPhase.RESTARTING)
        config = self.config
        restart = WarmRestart(
            self._builder,
            holdings,
            self._stop_requested,
            config.survivor_timeout,
            config.startup_timeout,
            config.worker_range,
            ahead=self._ahead[1] if self._ahead is not None else None,
        )
        restarted = restart.run(old, calls[0].refs, waited, calls[0].number, self.attempts.next)
        if restarted is None:
            self.life.move(GroupPhase.RUNNING)  # for the fresh start or the stop after it
            return False
        self.attempt, line = restarted
        told = error.restarted_as(self.attempts.next)
        self.attempts.count(decision, told, old.size)
        self.life.move(GroupPhase.RUNNING)
        logger.warning(line)
        _end_all(calls, told)
        return True

    def _restart_fresh(
        self, error: RaydistError, calls: List[WorkerFuture], waited: Waited, count: Callable[[int], None], grow_to: Optional[int] = None
    ) -> None:
        """Tear the attempt down and start the next one in new processes (at
        ``grow_to``, for a growth); the calls end once it started (or with why it could not)."""
        old, holdings = self.attempt, self.holdings
        assert old is not None and holdings is not None
        self.life.move(GroupPhase.STARTING)
        old.stop_watching()
        holdings.release(graceful=False)
        old.close_output(calls[0].number if calls else None, waited.results, waited.marked_failures)
        self._builder.restart(list(dict.fromkeys(w.node_id for w in old.workers)), grow_to)  # surviving nodes keep their ranks
        count(old.size)
        try:
            self._start(error)
        except RaydistError as failed:
            _end_all(calls, failed)
            return
        _end_all(calls, error)

    def _grow(self, more: int) -> None:
        """Room for ``more`` workers: the scaling rule says the size; the world
        restarts at it, not counted (growth is not a failure)."""
        attempt = self.attempt
        if attempt is None or self.life.phase is not GroupPhase.RUNNING:
            return
        size = scale_to(attempt.size, more, self.config.worker_range, self.attempts.fresh_restarts)
        if size is None:
            return
        logger.warning("raydist: room for %d more worker(s): restarting the world larger", more)
        calls = [self._in_flight.pop(n) for n in sorted(self._in_flight)]
        stopped = WorkerGroupStopped(f"the cluster has room for {more} more worker(s)")
        stopped.end = CallEnd.GROW
        self._restart_fresh(stopped, calls, Waited([]), lambda old: self.attempts.scaled(stopped, more, old), size)

    def _hung(self, event: Hung) -> None:
        """Kill the ranks the policy names for a hang of the current world while
        a call waits on it; their calls then fail, said as the hang."""
        attempt = self.attempt
        if attempt is None or attempt.number != event.attempt or self.life.phase is not GroupPhase.RUNNING:
            return  # a world that has ended meanwhile
        if not any(future.attempt is attempt for future in self._in_flight.values()):
            return  # no call waits on it (the next one's collectives are another hang)
        ranks = self.attempts.hung(event.hang, stopping=self._stop_requested())
        if not ranks:
            return
        why = f"killed by raydist: {event.hang.line(event.seconds, who='it')}; hang_timeout={self.config.hang_timeout:g} s"
        logger.warning("raydist: hang: %s; killing %s", event.hang.line(event.seconds), ranks_text(ranks))
        attempt.note_killed(ranks, why)  # before the kills: their deaths are read as the hang
        self._kill(attempt, ranks, "hung: killed", "hang", seconds=event.seconds)

    def _slow(self, event: Slow) -> None:
        """Replace a lasting straggler of the current world, while a call runs on
        it, where the policy says (a spare stands on another node): its node is
        excluded, then it is killed; its call then fails, said as the replacement."""
        attempt, holdings, straggler = self.attempt, self.holdings, event.straggler
        if attempt is None or holdings is None or attempt.number != event.attempt or self.life.phase is not GroupPhase.RUNNING:
            return  # a world that has ended meanwhile
        if not any(future.attempt is attempt for future in self._in_flight.values()):
            return  # between calls: the next call's collectives say whether it is still late
        worker = attempt.workers[straggler.rank]
        where = f"node {worker.node_id[:12]} ({worker.node_ip})"
        ranks = self.attempts.straggler(straggler, worker.node_id, holdings, self._builder.excluded, stopping=self._stop_requested())
        if not ranks:
            if (attempt.number, straggler.rank) not in self._not_replaced:  # said once; asked again each time it lasts
                self._not_replaced.add((attempt.number, straggler.rank))
                logger.warning(
                    "raydist: %s for %d windows; not replaced: no spare ready on another node", straggler.line(where), event.windows
                )
            return
        self._builder.exclude(worker.node_id)  # before the kill: the warm restart puts no one there
        why = (
            f"replaced by raydist: it reached collectives {straggler.late_s * 1e3:.0f} ms after the others for "
            f"{event.windows} windows of {straggler.collectives} collectives (straggler_threshold="
            f"{self.config.straggler_threshold:g} s); its node hosts no rank for the rest of the run"
        )
        logger.warning("raydist: straggler: %s; replacing it with a spare on another node", straggler.line(where))
        attempt.note_killed(ranks, why, replaced=True)
        self._kill(attempt, ranks, "straggler: replaced", "straggler", late_s=straggler.late_s)

    def _kill(self, attempt: Attempt, ranks: Tuple[int, ...], what: str, category: str, **details: Any) -> None:
        """Kill ``ranks`` of ``attempt`` for a hang or a straggler, each a moment of the timeline."""
        for rank in ranks:
            worker = attempt.workers[rank]
            attempt.timeline.instant(what, category, rank=rank, node=worker.node_id, attempt=attempt.number, **details)
            self.cluster.kill(attempt.actors[rank])

    # -- starting an attempt ---------------------------------------------------
    def _start(self, failed: Optional[RaydistError]) -> None:
        """Place and start the next attempt (after ``failed``), again while the policy restarts failed starts."""
        while True:
            try:
                self._open_attempt(failed)
                return
            except RaydistError as error:
                if self.life.closing:
                    raise
                decision = self._decide(error, started=False)
                if decision.action is not Action.FRESH:
                    self.stop(CallEnd.SHUT_DOWN)
                    raise self.attempts.final(error) from None
                self.attempts.count(decision, error, old_size=0)
                failed = error
            except BaseException:
                self.stop(CallEnd.SHUT_DOWN)
                raise

    def _open_attempt(self, failed: Optional[RaydistError]) -> None:
        old = self.attempt
        if self.holdings is not None and old is not None:  # a fresh restart: what the last attempt held shows free first
            self.cluster.wait_released(self.holdings.held_resources(old.workers))
        unhealthy: Optional[UnhealthyWorkers] = None
        while True:  # each round excludes another unhealthy node: it ends
            try:
                self.holdings = self._builder.reserve()  # its waits, and the start's, give way to a stop asked meanwhile
            except InfeasibleResourcesError as error:
                if unhealthy is None:
                    raise
                raise InfeasibleResourcesError(f"{error} ({unhealthy})") from None
            excluded = self._builder.excluded
            try:
                attempt = self._builder.build(self.holdings, self.attempts.number)
                break
            except UnhealthyWorkers as error:
                if self._builder.excluded == excluded:
                    raise  # no node newly excluded: another placement would be the same
                logger.warning("raydist: %s; placing the workers again without those nodes", error)
                unhealthy = error
        if self._stop_requested():
            attempt.end()
            raise WorkerGroupClosed("this WorkerGroup was shut down while it started")
        self.attempt = attempt
        self.life.move(GroupPhase.RUNNING)
        if failed is not None:
            self.attempts.started(attempt.size, old.size if old else 0, failed, self.cluster.time())

    # -- the end -----------------------------------------------------------
    def _cancel(self, future: WorkerFuture) -> bool:
        self._end_calls()  # a call whose ranks are all back is not cancelled
        if future.ended or self.life.closing:
            return False
        self.stop(CallEnd.CANCELLED)
        return True

    def _interrupted(self, event: Interrupt) -> None:
        future = event.future
        try:
            if future is not None and not future.ended and not self.life.closing:
                forward_signal(self.cluster, future.attempt, event.signum, future, self.config.shutdown_timeout)
        finally:
            self.stop(CallEnd.SHUT_DOWN)

    def stop(self, cause: CallEnd, graceful: bool = False, settle: Optional[Tuple[int, Waited]] = None) -> None:
        """End the run for ``cause`` (the loop only); ``settle``: a failed call's
        output to wait for once the ranks are dead. Every call still in flight
        ends with the stop; a call every rank had finished keeps its values."""
        if not self.life.stop():
            return
        attempt, holdings = self.attempt, self.holdings
        if attempt is not None:
            attempt.stop_watching()  # kept: what it saw explains the failure
        gone = self.cluster.session() != self.session  # after ray.shutdown(): nothing of Ray to release or read
        if not gone:
            if holdings is not None:
                holdings.release(graceful)
            self._state.release(self.cluster)  # after the ranks: the last step they saved is written out first
        if attempt is not None:  # no poll of the run reaches the cluster once it has ended (the user may shut it down)
            attempt.wait_watching_ended(POLL_END_S)
        self._hooks.stop()
        self.summary.ended(cause.value)
        endings: List[Tuple[WorkerFuture, Optional[List[Any]], Optional[RaydistError]]] = []
        for number in sorted(self._in_flight):
            future = self._in_flight.pop(number)
            if gone:  # its ranks went with Ray
                endings.append((future, None, WorkerGroupClosed(CALL_SESSION_GONE)))
                continue
            future.wait.take(grace=0.0)
            endings.append((future, *ending_of(future, cause, self.config.timeout)))
        if attempt is not None:
            settled, waited = settle if settle is not None else (None, Waited([]))
            attempt.close_output(settled, waited.results, waited.marked_failures)
        self.life.close()
        self._closed.set()
        for future, values, error in endings:
            future.end(values, error)

    # -- what the run is ---------------------------------------------------
    def held_resources(self) -> Any:
        holdings, attempt = self.holdings, self.attempt
        return holdings.held_resources(attempt.workers if attempt else []) if holdings else {}

    def attach(self, name: str, thing: Attachment) -> None:
        attempt = self.attempt
        if attempt is None:
            raise WorkerGroupClosed("this WorkerGroup has no running world to attach to")
        attempt.attach(name, thing)

    def check_usable(self) -> None:
        self.check_session()
        if self.life.closing:
            raise WorkerGroupClosed(CLOSED)

    def check_session(self) -> None:
        if self.cluster.session() != self.session:
            raise WorkerGroupClosed(SESSION_GONE)


def _news(wait: CallWait, loop: LoopRunner) -> None:
    """One of a call's ranks is back (the cluster's thread): noted, and the loop woken."""
    wait.news()
    loop.wake()


def _end_all(calls: List[WorkerFuture], error: RaydistError) -> None:
    """End ``calls`` with ``error``: the first with it, each later one with its own copy."""
    for index, call in enumerate(calls):
        call.end(error=error if index == 0 else copy.copy(error))


def run_call(run: RunController, call: bytes, data: Optional[CallData] = None) -> RunResults:
    """``raydist.run``'s loop: ``call`` on ``run`` until it succeeds or the policy
    raises, sent again after each restart; the run is shut down after."""
    try:
        while True:
            try:
                values = run.send(call, data).result()
                run.summary.ended("succeeded")
                return RunResults(values, run.summary)
            except RaydistError as error:
                if not run.attempts.restarted_after(error):
                    run.summary.ended(error.end.value if error.end else type(error).__name__)
                    raise error.with_summary(run.summary) from None
    finally:
        run.shutdown(graceful=True)
