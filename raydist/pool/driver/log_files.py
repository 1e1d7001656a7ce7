"""One run's per-rank log files on the driver: the run directory shared by
its attempts (laid out as torchrun lays it out, see
``raydist.pool.rules.logs``) and each rank's open files."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import uuid
from typing import IO, List, Optional, Sequence

from raydist.config import RunConfig
from raydist.pool.records import WorkerInfo
from raydist.pool.rules.logs import RankRoute, prefix_template, rank_route, wants_files


class RunLogs:
    """One run's log directory, shared by its attempts (restarts)."""

    def __init__(self, config: RunConfig, run_id: Optional[str] = None):
        self.config = config
        self.run_id = run_id or uuid.uuid4().hex  # also each rank's TORCHELASTIC_RUN_ID
        self.template = prefix_template(config, os.environ)
        self.run_dir: Optional[str] = None  # made by the first attempt that needs it

    def attempt(self, restart_count: int, workers: Sequence[WorkerInfo]) -> List[RankRoute]:
        """Each rank's route for attempt ``restart_count``; makes its
        directories (emptied first, as torchrun does) when files are wanted."""
        attempt_dir = self._attempt_dir(restart_count) if wants_files(self.config) else None
        routes = []
        for worker in workers:
            rank_dir = None if attempt_dir is None else os.path.join(attempt_dir, str(worker.rank))
            if rank_dir is not None:
                os.makedirs(rank_dir)
            routes.append(rank_route(self.config, worker.rank, worker.local_rank, rank_dir, self.template, worker.hostname))
        return routes

    def _attempt_dir(self, restart_count: int) -> str:
        if self.run_dir is None:
            base = self.config.log_dir
            if base is None:
                base = tempfile.mkdtemp(prefix="raydist_")
                print(f"raydist: per-rank logs go to {base} (no log_dir given)", file=sys.stderr, flush=True)
            os.makedirs(base, exist_ok=True)
            self.run_dir = tempfile.mkdtemp(prefix=f"{self.run_id}_", dir=base)
        path = os.path.join(self.run_dir, f"attempt_{restart_count}")
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path


class RankLog:
    """One rank's open log files. Lines arrive on Ray's log thread while the
    group may close the files from another."""

    def __init__(self, route: RankRoute):
        self.route = route
        self._lock = threading.Lock()
        # Opened now, as torchrun's redirected process opens them: an empty stream leaves an empty file.
        self._files: List[Optional[IO[str]]] = [
            None if stream.file is None else open(stream.file, "w", encoding="utf-8", errors="replace")
            for stream in (route.stdout, route.stderr)
        ]

    def write(self, lines: Sequence[str], is_err: bool) -> None:
        with self._lock:
            file = self._files[int(is_err)]
            if file is not None and lines:
                file.write("".join(line + "\n" for line in lines))
                file.flush()  # readable while the run goes on, as torchrun's are

    def close(self) -> None:
        with self._lock:
            files, self._files = self._files, [None, None]
        for file in files:
            if file is not None:
                file.close()
