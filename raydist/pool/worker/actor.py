"""The Ray actor behind each rank: report placement, set up, run calls, tear down."""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import socket
import sys
import time
import traceback
from types import TracebackType
from typing import TYPE_CHECKING, AbstractSet, Any, Callable, FrozenSet, Mapping, Optional, Tuple

import ray
import ray.cloudpickle

from raydist.core.environment import TORCHRUN_ENV_VARS
from raydist.pool.ray_private import ACTOR_NAME_TOKEN
from raydist.pool.records import INLINE_CALL_BYTES, Outcome, Placement, WorkerEvidence, WorkerInfo, WorkerSpec
from raydist.pool.rules.hangs import mark_failed, needs_attribution
from raydist.pool.timeline import ENV_VAR as TIMELINE_ENV
from raydist.pool.timeline import OWN_CALL_SPAN_S, SPANS, process_started
from raydist.pool.worker import datasets, debugger, exit_hooks, state_client
from raydist.pool.worker.connections import Connection, hold_store, note_groups_created, reserve_port, shut_down, tcp_connections
from raydist.pool.worker.evidence import leave_evidence, scratch_dir, user_code_interruptible
from raydist.pool.worker.group_refs import GroupRefs
from raydist.pool.worker.markers import marks_output, write_whole_lines
from raydist.pool.worker.recorder import recent_collectives, serve_diagnostics
from raydist.pool.worker.run_ahead import RunAhead

# The driver imports this module to define the actor; torch (the core) is
# imported only inside the actor's methods, so a driver never loads it.
if TYPE_CHECKING:
    from raydist.core.initialize import DistInfo

PROCESS_STARTED = process_started()


def _user_traceback(error: BaseException) -> str:
    """The traceback from the user's first frame: raydist's own frames around
    the call (this module, the script runner, runpy) are left out."""
    tb: Optional[TracebackType] = error.__traceback__
    machinery = (__file__, os.path.join(os.path.dirname(__file__), "script.py"))
    while (
        tb is not None
        and tb.tb_next is not None
        and (tb.tb_frame.f_code.co_filename in machinery or "runpy" in tb.tb_frame.f_code.co_filename)
    ):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def _error_file_report(started: float, scratch_path: str = "") -> Optional[str]:
    """What a ``@record``-decorated script wrote to TORCHELASTIC_ERROR_FILE
    during this call (torchrun shows this instead of its own traceback). The
    file is named unless it is ``scratch_path``, removed with the worker."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or not os.path.isfile(path) or os.path.getmtime(path) < started:
        return None
    try:
        with open(path) as file:
            data = json.load(file)
        message = data["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    where = "its error file" if path == scratch_path else f"error file {path}"
    if isinstance(message, dict):
        text = str(message.get("message", ""))
        stack = str((message.get("extraInfo") or {}).get("py_callstack", "")).rstrip()
        return f"{stack}\n({where}: {text})" if stack else f"{text}\n({where})"
    return f"{message}\n({where})"


_imports_frozen = False


def _freeze_imports() -> None:
    """Once per process, after set-up's imports (torch, Ray, raydist): those
    objects live as long as the process, so the full collection of a warm
    restart's teardown (which the whole restart waits for) skips them."""
    global _imports_frozen
    if not _imports_frozen:
        gc.freeze()
        _imports_frozen = True


def _import_for_setup() -> None:
    """What ``setup`` imports in a process that never set up: its spec's classes
    (read before the call starts), its own imports and torch.distributed's
    backend class. A spare does it while standing by: when it takes a rank, these
    tens of milliseconds would hold up the whole world's initialisation."""
    import raydist.config.options  # noqa: F401 - a WorkerSpec's config
    from raydist.core import collectives, initialize  # noqa: F401
    from raydist.core.backend import backend_entry, load
    from raydist.pool.worker import object_store  # noqa: F401

    load(backend_entry(None).worker)


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1


def _raised_in_collective(error: BaseException) -> bool:
    """The error came out of a torch.distributed call (its innermost frames are torch's)."""
    tb, files = error.__traceback__, []
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return any(os.path.join("torch", "distributed") in name for name in files[-3:])


def _sent_compact(execute: Callable[[Any, Optional[bytes]], Outcome]) -> Callable[[Any, Optional[bytes]], Any]:
    """A plain success goes back as its bare value (``Outcome.to_send``): the
    driver reads either form. What this rank recorded since its last result
    (``SPANS``: its start-up, its waits, the call's own span unless the call
    was shorter than ``OWN_CALL_SPAN_S``, which the driver then draws from
    its own view) goes with it."""

    @functools.wraps(execute)
    def run(self: Any, call: Optional[bytes] = None) -> Any:
        started = time.time()
        outcome = execute(self, call)
        ended = time.time()
        if ended - started >= OWN_CALL_SPAN_S:
            SPANS.add("call", "call", started, ended)
        spans, waits = SPANS.take()
        if spans or waits:
            outcome = dataclasses.replace(outcome, spans=spans, waits=waits)
        return outcome.to_send()

    return run


