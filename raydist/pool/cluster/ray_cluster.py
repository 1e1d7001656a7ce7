"""``RayCluster``: the cluster seam (``raydist.pool.cluster.seam``) over Ray.

Workers are ``RayWorker`` actors in the bundles of one placement group per
group; node agents are ``NodeAgent`` actors pinned to their node; a call is
an actor task, read with ``ray.wait``/``ray.get``, and Ray's errors are
turned into the seam's (``WorkerDied``, ``CallFailed``) here, so that nothing
above the seam knows Ray's exception classes.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import ray
import ray.cloudpickle
from ray.exceptions import GetTimeoutError, RayActorError, RaySystemError
from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from raydist.errors import WorkerGroupClosed
from raydist.pool import ray_private
from raydist.pool.cluster import placement
from raydist.pool.cluster.connect import connect, connected_session
from raydist.pool.cluster.loop_thread import LoopThread, PollTimer
from raydist.pool.cluster.seam import CallFailed, Pending, Printer, Worker, WorkerDied
from raydist.pool.records import ClusterNode
from raydist.pool.rules.sizing import Request
from raydist.pool.worker.actor import RayWorker
from raydist.pool.worker.evidence import NodeAgent
from raydist.pool.worker.metrics import FIGURES_HERE

SESSION_CHECK_S = 1.0  # how often a user's wait on the run looks whether Ray is still there

_RemoteWorker = ray.remote(RayWorker)
_RemoteAgent = ray.remote(num_cpus=0, max_restarts=0)(NodeAgent)


class RayCluster:
    """The Ray this process is connected to (``raydist.pool.cluster.connect``)."""

    def connect(self, address: Optional[str], startup_timeout: float) -> None:
        connect(address, startup_timeout=startup_timeout)

    def session(self) -> Optional[str]:
        return connected_session()

    def driver_node(self) -> Optional[str]:
        try:
            if ray.util.client.ray.is_connected():
                return None  # through Ray Client: this process's files are on another machine
        except Exception:  # noqa: BLE001 - no Ray Client support in this Ray: a plain driver
            pass
        return ray.get_runtime_context().get_node_id()

    def driver_ip(self) -> str:
        return str(ray.util.get_node_ip_address())

    def alive_nodes(self) -> List[ClusterNode]:
        return placement.alive_nodes()

    def draining_nodes(self) -> Dict[str, float]:
        return ray_private.draining_nodes()

    def free_resources(self) -> Dict[str, Dict[str, float]]:
        return ray_private.available_resources_per_node()

    def forward_output(self, wrap: Callable[[Printer], Printer], drop: Callable[[List[str]], bool]) -> bool:
        if not ray_private.wrap_worker_output_printer(wrap):
            return False
        ray_private.drop_raylet_messages(drop)
        return True

    # -- the clock ------------------------------------------------------------

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def record(self, figure: str, value: float, tags: Mapping[str, str]) -> None:
        FIGURES_HERE.record(figure, value, tags)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def after(self, delay: float, fn: Callable[[], None], name: str) -> "PollTimer":
        def run() -> None:
            # After ray.shutdown() a Ray call from any thread ends the whole process
            # (Ray's own exit): a poll due after the user shut Ray down does nothing.
            if ray.is_initialized():
                fn()

        timer = PollTimer(delay, run)
        timer.name, timer.daemon = name, True  # a poll never keeps the driver's process alive
        timer.start()
        return timer

    def run_loop(self, turn: Callable[[], Optional[float]], name: str) -> LoopThread:
        return LoopThread(turn, name)

    def park(self, done: threading.Event, timeout: Optional[float], on_interrupt: Callable[[], None] = lambda: None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:  # in slices: a ray.shutdown() meanwhile ends the wait
                left = None if deadline is None else deadline - time.monotonic()
                if done.wait(SESSION_CHECK_S if left is None else max(0.0, min(left, SESSION_CHECK_S))):
                    return True
                if not ray.is_initialized() or sys.is_finalizing() or (left is not None and left <= SESSION_CHECK_S):
                    return done.is_set()  # (at interpreter exit the loop's thread no longer runs)
        except KeyboardInterrupt:  # Ctrl-C interrupts the wait on the main thread
            on_interrupt()
            raise

    def when_ended(self, pending: Sequence[Pending], notify: Callable[[], None]) -> None:
        for ref in pending:
            ref.future().add_done_callback(lambda _: notify())

    # -- placement ------------------------------------------------------------

    def reserve(self, request: Request, timeout: float, stopping: Callable[[], bool] = lambda: False) -> Tuple[PlacementGroup, int]:
        return placement.reserve(request, timeout, stopping)

    def bundle_nodes(self, reservation: Optional[PlacementGroup]) -> Dict[int, str]:
        if reservation is None:
            return {}
        placed = placement_group_table(reservation).get("bundles_to_node_id", {}) or {}
        return {int(bundle): node for bundle, node in placed.items()}

    def free(self, reservation: PlacementGroup) -> None:
        remove_placement_group(reservation)

    def wait_released(self, held: Mapping[str, Mapping[str, float]]) -> None:
        placement.wait_until_released(held)

    def room_for(self, request: Request, taken: Sequence[str] = ()) -> int:
        return placement.room_for(request, taken)

    # -- workers --------------------------------------------------------------

    def start_worker(
        self,
        reservation: Optional[PlacementGroup],
        slot: int,
        bundle: Mapping[str, float],
        accelerator_resource: Optional[str],
        per_bundle: int = 1,
    ) -> Worker:
        # Ray takes its own resources as actor options; a bundle takes them all as amounts.
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
        memory = {"memory": bundle["memory"]} if bundle.get("memory") else {}
        strategy = PlacementGroupSchedulingStrategy(reservation, placement_group_bundle_index=slot // per_bundle)  # type: ignore[arg-type]
        return _RemoteWorker.options(
            num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0), resources=custom, **memory, scheduling_strategy=strategy
        ).remote(accelerator_resource)

    def start_agent(self, node_id: str) -> Worker:
        return _RemoteAgent.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()

    def find(self, name: str, namespace: str) -> Optional[Worker]:
        try:
            return ray.get_actor(name, namespace=namespace)
        except ValueError:
            return None

    def call(self, worker: Worker, method: str, *args: Any) -> Pending:
        return getattr(worker, method).remote(*args)

    def pickle(self, value: Any) -> bytes:
        return bytes(ray.cloudpickle.dumps(value))  # an ObjectRef in it stays usable (out-of-band)

    def share(self, data: bytes) -> Any:
        return ray.put(data)

    def wait(self, pending: Sequence[Pending], num_returns: int, timeout: Optional[float]) -> Tuple[List[Pending], List[Pending]]:
        if not pending:
            return [], []
        self._check_connected()
        return ray.wait(list(pending), num_returns=num_returns, timeout=timeout)

    def get(self, pending: Sequence[Pending], timeout: Optional[float] = None) -> List[Any]:
        self._check_connected()
        try:
            return list(ray.get(list(pending), timeout=timeout))
        except GetTimeoutError as error:
            raise TimeoutError(str(error)) from error
        except RayActorError as error:
            raise WorkerDied(str(error)) from error
        except RaySystemError as error:  # the value came back and cannot be unpickled here
            raise CallFailed(str(error), getattr(error, "cause", None) or error, unreadable=True) from error
        except Exception as error:
            raise CallFailed(str(error), getattr(error, "cause", None) or error) from error

    def kill(self, worker: Worker) -> None:
        if ray.is_initialized():  # after ray.shutdown() a Ray call would start a new local Ray
            ray.kill(worker, no_restart=True)

    @staticmethod
    def _check_connected() -> None:
        # Ray calls after ray.shutdown() (from another thread) would start a new local Ray.
        if not ray.is_initialized():
            raise WorkerGroupClosed("Ray was shut down while raydist waited for its workers")
