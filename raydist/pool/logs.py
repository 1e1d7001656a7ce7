"""Per-rank log files and what reaches the console, the way torchrun does it.

torchrun (``DefaultLogsSpecs``) lays a run out as
``<log_dir>/<run_id>_<random>/attempt_<k>/<rank>/{stdout,stderr}.log``: one
directory per run, a fresh one per attempt (restart), one per rank. ``-r``
sends a stream to its file instead of the console, ``-t`` to both, and
``--local-ranks-filter`` keeps the other local ranks off the console (their
files are still written). Stream codes: 0 none, 1 stdout, 2 stderr, 3 both.

raydist writes the files on the driver's machine from the lines Ray forwards
there, so on a multi-node cluster every rank's files are in one place. A
rank's directory is named by its global rank, unique across nodes (on one
node it equals the local rank, as under torchrun); the stream codes and the
filter are keyed by local rank, as torchrun's are.

Ray-free: the routing rules are pure functions; ``RunLogs`` and ``RankLog``
only make directories and write files.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass
from string import Template
from typing import IO, List, Optional, Sequence

from raydist.config import STD_ERR, STD_NONE, STD_OUT, RunConfig, StdSpec
from raydist.pool.layout import WorkerInfo

PREFIX_TEMPLATE_VAR = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
ROLE_NAME = "default"  # torchrun's role name, and the ROLE_NAME raydist's workers get
_CYAN, _RESET = "\x1b[36m", "\x1b[0m"  # Ray's colour for a worker's line prefix


@dataclass(frozen=True)
class StreamRoute:
    """Where one stream of one rank goes."""

    file: Optional[str]  # the log file; None: no file
    console: bool


@dataclass(frozen=True)
class RankRoute:
    """Where one rank's stdout and stderr go, and the prefix of its console lines."""

    rank: int
    local_rank: int
    stdout: StreamRoute
    stderr: StreamRoute
    prefix: Optional[str]  # the prefix template's expansion; None: raydist's "(rank=N pid=P) "

    def stream(self, is_err: bool) -> StreamRoute:
        return self.stderr if is_err else self.stdout


def stream_code(spec: StdSpec, local_rank: int) -> int:
    """One local rank's code from torchrun's value or per-rank mapping (torch's ``to_map``)."""
    return spec if isinstance(spec, int) else spec.get(local_rank, STD_NONE)


def wants_files(config: RunConfig) -> bool:
    """torchrun makes the run directory whenever it has a log dir; without
    one, raydist makes a temporary one only when a stream goes to files."""
    return config.log_dir is not None or config.redirects != STD_NONE or config.tee != STD_NONE


def line_prefix(template: Optional[str], rank: int, local_rank: int) -> Optional[str]:
    """``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` expanded as torchrun expands it."""
    if template is None:
        return None
    return Template(template).safe_substitute(role_name=ROLE_NAME, rank=rank, local_rank=local_rank)


def rank_route(config: RunConfig, rank: int, local_rank: int, rank_dir: Optional[str], template: Optional[str]) -> RankRoute:
    """torchrun's rules for one rank: a tee'd stream is redirected too; the
    filter hides a rank's console output, never its files."""
    teed = stream_code(config.tee, local_rank)
    redirected = stream_code(config.redirects, local_rank) | teed
    shown = config.local_ranks_filter is None or local_rank in config.local_ranks_filter

    def route(bit: int, name: str) -> StreamRoute:
        return StreamRoute(
            file=os.path.join(rank_dir, name) if rank_dir is not None and redirected & bit else None,
            console=shown and (not redirected & bit or bool(teed & bit)),
        )

    return RankRoute(rank, local_rank, route(STD_OUT, "stdout.log"), route(STD_ERR, "stderr.log"), line_prefix(template, rank, local_rank))


def console_prefix(route: RankRoute, pid: int, ip: Optional[str], colour: bool) -> str:
    """What goes before a console line: the template's expansion (as torchrun
    writes it, nothing added), else ``(rank=N pid=P[, ip=X]) `` as Ray would
    name the actor, coloured only for a terminal."""
    if route.prefix is not None:
        return route.prefix
    where = f"(rank={route.rank} pid={pid}{f', ip={ip}' if ip else ''})"
    return f"{_CYAN}{where}{_RESET} " if colour else f"{where} "


class RunLogs:
    """One run's log directory, shared by its attempts (restarts)."""

    def __init__(self, config: RunConfig, run_id: Optional[str] = None):
        self.config = config
        self.run_id = run_id or uuid.uuid4().hex  # also each rank's TORCHELASTIC_RUN_ID
        self.template = os.environ.get(PREFIX_TEMPLATE_VAR)
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
            routes.append(rank_route(self.config, worker.rank, worker.local_rank, rank_dir, self.template))
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