def _spanned(name: str, cat: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Record a start-up step as a span (kept: the timeline is switched on by
    the run's environment, which set-up brings, and sent with the first result)."""

    def wrap(step: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(step)
        def timed(self: Any, *args: Any) -> Any:
            started = PROCESS_STARTED if name == "start" and not SPANS.started else time.time()
            value = step(self, *args)
            SPANS.switch(bool(os.environ.get(TIMELINE_ENV)))
            if name != "start" or not SPANS.started:  # a kept process is described again at each warm restart
                SPANS.add(name, cat, started, time.time(), pid=os.getpid())
            SPANS.started = True
            return value

        return timed

    return wrap


def _pin_device(device_type: str) -> None:
    """Make this process's device (``RAYDIST_DEVICE_INDEX``) current in the calling thread."""
    from raydist.core.devices import is_device_available, is_indexed, set_device
    from raydist.core.environment import DEVICE_INDEX_VAR

    index = os.environ.get(DEVICE_INDEX_VAR)
    if index is not None and is_indexed(device_type) and is_device_available(device_type)[0]:
        set_device(f"{device_type}:{index}")


class RayWorker:
    """One rank. Created inside its placement-group bundle by WorkerGroup."""

    def __init__(self, accelerator_resource: Optional[str]):
        self._accelerator_resource = accelerator_resource
        self._worker: Optional[WorkerInfo] = None
        self._returned_type = ""  # of the last value returned, named if it cannot travel
        self._post_mortem = False
        self._evidence: Optional[WorkerEvidence] = None
        exit_hooks.install_recorder()  # a script's atexit handlers run when it ends (see run_script)
        write_whole_lines()  # a printed line reaches the driver whole
        self._group_connections: FrozenSet[Connection] = frozenset()  # opened by the process groups
        self._created_groups = GroupRefs()  # the code's own groups, freed last (see group_refs)
        self._reserved: Optional[socket.socket] = None  # the free port this worker offered for MASTER_PORT
        self._store: Any = None  # rank 0: the rendezvous store on MASTER_PORT, held for the world's life
        self._last_call = b""  # the last small call: execute() without one runs it again
        self._probed_device = "cpu"  # the device the pre-flight probes run on (probe_ready)
        self._device_type = "cpu"  # the kind of device this process pins (stand_by, setup)
        self._ahead: Optional[RunAhead] = None  # the call run ahead to its load_state (run_ahead)

    def __repr__(self) -> str:
        return f"rank={self._worker.rank}" if self._worker else "raydist worker"

    @_spanned("start", "start")  # the process's start and imports, until it reports where it runs
    def describe(self, index: int, used_ports: AbstractSet[int] = frozenset()) -> Placement:
        """Where this worker runs, and a free port for MASTER_PORT other than
        the group's earlier ones (`used_ports`), held until set-up (rank 0's
        store then listens on it: no other run on the node can take it between)."""
        context = ray.get_runtime_context()
        ids = context.get_accelerator_ids().get(self._accelerator_resource, []) if self._accelerator_resource else []
        evidence = self._evidence
        if evidence is None:  # once per process: a kept worker is described again at each warm restart
            evidence = WorkerEvidence.for_process(os.getpid(), scratch_dir())
            leave_evidence(evidence)
            serve_diagnostics(evidence.diagnostics_path)  # answers while a collective blocks the call
            self._evidence = evidence
        return Placement(
            index=index,
            node_id=context.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            pid=os.getpid(),
            accelerator_ids=tuple(str(i) for i in ids),
            free_port=self._reserve_port(used_ports),
            evidence=evidence,
            hostname=socket.gethostname(),
        )

    @_spanned("init", "init")  # the launcher environment and the process group
    def setup(self, spec: WorkerSpec) -> Optional["DistInfo"]:
        """Set the launcher environment, then (unless the code initialises itself) initialise."""
        from raydist.core import collectives
        from raydist.core.backend import register_backend
        from raydist.core.initialize import init_distributed
        from raydist.pool.worker.object_store import RayObjectStoreTransport

        if self._ahead is not None:
            self._ahead.settle()  # the function run ahead sees no launcher environment before its load_state
        self._worker, self._device_type = spec.worker, spec.device_type
        for stream in (sys.stdout, sys.stderr):
            print(f"{ACTOR_NAME_TOKEN}rank={spec.worker.rank}", file=stream, flush=True)
        os.environ.update(spec.env)
        self._hold_master_port(spec.worker.rank)
        state_client.install(spec.env)  # save_state/load_state keep copies with the run's holders
        debugger.install()  # breakpoint() opens pdb in the driver's terminal, not Ray's debugpy hook
        self._post_mortem = spec.config.post_mortem
        if os.environ.get("TORCHELASTIC_ERROR_FILE"):
            # torch's @record writes the file but does not create its directory.
            os.makedirs(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"]), exist_ok=True)
        if spec.config.numa_binding is not None:
            from raydist.pool.worker.binding import bind_rank

            bind_rank(spec)
        threshold = spec.config.object_store_threshold
        if threshold is not None:
            collectives.set_large_object_transport(RayObjectStoreTransport(threshold))
        if spec.backend_entry is not None:  # a backend registered on the driver only (a plugin)
            register_backend(spec.backend_entry)
        if spec.init_kwargs is None:  # the code creates its process group: its connections are noted then
            note_groups_created(self._note_group)
            return None
        # A world of one gets its process group too: the run asked for one.
        before = tcp_connections()
        context = init_distributed(device=spec.device_type, timeout=spec.config.pg_timeout, world_of_one=True, **spec.init_kwargs)
        self._group_connections = tcp_connections() - before  # shut down for sure at teardown
        _freeze_imports()
        return context

    def _reserve_port(self, used_ports: AbstractSet[int]) -> int:
        self._release_port()
        self._reserved = reserve_port(avoid=used_ports)
        return int(self._reserved.getsockname()[1])

    def _hold_master_port(self, rank: int) -> None:
        """Rank 0 turns the port it reserved into the world's store (any
        ``init_process_group`` here then shares it); the others let theirs go."""
        reserved, self._reserved = self._reserved, None
        if reserved is None:
            return
        if rank == 0 and os.environ.get("MASTER_PORT") == str(reserved.getsockname()[1]):
            self._store = hold_store(reserved, os.environ.get("MASTER_ADDR", "127.0.0.1"))
        else:
            reserved.close()

    def _release_port(self) -> None:
        reserved, self._reserved, self._store = self._reserved, None, None
        if reserved is not None:
            reserved.close()

    def _note_group(self, group: Any, opened: FrozenSet[Connection]) -> None:
        self._group_connections |= opened
        self._created_groups.hold(group)

    @_sent_compact
    @marks_output  # lets the driver wait for the lines this call printed
    def execute(self, call: Optional[bytes] = None) -> Outcome:
        """Run ``fn(*args, **kwargs)`` pickled as one blob by the driver (None: the last small one again)."""
        started, call = time.time(), self._last_call if call is None else call
        self._last_call = call if len(call) <= INLINE_CALL_BYTES else b""  # unpickled afresh each time
        ahead, self._ahead = self._ahead, None
        failed = False
        try:
            if ahead is not None and ahead.release(call):
                value = self._go_on(ahead, call)
            else:
                fn, args, kwargs = ray.cloudpickle.loads(call)
                with user_code_interruptible():  # a forwarded SIGINT: KeyboardInterrupt here, death elsewhere
                    value = fn(*args, **kwargs)
            state_client.flush()  # the last saved step reaches its holders before the call ends
            self._returned_type = f"{type(value).__module__}.{type(value).__qualname__}"
            outcome = Outcome(value=value)
        except SystemExit as stop:
            state_client.flush()
            code = _exit_code(stop.code)
            if code:
                return Outcome(exit_code=code, timestamp=time.time())
            outcome = Outcome()
        except BaseException as error:  # noqa: BLE001 - every ending of the user's code is reported
            failed = True
            return self._failed(error, started)
        finally:
            datasets.end_call(failed)  # this call's dataset shards go with it
        self._created_groups.release()  # a failed call's wait for teardown, which shuts their connections first
        return outcome

    def _go_on(self, ahead: RunAhead, call: bytes) -> Any:
        """The value of the function run ahead, gone on from its load_state; run
        from the top when it ended before (it raised without its rank)."""
        with user_code_interruptible():
            ahead.join()
            if not ahead.passed:
                fn, args, kwargs = ray.cloudpickle.loads(call)
                return fn(*args, **kwargs)
        SPANS.add("run ahead", "ahead", ahead.started_at, ahead.parked_at, pid=os.getpid())  # (the timeline is on by now)
        if ahead.error is not None:
            raise ahead.error
        return ahead.value

    def run_ahead(self, call: bytes) -> None:
        """Start ``call``'s function in a thread, to park at its first ``load_state``
        until the process runs the same call in a world (``run_ahead``). A kept
        process, between its teardown and its next world, drops its old
        launcher environment first: the function must not read the old rank."""
        if self._ahead is not None:
            self._ahead.discard()
        if self._worker is not None:
            for name in TORCHRUN_ENV_VARS:
                os.environ.pop(name, None)
        self._ahead = RunAhead(call, ray.cloudpickle.loads, functools.partial(_pin_device, self._device_type))
        self._ahead.start()

    def set_dataset_shards(self, iterators: Mapping[str, Any]) -> None:
        """The next call's Ray Data iterators (queued just before it)."""
        datasets.set_shards(iterators)

    def _failed(self, error: BaseException, started: float) -> Outcome:
        """The Outcome of a call that raised: its traceback, and its last
        collectives when it raised inside one (a process group timeout)."""
        collectives = recent_collectives()
        if collectives and _raised_in_collective(error):
            collectives = mark_failed(collectives)
        if self._post_mortem and not isinstance(error, debugger.QUIT_ERRORS):
            debugger.post_mortem(error)  # the rank stays here until its pdb session ends
        try:
            pickled: Optional[bytes] = ray.cloudpickle.dumps(error)
        except Exception:  # noqa: BLE001 - an unpicklable error is sent as text
            pickled = None
        error_path = self._evidence.error_path if self._evidence else ""
        return Outcome(
            traceback=_error_file_report(started, error_path) or _user_traceback(error),
            exception_type=type(error).__name__,
            exception=pickled,
            timestamp=time.time(),
            collectives=collectives if needs_attribution(collectives) else None,
        )

    def stand_by(self, env: Mapping[str, str], device_type: str) -> int:
        """A spare: import what ``setup`` needs and pin the device now (its
        node's visible devices already count it), so that joining a world
        later costs only the initialisation. Returns the pid."""
        import torch.distributed

        try:  # what DistributedDataParallel imports the first time a process builds one (seconds too)
            import torch._dynamo  # noqa: F401
        except ImportError:
            pass

        _import_for_setup()
        os.environ.update(env)
        self._device_type = device_type
        _pin_device(device_type)
        return os.getpid()

    def probe_ready(self, env: Mapping[str, str], device_type: str) -> str:
        """Before the pre-flight probes: torch imported and the device pinned from
        ``env`` (as a spare's is), so that no worker's probe is timed while another
        imports; the device probed ("" when the pinning failed: the probe says why)."""
        import torch  # noqa: F401

        from raydist.core.devices import is_device_available, is_indexed, set_device
        from raydist.core.environment import DEVICE_INDEX_VAR
        from raydist.pool.worker import health  # noqa: F401

        os.environ.update(env)
        index = env.get(DEVICE_INDEX_VAR)
        self._probed_device = "cpu"
        try:
            if index is not None and is_indexed(device_type) and is_device_available(device_type)[0]:
                self._probed_device = f"{device_type}:{index}"
                set_device(self._probed_device)
        except Exception as error:  # noqa: BLE001 - said by the probe
            self._probed_device = f"!{type(error).__name__}: {error}"
        return self._probed_device

    def probe(self, mode: str, threads: int) -> Tuple[Optional[float], str]:
        """The pre-flight probes (``raydist.pool.worker.health``) on the device
        ``probe_ready`` pinned: (GFLOP/s, "") or (None, why they failed)."""
        import torch

        from raydist.pool.worker import health

        device = self._probed_device
        if device.startswith("!"):
            return None, device[1:]
        try:
            gflops = health.compute_gflops(torch.device(device), mode, threads)
            health.check_memory(torch.device(device), mode)
        except Exception as error:  # noqa: BLE001 - a probe that fails is the verdict
            return None, f"{type(error).__name__}: {error}"
        return gflops, ""

    def probe_collective(self, mode: str) -> Tuple[float, float]:
        """The pre-flight all_reduce on the world's process group: (bus GB/s, seconds); raises on a wrong sum."""
        from raydist.core.initialize import get_context
        from raydist.pool.worker import health

        return health.collective_gbps(mode, get_context().device)

    def ping(self) -> int:
        return os.getpid()

    def returned_type(self) -> str:
        """The type of the value the last call returned (asked when it could not be sent)."""
        return self._returned_type

    def teardown(self) -> None:
        """Leave the process group (also what a warm restart does before this
        process joins the next world); the process lives on."""
        from raydist.core import collectives
        from raydist.core.initialize import shutdown

        collectives.set_large_object_transport(None)
        shutdown()
        gc.collect()  # a failed call's frames may still hold the process group
        # If something still does, its connections stay open: peers blocked on
        # this rank would wait for the process group's timeout. Close them now.
        shut_down(self._group_connections)
        self._group_connections = frozenset()
        self._created_groups.release()
        self._release_port()  # the world's store goes with it
