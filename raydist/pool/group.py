"""WorkerGroup: a pool of Ray actors, one per rank, with a live process group.

Start-up is two round trips: every actor reports where it landed (node,
accelerator ids, a free port), the driver derives the ranks, then every actor
gets its launcher environment and initialises. Calls are then one round trip.
Any failure tears the whole group down: peers stuck in a collective are
killed, not waited for.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import ray
import ray.cloudpickle
from ray.exceptions import RayActorError
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from tqdm.auto import tqdm

from raydist.core.environment import torchrun_env
from raydist.pool.errors import WorkerFailure, WorkerGroupError, WorkerGroupTimeout
from raydist.core.initialize import DistInfo, import_horovod
from raydist.pool.layout import Placement, WorkerInfo, assign_ranks
from raydist.pool.object_store import DEFAULT_THRESHOLD_BYTES
from raydist.pool.placement import (
    ACCELERATORS,
    DEVICE_OF_RESOURCE,
    PLACEMENT_STRATEGIES,
    VISIBLE_DEVICES_VAR,
    alive_nodes,
    default_num_workers,
    reserve,
    resolve_accelerator,
    worker_bundle,
)
from raydist.pool.worker import Outcome, RayWorker

__all__ = ["WorkerGroup", "WorkerFuture", "WorkerInfo"]

# After the first failure, how long to let other ranks report theirs (so that
# the same error on every rank is reported once, with all the ranks).
FAILURE_GRACE_S = 0.5
# How long a graceful shutdown waits for workers to leave the process group.
TEARDOWN_TIMEOUT_S = 5.0
# How long a call's first, all-ranks wait lasts before failure-aware waiting.
FAST_PATH_S = 0.05
# Calls up to this size travel inside each actor task (no object-store round trip).
INLINE_CALL_BYTES = 64 * 1024
_RemoteWorker = ray.remote(RayWorker)
_FETCH_ONE = object()  # marks a result to fetch on its own after a failed batch


def _check_num_workers(num_workers: Any) -> None:
    if num_workers is None:
        return
    if isinstance(num_workers, bool) or not isinstance(num_workers, int):
        raise TypeError(f"num_workers must be a positive int or None, not {num_workers!r}")
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` matched case-insensitively against ``choices``, or ValueError listing them."""
    for choice in choices:
        if isinstance(value, str) and value.lower() == choice.lower():
            return choice
    raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(choices)}")


def pickle_call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> bytes:
    """Pickle a call once for all ranks; TypeError naming the part that fails."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    try:
        return ray.cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    except Exception as error:
        parts = [("fn", fn)] + [(f"args[{i}]", a) for i, a in enumerate(args)]
        parts += [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
        for name, part in parts:
            try:
                ray.cloudpickle.dumps(part)
            except Exception as part_error:
                raise TypeError(f"cannot pickle {name} ({part!r}) to send it to the workers: {part_error}") from error
        raise TypeError(f"cannot pickle the call to send it to the workers: {error}") from error


def ensure_ray(address: Optional[str] = None) -> None:
    """Connect to ``address`` (or RAY_ADDRESS) unless Ray is already up; else
    ``ray.init()``, which joins a cluster started with ``ray start`` on this
    machine or starts a local one."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        ray.init()


class WorkerFuture:
    """The pending result of ``WorkerGroup.submit``: one value per rank."""

    def __init__(self, group: "WorkerGroup", refs: List[ray.ObjectRef]):
        self._group = group
        self._refs = refs
        self._result: Optional[List[Any]] = None

    def done(self) -> bool:
        if self._result is not None:
            return True
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)

    def result(self, timeout: Optional[float] = None) -> List[Any]:
        """Values ordered by rank. Raises WorkerGroupError or WorkerGroupTimeout
        (tearing the group down) if a rank fails or the time runs out."""
        if self._result is None:
            self._result = self._group._collect(self._refs, timeout)
        return self._result

    def cancel(self) -> bool:
        """Stop the call by tearing the group down (a rank cannot leave a
        collective alone). Returns False if it had already finished."""
        if self.done():
            return False
        self._group.shutdown(graceful=False)
        return True


