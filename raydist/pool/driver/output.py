"""Worker output on the driver: each rank's forwarded lines go to its log
files and the console (see ``raydist.pool.rules.logs``), and a call returns
only once the lines its ranks printed during it have arrived (the worker's
side, the marker lines, is ``raydist.pool.worker.markers``)."""

from __future__ import annotations

import logging
import sys
import threading
import uuid
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from raydist.config import RunConfig
from raydist.pool.cluster.seam import Cluster, Printer
from raydist.pool.driver.log_files import RankLog
from raydist.pool.records import WorkerInfo
from raydist.pool.rules.logs import RankRoute, console_prefix, raylet_death_report_of, split_forwarded, wants_files
from raydist.pool.worker.markers import MARKER_VAR, Printed

logger = logging.getLogger("raydist")

# How long a call waits for its output to arrive; the log monitor polls every 0.1 s.
DRAIN_TIMEOUT_S = 5.0

Key = Tuple[Optional[str], str]  # (node IP, pid) as Ray's log monitor names a worker (the pid as text)


class OutputRouter:
    """Ray's printer of worker lines, wrapped once per Ray session: lines of
    attached raydist ranks go to their files and the console; everything
    else goes to Ray's own printer unchanged."""

    _instance: Optional["OutputRouter"] = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self.token = f"raydist-output-end-{uuid.uuid4().hex}"
        self._changed = threading.Condition()
        self._ranks: Dict[Key, RankLog] = {}
        self._marks: Dict[Tuple[Key, bool], int] = {}  # the last call marked, per stream
        self._print: Optional[Printer] = None
        self._pids: Set[str] = set()  # every rank's pid this router followed (Ray's reports of their deaths are dropped)
        self._route_failed = False  # said once

    @classmethod
    def install(cls, cluster: Cluster) -> Optional["OutputRouter"]:
        """The router, wrapped around the cluster's printer of worker output;
        None where it forwards none here (Ray: ``log_to_driver=False``, Ray Client)."""
        with cls._instance_lock:
            router = cls._instance or cls()
            if not cluster.forward_output(router._wrap, router._drops):
                return None
            cls._instance = router
            return router

    def _drops(self, lines: List[str]) -> bool:
        """Ray's report of a followed rank's death: raydist's error names the rank and how it died."""
        with self._changed:
            pids = set(self._pids)
        return raylet_death_report_of(lines, pids)

    def _wrap(self, printer: Printer) -> Printer:
        if printer == self._handle:
            return printer  # already wrapped in this session
        self._print = printer
        return self._handle

    def attach(self, workers: Sequence[WorkerInfo], logs: Sequence[RankLog]) -> List[Key]:
        keys: List[Key] = [(worker.node_ip, str(worker.pid)) for worker in workers]
        with self._changed:
            self._ranks.update(zip(keys, logs))
            self._pids.update(pid for _, pid in keys)
        return keys

    def detach(self, keys: Iterable[Key]) -> None:
        with self._changed:
            for key in keys:
                self._ranks.pop(key, None)
                for is_err in (False, True):
                    self._marks.pop((key, is_err), None)

    def wait(self, expected: Sequence[Tuple[Key, bool, int]], timeout: float = DRAIN_TIMEOUT_S) -> bool:
        """Until every ``(key, is_err, call)`` marker has arrived, or ``timeout``."""
        if not expected:
            return True
        awaited = Awaited(expected)
        with self._changed:
            return self._changed.wait_for(lambda: awaited.arrived(self._marks), timeout)

    def _handle(self, data: Dict[str, Any]) -> None:
        try:
            routed = self._route(data)
        except Exception as error:  # noqa: BLE001 - Ray's log thread must live on
            if not self._route_failed:
                self._route_failed = True
                logger.warning("raydist: cannot route worker output (%s: %s); Ray prints it", type(error).__name__, error)
            routed = False
        if not routed and self._print is not None:
            # A rank detached before its last marker came through: drop the marker, keep the text.
            lines = [line.partition(self.token)[0] if self.token in line else line for line in data.get("lines") or []]
            lines = [line for line, raw in zip(lines, data.get("lines") or []) if line or self.token not in raw]
            if lines:
                self._print(dict(data, lines=lines))

    def _route(self, data: Dict[str, Any]) -> bool:
        """Send an attached rank's lines where its route says; False for other lines."""
        key = (data.get("ip"), str(data.get("pid")))
        with self._changed:
            log = self._ranks.get(key)
        if log is None:
            return False
        is_err = bool(data.get("is_err"))
        lines, marked, tqdm = split_forwarded(data.get("lines") or [], self.token)
        if tqdm and self._print is not None:
            self._print(dict(data, lines=tqdm))
        log.write(lines, is_err)
        route = log.route.stream(is_err)
        if route.console and lines:
            ip = None if data.get("ip") == data.get("localhost") else data.get("ip")
            _to_console(lines, log.route, data.get("pid"), ip, sys.stderr if is_err else sys.stdout)
        if marked is not None:
            with self._changed:
                self._marks[(key, is_err)] = max(marked, self._marks.get((key, is_err), -1))
                self._changed.notify_all()
        return True


