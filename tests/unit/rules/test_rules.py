"""The pool's pure rules, without Ray: feasibility and sizing, how a call
ended and whether the run restarts, failure reports, the output splitter,
a rank's launcher environment and the group watcher's decisions."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import pytest

from raydist.config import RunConfig, reserved_env_vars
from raydist.core.accelerators import BY_NAME, CPU
from raydist.core.environment import USER_DEFAULT_VARS
from raydist.errors import WorkerFailure, WorkerGroupError, WorkerGroupTimeout, WorkerStartupTimeout
from raydist.pool.driver.watcher import GroupWatcher
from raydist.pool.records import PHASE_TRANSITIONS, CallEnd, ClusterNode, GroupPhase, Outcome, WorkerInfo, check_transition
from raydist.pool.rules.explain import NODE_LOST_TEXT
from raydist.pool.rules.layout import RECORDER_BUFFER_VAR, worker_env
from raydist.pool.rules.logs import split_forwarded
from raydist.pool.rules.outcomes import death_line, rank_failure
from raydist.pool.rules.policy import Action, Decision, Facts, classify_end, decide, replace_straggler, scale_to
from raydist.pool.rules.restart_plan import Seat
from raydist.pool.rules.sizing import DATA_CPUS_LABEL, default_num_workers, infeasibility, resolve_accelerator, worker_bundle
from raydist.pool.rules.stragglers import Straggler

GPU = BY_NAME["gpu"]


def node(name: str, **resources: float) -> ClusterNode:
    return ClusterNode(node_id=name * 8, ip="10.0.0.1", resources=resources)


def worker(rank: int, node_id: str = "a" * 16, world: int = 2) -> WorkerInfo:
    return WorkerInfo(
        rank=rank,
        world_size=world,
        local_rank=rank,
        local_world_size=world,
        node_rank=0,
        num_nodes=1,
        node_id=node_id,
        node_ip="10.0.0.1",
        pid=100 + rank,
        device_ids=(),
        visible_device_ids=(),
        device_index=None,
        actor_index=rank,
    )


def failure(
    rank: int,
    *,
    died: Optional[str] = None,
    traceback: Optional[str] = None,
    at: float = 1.0,
    node_id: str = "a" * 16,
    exit_code: Optional[int] = None,
) -> WorkerFailure:
    return WorkerFailure(
        rank=rank, node_id=node_id, node_ip="10.0.0.1", pid=100 + rank, timestamp=at, traceback=traceback, died=died, exit_code=exit_code
    )


# -- sizing and feasibility ------------------------------------------------------


def test_auto_takes_the_device_named_in_the_resources_then_the_cluster_kind_then_cpu() -> None:
    gpu_cluster = [node("a", CPU=8, GPU=2)]
    assert resolve_accelerator("auto", {"GPU": 2}, [node("a", CPU=8)]) is GPU
    assert resolve_accelerator("auto", {}, gpu_cluster) is GPU
    assert resolve_accelerator("auto", {"GPU": 0}, gpu_cluster) is CPU  # GPU turned off explicitly
    assert resolve_accelerator("auto", {}, [node("a", CPU=8)]) is CPU
    assert resolve_accelerator("npu", {}, gpu_cluster) is BY_NAME["npu"]


def test_a_bundle_is_one_cpu_and_one_device_unless_overridden() -> None:
    assert worker_bundle(GPU, {}) == {"CPU": 1.0, "GPU": 1.0}
    assert worker_bundle(GPU, {"CPU": 4, "GPU": 0.5}) == {"CPU": 4.0, "GPU": 0.5}
    assert worker_bundle(CPU, {"CPU": 0, "custom": 1}) == {"custom": 1.0}
    with pytest.raises(ValueError, match="no resources"):
        worker_bundle(CPU, {"CPU": 0})


def test_default_size_is_one_worker_per_device_share() -> None:
    nodes = [node("a", CPU=8, GPU=2), node("b", CPU=8, GPU=3)]
    assert default_num_workers(GPU, {"CPU": 1, "GPU": 1}, nodes) == 5
    assert default_num_workers(GPU, {"CPU": 1, "GPU": 0.5}, nodes) == 10
    assert default_num_workers(CPU, {"CPU": 2}, nodes) == 8
    assert default_num_workers(GPU, {"GPU": 1}, [node("a", CPU=8)]) == 0


def test_a_default_size_leaves_out_the_cpus_a_private_ray_keeps_for_ray_data() -> None:
    private = ClusterNode("p" * 8, "10.0.0.1", {"CPU": 3.0, "GPU": 2.0}, {DATA_CPUS_LABEL: "1"})
    assert default_num_workers(CPU, {"CPU": 1}, [private]) == 2  # the machine's 2 cores, not 3
    assert default_num_workers(CPU, {"CPU": 0.5}, [private]) == 4
    assert default_num_workers(GPU, {"CPU": 1, "GPU": 1}, [private]) == 2  # devices are not kept
    assert default_num_workers(CPU, {"CPU": 1}, [dataclasses.replace(private, labels={DATA_CPUS_LABEL: "x"})]) == 3


def test_feasible_requests_have_no_reason() -> None:
    nodes = [node("a", CPU=4), node("b", CPU=2)]
    assert infeasibility({"CPU": 1}, 6, "PACK", nodes) is None
    assert infeasibility({"CPU": 1}, 2, "STRICT_SPREAD", nodes) is None


@pytest.mark.parametrize(
    "bundle, count, strategy, words",
    [
        ({"CPU": 1}, 7, "PACK", ["at most 6", "in the cluster", "[{CPU: 4}, {CPU: 2}]"]),
        ({"CPU": 1}, 5, "STRICT_PACK", ["at most 4", "on one node"]),
        ({"CPU": 1}, 3, "STRICT_SPREAD", ["at most 2", "on distinct nodes"]),
        ({"CPU": 1, "GPU": 1}, 1, "PACK", ["at most 0", "GPU: 0"]),
    ],
)
def test_infeasible_requests_say_what_fits_and_what_each_node_has(
    bundle: Dict[str, float], count: int, strategy: str, words: List[str]
) -> None:
    reason = infeasibility(bundle, count, strategy, [node("a", CPU=4), node("b", CPU=2)])
    assert reason is not None
    for word in words:
        assert word in reason


# -- how a call ended, and the restart policy -----------------------------------------


def test_a_call_ends_finished_timed_out_or_failed() -> None:
    assert classify_end([], []) is CallEnd.FINISHED
    assert classify_end([], [1]) is CallEnd.TIMED_OUT
    assert classify_end([failure(0, traceback="boom")], [1]) is CallEnd.RANK_FAILED
    assert classify_end([failure(0, died="killed by SIGSEGV")], []) is CallEnd.RANK_FAILED


def test_a_dead_node_is_a_lost_node_and_a_draining_one_a_preemption() -> None:
    lost = [failure(1, died=NODE_LOST_TEXT, at=2.0), failure(0, traceback="gloo: connection reset", at=1.0)]
    assert classify_end(lost, []) is CallEnd.NODE_LOST  # the death is the root cause, not the earlier raise
    assert classify_end(lost, [], drained_nodes={"a" * 16}) is CallEnd.DRAINED


def test_what_raydist_did_itself_explains_the_failures_first() -> None:
    failed = [failure(0, died="killed")]
    for stopped in (CallEnd.CANCELLED, CallEnd.GROW, CallEnd.SHUT_DOWN):
        assert classify_end(failed, [], stopped=stopped) is stopped
        assert classify_end([], [1], stopped=stopped) is stopped


def test_a_call_every_rank_finished_keeps_its_values_through_a_later_cancel() -> None:
    for stopped in (CallEnd.CANCELLED, CallEnd.GROW, CallEnd.SHUT_DOWN):
        assert classify_end([], [], stopped=stopped) is CallEnd.FINISHED


# Every way a call ends -> the restart kind (None: the run raises), without and with retry_on_exception.
RESTART_TABLE = [
    (CallEnd.RANK_FAILED, "traceback", None, "failure"),
    (CallEnd.RANK_FAILED, "died", "failure", "failure"),
    (CallEnd.NODE_LOST, "died", "node lost", "node lost"),
    (CallEnd.DRAINED, "died", "preemption", "preemption"),
    (CallEnd.TIMED_OUT, "traceback", None, None),  # README: a timeout= is never restarted
    (CallEnd.CANCELLED, "died", None, None),
    (CallEnd.SHUT_DOWN, "died", None, None),
]


@pytest.mark.parametrize("end, how, plain, retrying", RESTART_TABLE)
def test_the_restart_policy_for_every_way_a_call_ends(end: CallEnd, how: str, plain: Optional[str], retrying: Optional[str]) -> None:
    one = failure(
        0, **({"traceback": "boom"} if how == "traceback" else {"died": NODE_LOST_TEXT if end is CallEnd.NODE_LOST else "killed"})
    )
    for retry, expected in ((False, plain), (True, retrying)):
        error = group_error(end, one, preempted=(one.node_id,) if end is CallEnd.DRAINED else ())
        decision = decide(error, facts(retry_on_exception=retry))
        assert (decision.reason.kind if decision.reason else None) == expected, (end, retry)
        assert decision.restarts == (expected is not None)
    assert decide(WorkerStartupTimeout(1.0, "started", 2, []), facts(retry_on_exception=True)).action is Action.RAISE


def facts(**changed: Any) -> Facts:
    plain = dict(
        restarts_left=1,
        retry_on_exception=False,
        driver_node="driver",
        started=True,
        warm_restarts=True,
        node_layout=False,
        fresh_allowed=True,
    )
    return Facts(**{**plain, **changed})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changed", "action"),
    [
        ({}, Action.WARM),  # the survivors stay
        ({"started": False}, Action.FRESH),  # a failed start has no survivors
        ({"warm_restarts": False}, Action.FRESH),  # restart_mode="fresh"
        ({"node_layout": True}, Action.FRESH),  # whole nodes are replaced
        ({"node_layout": True, "fresh_allowed": False}, Action.RAISE),  # a WorkerGroup does not start afresh
        ({"warm_failed": True}, Action.FRESH),  # the warm restart could not finish: a run starts afresh, counted once
        ({"warm_failed": True, "fresh_allowed": False}, Action.RAISE),  # a WorkerGroup starts no new attempt
        ({"stopping": True}, Action.RAISE),  # a stop was asked meanwhile: the run ends
        ({"restarts_left": 0}, Action.RAISE),
        ({"driver_node": "n" * 16}, Action.RAISE),  # the driver's own node drains (for a preemption)
    ],
)
def test_the_policy_chooses_warm_fresh_or_raise_from_the_facts(changed: Dict[str, Any], action: Action) -> None:
    end = CallEnd.DRAINED if "driver_node" in changed else CallEnd.RANK_FAILED
    one = failure(0, died="killed", node_id="n" * 16)
    error = group_error(end, one, preempted=(one.node_id,) if end is CallEnd.DRAINED else ())
    decision = decide(error, facts(**changed))
    assert decision.action is action, decision
    assert (decision.why_not is not None) == ("driver_node" in changed)


def test_phases_move_only_along_the_table() -> None:
    reachable = {GroupPhase.STARTING}
    for _ in GroupPhase:
        reachable |= {to for (frm, to) in PHASE_TRANSITIONS if frm in reachable}
    assert reachable == set(GroupPhase)  # every phase can be reached, CLOSED from every other
    assert all(
        (phase, GroupPhase.SHUTTING_DOWN) in PHASE_TRANSITIONS for phase in GroupPhase if phase.value not in ("shutting down", "closed")
    )
    check_transition(GroupPhase.RESTARTING, GroupPhase.RUNNING)
    for bad in [
        (GroupPhase.CLOSED, GroupPhase.RUNNING),
        (GroupPhase.SHUTTING_DOWN, GroupPhase.RESTARTING),
        (GroupPhase.STARTING, GroupPhase.RESTARTING),
    ]:
        with pytest.raises(RuntimeError, match="cannot go from"):
            check_transition(*bad)


def group_error(end: CallEnd, *failures: WorkerFailure, preempted: Tuple[str, ...] = ()) -> WorkerGroupError:
    error = WorkerGroupError(failures, preempted_nodes=preempted)
    error.end = end
    return error


def decided(error: BaseException, *, retry: bool = False, left: int = 1, driver: Optional[str] = None) -> Decision:
    return decide(error, facts(retry_on_exception=retry, restarts_left=left, driver_node=driver))


def test_a_dead_rank_restarts_while_restarts_are_left() -> None:
    error = group_error(CallEnd.RANK_FAILED, failure(1, died="killed by SIGKILL"))
    decision = decided(error)
    assert decision.reason is not None and decision.reason.counted
    assert "rank 1" in decision.reason.detail and "SIGKILL" in decision.reason.detail
    assert decided(error, left=0).reason is None


def test_code_that_raised_restarts_only_with_retry_on_exception() -> None:
    error = group_error(CallEnd.RANK_FAILED, failure(0, traceback="Traceback ...\nValueError: bad batch\n"))
    assert decided(error).reason is None
    decision = decided(error, retry=True)
    assert decision.reason is not None and decision.reason.detail == "rank 0: ValueError: bad batch"


def test_a_replaced_straggler_restarts_warm_and_is_not_counted() -> None:
    replaced = group_error(CallEnd.REPLACED, failure(1, died="replaced by raydist: it reached collectives 200 ms after the others"))
    decision = decided(replaced, left=0)
    assert decision.action is Action.WARM and decision.reason is not None and not decision.reason.counted
    assert decision.reason.kind == "straggler" and decision.reason.detail.startswith("rank 1 on node aaaaaaaaaaaa replaced by raydist")


def test_a_straggler_is_replaced_only_by_a_spare_on_another_node_that_is_not_excluded() -> None:
    slow = Straggler(rank=3, late_s=0.2, collectives=20, last_seq=60)
    assert replace_straggler(slow, "b", [Seat(4, "c")], excluded=(), stopping=False) == (3,)
    assert replace_straggler(slow, "b", [Seat(4, "b")], excluded=(), stopping=False) == ()  # as slow as it
    assert replace_straggler(slow, "b", [Seat(4, "c")], excluded={"c"}, stopping=False) == ()
    assert replace_straggler(slow, "b", [], excluded=(), stopping=False) == ()
    assert replace_straggler(slow, "b", [Seat(4, "c")], excluded=(), stopping=True) == ()


def test_the_death_of_a_replaced_straggler_ends_the_call_as_a_replacement() -> None:
    killed = failure(1, died="replaced by raydist", at=2.0)
    peer = failure(0, traceback="RuntimeError: [gloo] Connection closed by peer", at=1.0)
    assert classify_end([killed, peer], [], replaced={1}) is CallEnd.REPLACED
    assert classify_end([killed, peer], [], replaced={2}) is CallEnd.RANK_FAILED
    assert classify_end([killed], [], stopped=CallEnd.SHUT_DOWN, replaced={1}) is CallEnd.SHUT_DOWN


def test_a_preemption_is_not_counted() -> None:
    drained = group_error(CallEnd.DRAINED, failure(0, died="killed"), preempted=("a" * 16,))
    decision = decided(drained, left=0)
    assert decision.reason is not None and not decision.reason.counted


@pytest.mark.parametrize(
    ("size", "more", "sizes", "fresh_allowed", "target"),
    [
        (2, 2, (2, 4), True, 4),  # room for two more: up to the maximum
        (2, 5, (2, 4), True, 4),  # never past it
        (3, 1, (2, 4), True, 4),
        (4, 2, (2, 4), True, None),  # at the maximum already
        (2, 0, (2, 4), True, None),  # no room
        (2, 2, None, True, None),  # a fixed size does not grow
        (2, 2, (2, 4), False, None),  # a WorkerGroup starts no new attempt: it stays as it is
    ],
)
def test_the_scaling_rule_says_the_size_to_grow_to(size: int, more: int, sizes: Any, fresh_allowed: bool, target: Optional[int]) -> None:
    assert scale_to(size, more, sizes, fresh_allowed) == target


def test_a_drain_of_the_drivers_own_node_is_not_restarted_and_says_why() -> None:
    drained = group_error(CallEnd.DRAINED, failure(0, died="killed"), preempted=("a" * 16,))
    decision = decided(drained, driver="a" * 16)
    assert decision.reason is None and "driver's node" in (decision.why_not or "")


def test_timeouts_and_unclassified_errors_end_the_run() -> None:
    timeout = WorkerGroupTimeout(5.0, [1])
    timeout.end = CallEnd.TIMED_OUT
    assert decided(timeout, retry=True, left=5).reason is None
    assert decided(ValueError("bad option"), retry=True, left=5).reason is None


# Every way a call ends, and whether the run restarts: (without, with) retry_on_exception.
RESTARTS_BY_END = {
    CallEnd.FINISHED: (False, False),
    CallEnd.RANK_FAILED: (False, True),  # code that raised; a dead process restarts either way (above)
    CallEnd.NODE_LOST: (True, True),
    CallEnd.DRAINED: (True, True),
    CallEnd.GROW: (False, False),  # growth is not a failure: the scaling rule decides it (scale_to)
    CallEnd.REPLACED: (True, True),  # raydist put a spare in a straggler's place
    CallEnd.TIMED_OUT: (False, False),  # as the README says: a timeout= is never restarted
    CallEnd.CANCELLED: (False, False),
    CallEnd.SHUT_DOWN: (False, False),
}


@pytest.mark.parametrize("end", list(CallEnd))
def test_the_restart_decision_for_every_call_ending(end: CallEnd) -> None:
    died = "the node died" if end is CallEnd.NODE_LOST else "killed"
    fails = failure(0, died=died) if end in (CallEnd.NODE_LOST, CallEnd.DRAINED) else failure(0, traceback="ValueError: x")
    error: BaseException = group_error(end, fails, preempted=("a" * 16,) if end is CallEnd.DRAINED else ())
    if end is CallEnd.TIMED_OUT:
        error = WorkerGroupTimeout(5.0, [1])
        error.end = end
    for retry, expected in zip((False, True), RESTARTS_BY_END[end]):
        assert (decided(error, retry=retry, left=5).reason is not None) is expected, (end, retry)


def test_a_startup_timeout_is_never_restarted() -> None:
    assert decided(WorkerStartupTimeout(60.0, "started", 2, ["rank 1"]), retry=True, left=5).reason is None


# -- failure reports ------------------------------------------------------------------


def test_a_failure_summary_is_the_cause_not_the_last_printed_line() -> None:
    assert failure(0, traceback="Traceback (most recent call last):\n  ...\nKeyError: 'x'\n\n").summary() == "KeyError: 'x'"
    assert failure(0, exit_code=3).summary() == "exited with status 3"
    assert failure(0, died="killed by SIGSEGV").summary() == "process died: killed by SIGSEGV"


def test_the_report_groups_identical_failures_and_marks_the_root_cause() -> None:
    same = "Traceback ...\nRuntimeError: peer gone\n"
    error = WorkerGroupError(
        [failure(2, traceback=same, at=3.0), failure(0, died="killed by SIGKILL", at=5.0), failure(1, traceback=same, at=2.0)]
    )
    message = str(error)
    assert error.root_cause.rank == 0  # a death wins over the peers' errors
    assert error.failed_ranks == [0, 1, 2]
    assert message.count("RuntimeError: peer gone") == 1
    assert "--- rank 0 [root cause]" in message and "--- ranks 1-2 on node" in message


def test_a_failure_record_from_an_outcome_or_a_death() -> None:
    outcome = Outcome(traceback="tb", exception_type="ValueError", timestamp=7.0)
    made = rank_failure(1, worker(1), outcome=outcome, now=9.0)
    assert (made.rank, made.pid, made.traceback, made.timestamp, made.crashed) == (1, 101, "tb", 7.0, False)
    dead = rank_failure(0, None, died="exited", now=9.0)
    assert dead.crashed and dead.node_id == "?" and dead.timestamp == 9.0  # a death is stamped when it was seen
    text = "The actor died unexpectedly.\nWorker exit type: SYSTEM_ERROR Worker exit detail: killed by signal 9\n"
    assert death_line(text).startswith("Worker exit type")
    assert death_line("") == "the worker process died"


# -- output, environment, watcher ---------------------------------------------------------


def test_forwarded_lines_are_split_from_markers_and_rays_tqdm_lines() -> None:
    token = "raydist-output-end-abc"
    lines = ["first", "partial" + token + " 4", "__ray_tqdm_magic_token__ {}", token + " 5", "last"]
    kept, marked, tqdm = split_forwarded(lines, token)
    assert kept == ["first", "partial", "last"] and marked == 5 and len(tqdm) == 1
    assert split_forwarded([token + " mangled"], token) == ([], None, [])


def test_a_ranks_environment_is_torchruns_plus_devices_then_the_users() -> None:
    info = dataclasses.replace(worker(1), device_ids=("3",), visible_device_ids=("2", "3"), device_index=1)
    config = RunConfig(num_workers=2, env={"MY_FLAG": "1"}, max_restarts=2)
    env = worker_env(
        info,
        master_addr="10.0.0.9",
        master_port=29511,
        run_id="run",
        restart_count=1,
        config=config,
        accelerator=GPU,
        cpus=4.0,
        extra={"EXTRA": "x"},
    )
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == (
        "1",
        "1",
        "2",
        "10.0.0.9",
        "29511",
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["RAYDIST_DEVICE_INDEX"] == "1"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "1" and env["TORCHELASTIC_MAX_RESTARTS"] == "2"
    assert env["OMP_NUM_THREADS"] == "4" and env["MY_FLAG"] == "1" and env["EXTRA"] == "x"


def test_every_variable_the_launcher_sets_is_reserved_from_env() -> None:
    info = dataclasses.replace(worker(1), device_ids=("3",), visible_device_ids=("2", "3"), device_index=1)
    env = worker_env(
        info,
        master_addr="h",
        master_port=1,
        run_id="r",
        restart_count=0,
        config=RunConfig(num_workers=2),
        accelerator=GPU,
        cpus=1.0,
        extra={},
        error_file="/tmp/error.json",
    )
    names, prefixes = reserved_env_vars()
    kept = {*USER_DEFAULT_VARS, RECORDER_BUFFER_VAR}  # defaults that keep a value the user set
    assert [name for name in env if name not in kept and name not in names and not name.startswith(prefixes)] == []
    for name in sorted(set(env) - kept):
        with pytest.raises(ValueError):
            RunConfig(num_workers=2, env={name: "x"})


def test_the_watcher_warns_each_draining_node_once_and_stops_to_grow() -> None:
    warned: List[Tuple[List[int], float]] = []
    stopped: List[bool] = []
    workers = [worker(0, "a" * 16, 3), worker(1, "a" * 16, 3), worker(2, "b" * 16, 3)]
    watcher = GroupWatcher(workers, lambda ranks, deadline: warned.append((ranks, deadline)), lambda: stopped.append(True))
    watcher.look({"b" * 16: 99.0, "z" * 16: 5.0})  # z is not the group's
    watcher.look({"b" * 16: 99.0})
    assert warned == [([2], 99.0)] and watcher.drained == {"b" * 16: 99.0} and not stopped
    growing = GroupWatcher(workers, lambda ranks, deadline: None, lambda: stopped.append(True), room=lambda: 2)
    growing.look({})
    assert stopped == [True] and growing.grow_by == 2


@pytest.mark.parametrize(
    ("outcome", "sent_bare"),
    [
        (Outcome(value={"loss": 1.0}), True),  # a plain success: only its value travels
        (Outcome(), True),
        (Outcome(value=Outcome(value=3)), False),  # a value that is itself an Outcome keeps its wrapper
        (Outcome(value=(i for i in range(3))), False),  # Ray would take a bare generator as several return values
        (Outcome(value=iter([1])), False),
        (Outcome(value=ValueError("x")), False),  # (a bare Ray error would be raised by ray.get)
        (Outcome(value=collections.OrderedDict(a=1)), False),  # only the exact plain types go bare
        (Outcome(value=[1, (2, "a")]), True),
        (Outcome(exit_code=2, timestamp=1.0), False),
        (Outcome(traceback="tb", exception_type="ValueError"), False),
    ],
)
def test_only_a_plain_success_travels_without_its_outcome(outcome: Outcome, sent_bare: bool) -> None:
    sent = outcome.to_send()
    if sent_bare:
        assert sent == outcome.value and not isinstance(sent, Outcome)
    else:
        assert sent is outcome