class WorkerGroup:
    """A pool of Ray actors, one per rank, kept alive across calls.

    Use as a context manager; ``run`` and ``submit`` execute a function on
    every rank with torch.distributed already initialised. See ``raydist.run``
    for the options.
    """

    def __init__(
        self,
        num_workers: Optional[int] = None,
        *,
        accelerator: str = "auto",
        resources_per_worker: Optional[Mapping[str, float]] = None,
        backend: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        placement_strategy: str = "PACK",
        startup_timeout: float = 300.0,
        address: Optional[str] = None,
        init_process_group: bool = True,
        object_store_threshold: Optional[int] = DEFAULT_THRESHOLD_BYTES,
        restart_count: int = 0,
        max_restarts: int = 0,
    ):
        _check_num_workers(num_workers)
        self._accelerator = _check_choice("accelerator", accelerator, ACCELERATORS)
        self._strategy = _check_choice("placement_strategy", placement_strategy, PLACEMENT_STRATEGIES)
        if resources_per_worker is not None and any(
            not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 for v in resources_per_worker.values()
        ):
            raise ValueError(f"resources_per_worker values must be non-negative numbers: {resources_per_worker!r}")
        self._horovod = backend == "horovod"
        if self._horovod:
            import_horovod()  # fail before any actor starts when it is missing
        self._backend = None if self._horovod else backend
        self._env = {str(k): str(v) for k, v in (env or {}).items()}
        self._init_process_group = init_process_group
        self._object_store_threshold = object_store_threshold
        self._restart_count = restart_count
        self._max_restarts = max_restarts
        self._actors: List[Any] = []
        self._workers: List[WorkerInfo] = []
        self._contexts: List[Optional[DistInfo]] = []
        self._pg: Optional[PlacementGroup] = None
        self._rendezvous: Any = None
        self._closed = False
        ensure_ray(address)
        try:
            self._start(num_workers, resources_per_worker, startup_timeout)
        except BaseException:
            self.shutdown(graceful=False)
            raise

    # -- start-up -----------------------------------------------------------

    def _start(self, num_workers: Optional[int], resources_per_worker: Optional[Mapping[str, float]], startup_timeout: float) -> None:
        nodes = alive_nodes()
        resource = resolve_accelerator(self._accelerator, nodes)
        bundle = worker_bundle(resource, resources_per_worker)
        if num_workers is None:
            num_workers = default_num_workers(resource, bundle.get("CPU", 1.0), nodes)
        self._pg = reserve(bundle, num_workers, self._strategy, startup_timeout)
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        self._actors = [
            _RemoteWorker.options(
                num_cpus=bundle.get("CPU", 0),
                num_gpus=bundle.get("GPU", 0),
                resources=custom,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=i),
            ).remote(resource)
            for i in range(num_workers)
        ]
        # Round trip 1: where did each worker land?
        placements: List[Placement] = self._gather(
            [actor.describe.remote(i) for i, actor in enumerate(self._actors)], startup_timeout, "started"
        )
        self._workers = assign_ranks(placements, ray.get_runtime_context().get_node_id())
        self._actors = [self._actors[w.actor_index] for w in self._workers]  # now indexed by rank
        # Round trip 2: environment + initialization, concurrently on all ranks.
        master = self._workers[0]
        master_port = placements[master.actor_index].free_port
        run_id = uuid.uuid4().hex
        extra_env: List[Dict[str, str]] = [{} for _ in self._workers]
        if self._horovod:
            from raydist.pool.horovod import HorovodRendezvous

            self._rendezvous = HorovodRendezvous(self._workers)
            extra_env = self._rendezvous.worker_envs()
        device = DEVICE_OF_RESOURCE.get(resource or "", "cpu")
        init_kwargs = (
            {"device": device, "backend": self._backend, "horovod": self._horovod}
            if self._init_process_group or self._horovod
            else None
        )
        setups = []
        for worker, actor, extra in zip(self._workers, self._actors, extra_env):
            env = torchrun_env(
                rank=worker.rank,
                local_rank=worker.local_rank,
                world_size=len(self._workers),
                local_world_size=worker.local_world_size,
                node_rank=worker.node_rank,
                num_nodes=worker.num_nodes,
                master_addr=master.node_ip,
                master_port=master_port,
                run_id=run_id,
                restart_count=self._restart_count,
                max_restarts=self._max_restarts,
                omp_num_threads=max(1, int(bundle.get("CPU", 1))),
                base_env={**os.environ, **self._env},
            )
            if resource is not None:
                env[VISIBLE_DEVICES_VAR[resource]] = ",".join(worker.visible_device_ids)
            env.update(extra)
            env.update(self._env)
            setups.append(actor.setup.remote(worker, env, init_kwargs, self._object_store_threshold))
        self._contexts = self._gather(setups, startup_timeout, "initialised")

    def _gather(self, refs: List[ray.ObjectRef], timeout: Optional[float], stage: str) -> List[Any]:
        """Wait for a start-up step on every worker, with progress if it is slow."""
        with tqdm(total=len(refs), desc=f"raydist: workers {stage}", unit="worker", delay=5.0) as bar:
            return self._collect(refs, timeout, progress=bar)

    # -- calls --------------------------------------------------------------

    @property
    def workers(self) -> List[WorkerInfo]:
        """Each rank's placement: rank, local rank, node rank, node id/IP, pid, device ids."""
        return list(self._workers)

    @property
    def contexts(self) -> List[Optional[DistInfo]]:
        """Each rank's initialization record (None where the process group was left to the code)."""
        return list(self._contexts)

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    def submit(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None) -> WorkerFuture:
        """Start ``fn(*args, **kwargs)`` on every rank; returns at once."""
        if self._closed:
            raise RuntimeError("this WorkerGroup has been shut down")
        call: Any = pickle_call(fn, args, kwargs or {})
        if len(call) > INLINE_CALL_BYTES:
            call = ray.put(call)  # big arguments: stored once, read by every rank
        return WorkerFuture(self, [actor.execute.remote(call) for actor in self._actors])

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank; the return values ordered by rank."""
        return self.submit(fn, args, kwargs).result(timeout)

    def _failure(self, rank: int, died: str, crashed: bool, outcome: Optional[Outcome] = None) -> WorkerFailure:
        worker = self._workers[rank] if rank < len(self._workers) else None
        return WorkerFailure(
            rank=rank,
            node_id=worker.node_id if worker else "?",
            node_ip=worker.node_ip if worker else "?",
            pid=worker.pid if worker else -1,
            timestamp=outcome.timestamp if outcome and outcome.timestamp else time.time(),
            traceback=outcome.traceback if outcome else (None if crashed else died),
            exit_code=outcome.exit_code if outcome else None,
            died=died if crashed else None,
            exception_type=outcome.exception_type if outcome else None,
        )

    def _collect(self, refs: List[ray.ObjectRef], timeout: Optional[float], progress: Optional[tqdm] = None) -> List[Any]:
        """Wait for every rank (``refs`` is indexed by rank); on the first
        failure, gather what else failed within a short grace period, tear
        the group down, and raise."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pending: Dict[ray.ObjectRef, int] = {ref: rank for rank, ref in enumerate(refs)}
        results: List[Any] = [None] * len(refs)
        failures: List[WorkerFailure] = []

        def take(ready: List[ray.ObjectRef]) -> None:
            try:
                values: List[Any] = ray.get(ready)  # one call for the common case
            except Exception:
                values = [_FETCH_ONE] * len(ready)  # some failed: fetch one by one
            for ref, value in zip(ready, values):
                rank = pending.pop(ref)
                try:
                    value = ray.get(ref) if value is _FETCH_ONE else value
                except RayActorError as error:
                    failures.append(self._failure(rank, _death_text(error), crashed=True))
                    continue
                except Exception as error:  # noqa: BLE001 - a start-up step raised
                    failures.append(self._failure(rank, str(error), crashed=False))
                    continue
                if isinstance(value, Outcome):
                    if not value.ok:
                        failures.append(self._failure(rank, "", crashed=False, outcome=value))
                        continue
                    value = value.value
                results[rank] = value
            if progress is not None:
                progress.update(len(ready))

        try:
            # Fast path: a short call is usually back on every rank within
            # FAST_PATH_S (ray.wait returns as soon as all are ready); only
            # then fall back to one-at-a-time waiting that spots failures early.
            first_wait = FAST_PATH_S if timeout is None else min(timeout, FAST_PATH_S)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=first_wait)
            if len(ready) == len(refs):
                take(ready)
            while pending and not failures:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
                if not ready:
                    break  # timed out
                # Take everything already finished in one go (cheap for warm calls).
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
                take(ready)
            if failures and pending:
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=FAILURE_GRACE_S)
                take(ready)
        except BaseException:  # KeyboardInterrupt included: leave nothing running
            self.shutdown(graceful=False)
            raise
        if failures:
            self.shutdown(graceful=False)
            raise WorkerGroupError(failures)
        if pending:
            self.shutdown(graceful=False)
            raise WorkerGroupTimeout(timeout or 0.0, sorted(pending.values()))
        return results

    # -- teardown -----------------------------------------------------------

    def shutdown(self, graceful: bool = True) -> None:
        """Leave the process group (if ``graceful``), kill the actors, free the placement group.

        Returns when the actors are dead. Safe to call more than once.
        """
        if self._closed:
            return
        self._closed = True
        actors, self._actors = self._actors, []
        if graceful and actors:
            try:
                ray.get([actor.teardown.remote() for actor in actors], timeout=TEARDOWN_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the actors are killed below regardless
                pass
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None
        if actors:
            # A call on a killed actor fails once Ray knows it is dead.
            ray.wait([actor.ping.remote() for actor in actors], num_returns=len(actors), timeout=TEARDOWN_TIMEOUT_S)
        if self._rendezvous is not None:
            self._rendezvous.stop()
            self._rendezvous = None

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown(graceful=exc_info[0] is None)

    def __del__(self) -> None:  # pragma: no cover - best effort when the user forgets
        if not getattr(self, "_closed", True) and ray.is_initialized():
            try:
                self.shutdown(graceful=False)
            except Exception:
                pass


def _death_text(error: RayActorError) -> str:
    text = str(error)
    for line in text.splitlines():
        line = line.strip()
        if "exit" in line.lower() or "signal" in line.lower() or "killed" in line.lower():
            return line
    return text.strip().splitlines()[0] if text.strip() else "the worker process died"