class Awaited:
    """The markers a call waits for, looked at from the first that has not
    arrived yet (a stream's mark only grows): each marker is checked about
    once, so a call of N ranks costs N checks in all, not N at every arrival."""

    def __init__(self, expected: Sequence[Tuple[Key, bool, int]]):
        self._expected = list(expected)
        self._next = 0  # every marker before this one has arrived

    def arrived(self, marks: Mapping[Tuple[Key, bool], int]) -> bool:
        while self._next < len(self._expected):
            key, is_err, call = self._expected[self._next]
            if marks.get((key, is_err), -1) < call:
                return False
            self._next += 1
        return True


def _to_console(lines: Sequence[str], route: RankRoute, pid: Any, ip: Optional[str], stream: Any) -> None:
    try:
        colour = bool(stream.isatty())
    except Exception:  # noqa: BLE001 - a replaced stream without isatty
        colour = False
    prefix = console_prefix(route, pid, ip, colour)
    stream.write("".join(f"{prefix}{line}\n" for line in lines))
    stream.flush()


class GroupOutput:
    """One worker group's share of the router: its ranks' log files, the
    environment that turns markers on, and the wait after each call."""

    def __init__(self, workers: Sequence[WorkerInfo], routes: Sequence[RankRoute], router: Optional[OutputRouter]):
        self._router = router
        self._logs = [RankLog(route) for route in routes]
        self._keys = router.attach(workers, self._logs) if router is not None else []
        self._lock = threading.Lock()
        self.closed = False  # after close(), a call's values are returned without waiting for its lines

    def worker_env(self) -> Dict[str, str]:
        # Empty without a router: a group started inside a worker must not
        # inherit its outer group's token and mark lines nobody reads.
        return {MARKER_VAR: self._router.token if self._router is not None else ""}

    def settle(self, call: int, results: Sequence[Any], failed_ranks: Sequence[int] = ()) -> List[Any]:
        """The values without their ``Printed`` wrapping, once the output of
        call ``call`` has arrived: the streams each rank marked, and both
        streams of each rank in ``failed_ranks`` (ranks that raised or exited;
        a dead one marks nothing)."""
        values = [value.value if isinstance(value, Printed) else value for value in results]
        if self._router is not None and not self.closed:  # (closed: the group was shut down after the call finished)
            self._wait_for(call, results, failed_ranks)
        return values

    def _wait_for(self, call: int, results: Sequence[Any], failed_ranks: Sequence[int]) -> None:
        assert self._router is not None
        expected: List[Tuple[Key, bool, int]] = [
            (self._keys[rank], bool(is_err), value.call)
            for rank, value in enumerate(results)
            if isinstance(value, Printed)
            for is_err, marked in enumerate(value.streams)
            if marked
        ]
        expected += [(self._keys[rank], is_err, call) for rank in failed_ranks for is_err in (False, True)]
        if not self._router.wait(expected):
            logger.warning("raydist: some output of call %d had not arrived after %.0f s; it may print later", call, DRAIN_TIMEOUT_S)

    def close(self, call: Optional[int] = None, results: Sequence[Any] = (), failed_ranks: Sequence[int] = ()) -> None:
        """Wait for call ``call``'s lines (if given, as ``settle``), then stop
        routing and close the files; once, whoever calls first."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        try:
            if call is not None and self._router is not None:
                self._wait_for(call, results, failed_ranks)
        finally:
            if self._router is not None:
                self._router.detach(self._keys)
            for log in self._logs:
                log.close()


def router_for(config: RunConfig, cluster: Cluster) -> Optional[OutputRouter]:
    """The driver's output router; a clear error where the run's options need one and Ray forwards no output."""
    router = OutputRouter.install(cluster)
    if router is None and (wants_files(config) or config.local_ranks_filter is not None):
        raise ValueError(
            "log_dir, redirects, tee and local_ranks_filter need Ray to forward worker output "
            "to this driver (ray.init(log_to_driver=True); not Ray Client)"
        )
    return router
