"""``RunController``: one run's attempts, as explicit states, decided in one place.

A run (``raydist.run``, ``raydist run``, or one ``WorkerGroup``) goes through
the phases of ``raydist.pool.records.GroupPhase``, along the moves
``PHASE_TRANSITIONS`` lists and nowhere else (``Lifecycle.move``)::

    STARTING --> RUNNING --(a failed call: WARM)--> RESTARTING --> RUNNING
       |  ^         |                                   |
       |  +---------+--(FRESH or RESIZE: torn down, the next attempt placed)
       |  +------------------------------------------------+
       v                                                    (a failed warm restart: FRESH)
    SHUTTING_DOWN --> CLOSED   (from any phase: shutdown(), cancel(), or RAISE)

Every failure, of a start or of a call, is put to the policy once
(``raydist.pool.rules.policy.decide``, injectable) with the facts it needs;
the controller does what it answers: a warm restart in place
(``raydist.pool.driver.restart``), a fresh (or larger) attempt in new
processes, or the error raised. ``attempt`` is the one attempt counter
(TORCHELASTIC_RESTART_COUNT of the world that runs); ``restarts_used``
counts the restarts charged to ``max_restarts``. Errors say what happened
(``restarted_in_place``), never what to do. A ``WorkerGroup`` is a facade
over a controller that may not start new attempts (its user does).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

from raydist.config import RunConfig
from raydist.errors import RaydistError, WorkerGroupClosed, WorkerGroupError
from raydist.pool.cluster.seam import Cluster
from raydist.pool.driver.attempts import Attempts, Policy
from raydist.pool.driver.calls import CallHooks, KeptCall, WorkerFuture, end_of_call, forward_signal, send_call
from raydist.pool.driver.datasets import CallData, split_for_world
from raydist.pool.driver.hooks import group_hooks
from raydist.pool.driver.lifecycle import Lifecycle, weak_stopper
from raydist.pool.driver.log_files import RunLogs
from raydist.pool.driver.output import router_for
from raydist.pool.driver.restart import WarmRestart
from raydist.pool.driver.startup import GroupBuilder, Holdings
from raydist.pool.driver.state import RunState
from raydist.pool.driver.summary import RunResults, RunSummary
from raydist.pool.driver.waiting import Waited
from raydist.pool.driver.world import Attachment, World
from raydist.pool.records import CallEnd, GroupPhase
from raydist.pool.rules.policy import Action, Decision

logger = logging.getLogger("raydist")

SESSION_GONE = "the Ray this WorkerGroup was started in has been shut down (ray.shutdown()); its workers are gone: start a new WorkerGroup"


class RunController:
    """One run on ``cluster``: its attempts, phase and holdings (see the module docstring)."""

    def __init__(self, cluster: Cluster, config: RunConfig, fresh_restarts: bool, policy: Optional[Policy] = None):
        self.config = config
        self.cluster = cluster
        self.attempts = Attempts(config, fresh_restarts, cluster, policy)
        self._state = RunState()  # save_state's copies outlive every attempt
        self._hooks = group_hooks(config)  # a missing backend library fails here, before the cluster
        self._grow = False  # the world was stopped because the cluster has room for more
        self._calls = 0
        self._in_flight: Dict[int, WorkerFuture] = {}  # calls sent and not yet ended, by number
        self._ended_by: Optional[Tuple[World, WorkerGroupError]] = None  # the world whose failure stopped the run, and it
        self._last_call: KeptCall = None  # the call the current world's ranks keep (send_call)
        self.holdings: Optional[Holdings] = None
        self.world: Optional[World] = None
        cluster.connect(config.address, config.startup_timeout)
        self.session = cluster.session()
        self._builder = GroupBuilder(
            cluster,
            config,
            self._hooks,
            RunLogs(config),
            router_for(config, cluster),
            weak_stopper(self.grow, CallEnd.GROW),  # held weakly: a group dropped without shutdown() is freed
            extra_env=self._state.env(config, cluster),
        )
        self.life = Lifecycle(on_move=self._builder.timeline.phase)  # the run's phases, in its timeline
        self.summary: RunSummary = self._builder.summary  # where the run's time went, every attempt
        self._start(None)

    # -- attempts ----------------------------------------------------------
    def _start(self, failed: Optional[RaydistError]) -> None:
        """Place and start the next attempt (after ``failed``), again while the policy restarts failed starts."""
        while True:
            try:
                self._open_attempt(failed)
                return
            except RaydistError as error:
                if self.life.closing:
                    raise
                decision = self.attempts.decide(error, self.holdings, started=False)
                if decision.action not in (Action.FRESH, Action.RESIZE):
                    self.stop(CallEnd.SHUT_DOWN)
                    raise self.attempts.final(error) from None
                self.attempts.count(decision, error, old_size=0)
                failed = error
            except BaseException:  # KeyboardInterrupt included: the builder released what it made
                self.stop(CallEnd.SHUT_DOWN)
                raise

    def _open_attempt(self, failed: Optional[RaydistError]) -> None:
        old = self.world
        if self.holdings is not None and old is not None:  # a fresh restart: what the last attempt held shows free first
            self.cluster.wait_released(self.holdings.held_resources(old.workers))
        self.holdings = self._builder.reserve()  # held at once: a shutdown() from another thread releases it
        world = self._builder.build(self.holdings, self.attempts.number)
        with self.life.lock:
            if self.life.phase is not GroupPhase.STARTING:
                world.end()  # shut down while it started: its resources went with the shutdown
                raise WorkerGroupClosed("this WorkerGroup was shut down while it started")
            self.world, self._grow = world, False
            self.life.move(GroupPhase.RUNNING)
        if failed is not None:
            self.attempts.started(world.size, old.size if old else 0, failed, self.cluster.time())

    # -- calls -------------------------------------------------------------
    def send(self, call: bytes, data: Optional[CallData]) -> WorkerFuture:
        """Send ``call`` to the current world's ranks (queued in the same order on every rank)."""
        life = self.life
        with life.lock:
            # A call sent during a restart runs in the next world (or raises once the run is shut down).
            life.changed.wait_for(lambda: life.phase not in (GroupPhase.RESTARTING, GroupPhase.STARTING))
            self.check_usable()
            split = split_for_world(self.cluster, self.world, data, self.held_resources, self.attach)  # queued before the call
            world = self.world
            assert world is not None
            refs, self._last_call = send_call(self.cluster, world, call, self._last_call)
            number, self._calls = self._calls, self._calls + 1
            deadline = None if self.config.timeout is None else self.cluster.monotonic() + self.config.timeout
            hooks = CallHooks(self.finish, self.check_session, lambda: self.stop(CallEnd.CANCELLED), self.cluster)
            future = self._in_flight[number] = WorkerFuture(hooks, world, refs, number, deadline, split)
        return future

    def finish(self, future: WorkerFuture, timeout: Optional[float]) -> List[Any]:
        """Wait for ``future``'s ranks; the values, or what the policy says and the error."""
        ended = True
        try:
            return self._finish(future, timeout)
        except TimeoutError as waited_out:
            ended = isinstance(waited_out, RaydistError)  # the group's timeout ended the call; result(timeout) did not
            raise
        finally:
            if ended:
                with self.life.lock:
                    self._in_flight.pop(future.number, None)

    def _finish(self, future: WorkerFuture, timeout: Optional[float]) -> List[Any]:
        self.check_session()
        stopped = lambda: self.life.stopped or (CallEnd.GROW if self._grow else None)  # noqa: E731 - read once the ranks are back
        try:
            values, error, waited = end_of_call(self.cluster, future, timeout, stopped, self.config.timeout)
        except BaseException as interrupted:  # KeyboardInterrupt included: leave nothing running
            if isinstance(interrupted, TimeoutError) and self.cluster.session() == self.session:
                raise  # result(timeout) ran out: the call runs on
            try:
                forward_signal(self.cluster, future.world, interrupted, future, self.config.shutdown_timeout)
            finally:
                self.stop(CallEnd.SHUT_DOWN)
            if self.cluster.session() != self.session:
                raise WorkerGroupClosed("Ray was shut down (ray.shutdown()) while this WorkerGroup's call ran") from interrupted
            raise
        if error is None:
            return values or []
        error = self._failure_of_its_world(future, error)
        self._state.abort(self.cluster, future.world.attempt)  # no rank waits on a step a dead rank never saves
        self._end_older_calls(future)
        self._after_failure(error, future, waited)
        raise error if self.attempts.restarted_after(error) else self.attempts.final(error)

    def _failure_of_its_world(self, future: WorkerFuture, error: RaydistError) -> RaydistError:
        """A call cut short by the stop that its world's failure caused (read
        after it) ends with that failure, as it would have read before it."""
        ended_by = self._ended_by
        if error.end is not CallEnd.SHUT_DOWN or ended_by is None or ended_by[0] is not future.world:
            return error
        failed = ended_by[1]
        same = WorkerGroupError(failed.failures, preempted_nodes=failed.preempted_nodes, collectives=failed.collectives)
        same.end = failed.end
        return same

    def _end_older_calls(self, future: WorkerFuture) -> None:
        """End the calls sent to ``future``'s world before it, oldest first: a
        rank runs its calls in order, so an older call's failure came first
        and is the one the run decides on, whichever future was read first.
        Each is waited for at most ``survivor_timeout`` (it ran before this
        one on every live rank; a rank stuck in it is the restart's to settle)."""
        with self.life.lock:
            older = [f for n, f in sorted(self._in_flight.items()) if n < future.number and f.world is future.world]
        for call in older:
            try:
                call.result(self.config.survivor_timeout)
            except (RaydistError, TimeoutError):
                pass  # its own reader gets its ending; here it only had to come first

    def _after_failure(self, error: RaydistError, future: WorkerFuture, waited: Waited) -> None:
        """Do what the policy says after a failed call: restart warm, or fresh, or stop.

        A failure is its world's: with several calls in flight, the first
        failure decided under the lock restarts the world (a warm restart
        claims RESTARTING in the same step), and a call of a world already
        replaced, read after it in any order or thread, ends as that
        restart says (``Action.CONTINUE``). A newer call queued on the old
        ranks runs before their teardown, which queues behind it."""
        life = self.life
        with life.lock:
            # Another call of this world may be restarting it: its outcome is this call's too.
            life.changed.wait_for(lambda: life.phase not in (GroupPhase.RESTARTING, GroupPhase.STARTING))
            replaced = self.world is not future.world
            decision = Decision(Action.RAISE)  # a run shutting down ends the call
            if not life.closing:
                decision = self.attempts.decide(error, self.holdings, started=True, world_replaced=replaced)
                if decision.action is Action.WARM:
                    life.move(GroupPhase.RESTARTING)  # claimed with the decision: one restart for one failure
        if decision.action is Action.CONTINUE:
            error.note_restarted_in_place(self.attempts.number)
            return
        if decision.action is Action.WARM and self._restart_warm(decision, error, future, waited):
            error.note_restarted_in_place(self.attempts.number)
            return
        if decision.restarts and self.attempts.fresh_restarts and not replaced:
            self._restart_fresh(decision, error, future, waited)
            return
        if isinstance(error, WorkerGroupError) and not life.closing:
            self._ended_by = (future.world, error)  # the calls of its world read after the stop end with it
        self.stop(CallEnd.SHUT_DOWN, settle=(future.number, waited))  # peers stuck in a collective need not wait

    def _restart_warm(self, decision: Decision, error: RaydistError, future: WorkerFuture, waited: Waited) -> bool:
        """Replace the failed ranks in place (``restart.WarmRestart``), the run
        in RESTARTING (claimed with the decision); False: it could not."""
        life, holdings, old = self.life, self.holdings, future.world
        assert holdings is not None and old is not None
        try:
            restarted = WarmRestart(life, self._builder, holdings, self.config).run(old, future.refs, waited, future.number)
        except BaseException:  # interrupted (Ctrl-C): no call may wait on a world that never comes
            self.stop(CallEnd.SHUT_DOWN)
            raise
        with life.lock:
            if restarted is None or life.phase is not GroupPhase.RESTARTING:
                if restarted is not None:
                    restarted[0].end()
                return False
            self.world = restarted[0]
            self.attempts.count(decision, error, old.size)
            life.move(GroupPhase.RUNNING)
        logger.warning(restarted[1])
        return True

    def _restart_fresh(self, decision: Decision, error: RaydistError, future: WorkerFuture, waited: Waited) -> None:
        """Tear the attempt down and start the next one in new processes (larger, for a growth)."""
        old = self.world
        if not self.life.move_if(GroupPhase.RUNNING, GroupPhase.STARTING):
            return  # a shutdown began meanwhile: it stops everything
        assert old is not None and self.holdings is not None
        old.stop_watching()
        self.holdings.release(graceful=False)
        old.close_output(future.number, waited.results, waited.marked_failures)
        self._builder.restart(list(dict.fromkeys(w.node_id for w in old.workers)))  # surviving nodes keep their ranks
        self.attempts.count(decision, error, old.size)
        self._start(error)

    def grow(self, cause: CallEnd = CallEnd.GROW) -> None:
        """The cluster has room for more workers: a run stops this attempt's
        world (its call ends, and the policy restarts it larger); a WorkerGroup stops."""
        if not self.attempts.fresh_restarts:
            return self.stop(cause)
        with self.life.lock:
            if self.life.phase is not GroupPhase.RUNNING or self.holdings is None:
                return
            self._grow = True
        self.holdings.release(graceful=False)  # the call's ranks die; finish() sees a growth

    # -- the end -----------------------------------------------------------
    def stop(self, cause: CallEnd, graceful: bool = False, settle: Optional[Tuple[int, Waited]] = None) -> None:
        """End the run for ``cause``; ``settle``: a failed call's output to wait for once the ranks are dead."""
        first = self.life.stop(cause)  # never waits on a restart: it holds the lock only between its steps
        with self.life.lock:
            self._in_flight.clear()  # no call ends another once the run stops
        world, holdings = self.world, self.holdings
        if world is not None:
            world.stop_watching()  # kept: what it saw explains the failure
        if self.cluster.session() == self.session:
            if holdings is not None:
                holdings.release(graceful and first)
            self._state.release(self.cluster)  # after the ranks: the last step they saved is written out first
        self._hooks.stop()
        self.summary.ended(cause.value)
        if world is not None:
            number, waited = settle if settle is not None else (None, Waited([]))
            world.close_output(number, waited.results, waited.marked_failures)
        self.life.close()

    # -- what the run is ---------------------------------------------------
    def held_resources(self) -> Any:
        holdings, world = self.holdings, self.world
        return holdings.held_resources(world.workers if world else []) if holdings else {}

    def attach(self, name: str, thing: Attachment) -> None:
        world = self.world
        if world is None:
            raise WorkerGroupClosed("this WorkerGroup has no running world to attach to")
        world.watchers.attach(name, thing)

    def check_usable(self) -> None:
        self.check_session()
        if self.life.closing:
            raise WorkerGroupClosed("this WorkerGroup has been shut down")

    def check_session(self) -> None:
        if self.cluster.session() != self.session:
            raise WorkerGroupClosed(SESSION_GONE)


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
                    error.note_summary(run.summary)
                    raise
    finally:
        run.stop(CallEnd.SHUT_DOWN, graceful=True)
