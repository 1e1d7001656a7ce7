"""The Ray actor behind each rank: report placement, set up, run calls, tear down."""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

import ray
import ray.cloudpickle

from raydist.core import collectives
from raydist.core.initialize import DistInfo, init_distributed, shutdown
from raydist.pool.layout import Placement, WorkerInfo
from raydist.pool.object_store import RayObjectStoreTransport
from raydist.pool.ray_private import ACTOR_NAME_TOKEN


@dataclass(frozen=True)
class Outcome:
    """What one rank's call ended with (raising is reported, not propagated)."""

    value: Any = None
    traceback: Optional[str] = None
    exception_type: Optional[str] = None
    exception: Optional[bytes] = None  # the pickled exception, when it pickles
    exit_code: Optional[int] = None  # sys.exit(n) with n != 0
    timestamp: float = 0.0

    @property
    def ok(self) -> bool:
        return self.traceback is None and self.exit_code is None


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1


class RayWorker:
    """One rank. Created inside its placement-group bundle by WorkerGroup."""

    def __init__(self, accelerator_resource: Optional[str]):
        self._accelerator_resource = accelerator_resource
        self._worker: Optional[WorkerInfo] = None

    def __repr__(self) -> str:
        return f"rank={self._worker.rank}" if self._worker else "raydist worker"

    def describe(self, index: int) -> Placement:
        context = ray.get_runtime_context()
        ids = context.get_accelerator_ids().get(self._accelerator_resource, []) if self._accelerator_resource else []
        return Placement(
            index=index,
            node_id=context.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            pid=os.getpid(),
            accelerator_ids=tuple(str(i) for i in ids),
            free_port=find_free_port(),
        )

    def setup(
        self,
        worker: WorkerInfo,
        env: Mapping[str, str],
        init_kwargs: Optional[Dict[str, Any]],
        object_store_threshold: Optional[int],
    ) -> Optional[DistInfo]:
        """Set the launcher environment, then (unless ``init_kwargs`` is None) initialise."""
        self._worker = worker
        for stream in (sys.stdout, sys.stderr):
            print(f"{ACTOR_NAME_TOKEN}rank={worker.rank}", file=stream, flush=True)
        os.environ.update(env)
        if object_store_threshold is not None:
            collectives.set_large_object_transport(RayObjectStoreTransport(object_store_threshold))
        if init_kwargs is None:
            return None
        return init_distributed(**init_kwargs)

    def execute(self, call: bytes) -> Outcome:
        """Run ``fn(*args, **kwargs)`` pickled as one blob by the driver."""
        try:
            fn, args, kwargs = ray.cloudpickle.loads(call)
            return Outcome(value=fn(*args, **kwargs))
        except SystemExit as stop:
            code = _exit_code(stop.code)
            return Outcome(exit_code=code, timestamp=time.time()) if code else Outcome()
        except BaseException as error:  # noqa: B036 - report everything, the driver decides
            try:
                pickled: Optional[bytes] = ray.cloudpickle.dumps(error)
            except Exception:
                pickled = None
            return Outcome(
                traceback=traceback.format_exc(),
                exception_type=type(error).__name__,
                exception=pickled,
                timestamp=time.time(),
            )

    def ping(self) -> int:
        return os.getpid()

    def teardown(self) -> None:
        collectives.set_large_object_transport(None)
        shutdown()
