"""Per-rank log routes, the way torchrun does it.

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
Pure: ``raydist.pool.driver.log_files`` makes the directories and writes the files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from string import Template
from typing import List, Mapping, Optional, Sequence, Set, Tuple

from raydist.config import STD_ERR, STD_NONE, STD_OUT, RunConfig, StdSpec

PREFIX_TEMPLATE_VAR = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"

ROLE_NAME = "default"  # torchrun's default role name (RunConfig.role)
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
    directory: Optional[str] = None  # the rank's attempt directory, where its files (and error.json) go

    def stream(self, is_err: bool) -> StreamRoute:
        return self.stderr if is_err else self.stdout


def stream_code(spec: StdSpec, local_rank: int) -> int:
    """One local rank's code from torchrun's value or per-rank mapping (torch's ``to_map``)."""
    return spec if isinstance(spec, int) else spec.get(local_rank, STD_NONE)


def wants_files(config: RunConfig) -> bool:
    """torchrun makes the run directory whenever it has a log dir; without
    one, raydist makes a temporary one only when a stream goes to files."""
    return config.log_dir is not None or config.redirects != STD_NONE or config.tee != STD_NONE


def line_prefix(template: Optional[str], rank: int, local_rank: int, role: str = ROLE_NAME, hostname: str = "") -> Optional[str]:
    """torchrun's log line prefix template expanded as torchrun expands it
    (``${hostname}``: the short host name of the rank's node, torch >= 2.14)."""
    if template is None:
        return None
    return Template(template).safe_substitute(role_name=role, rank=rank, local_rank=local_rank, hostname=hostname)


def prefix_template(config: RunConfig, environ: Mapping[str, str]) -> Optional[str]:
    """The template of the console lines' prefix: ``--log-line-prefix-template``,
    else ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` (torchrun's order); None: raydist's own prefix."""
    if config.log_line_prefix_template is not None:
        return config.log_line_prefix_template
    return environ.get(PREFIX_TEMPLATE_VAR)


def rank_route(
    config: RunConfig, rank: int, local_rank: int, rank_dir: Optional[str], template: Optional[str], hostname: str = ""
) -> RankRoute:
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

    return RankRoute(
        rank,
        local_rank,
        route(STD_OUT, "stdout.log"),
        route(STD_ERR, "stderr.log"),
        line_prefix(template, rank, local_rank, config.role, hostname),
        rank_dir,
    )


def console_prefix(route: RankRoute, pid: int, ip: Optional[str], colour: bool) -> str:
    """What goes before a console line: the template's expansion (as torchrun
    writes it, nothing added), else ``(rank=N pid=P[, ip=X]) `` as Ray would
    name the actor, coloured only for a terminal."""
    if route.prefix is not None:
        return route.prefix
    where = f"(rank={route.rank} pid={pid}{f', ip={ip}' if ip else ''})"
    return f"{_CYAN}{where}{_RESET} " if colour else f"{where} "


# Ray's line for its experimental distributed tqdm: left to Ray's printer.
_RAY_TQDM_MAGIC = "__ray_tqdm_magic_token__"


def split_forwarded(lines: Sequence[str], token: str) -> Tuple[List[str], Optional[int], List[str]]:
    """Lines Ray forwarded from one stream of a worker, split into the
    output lines, the last call number marked (``<token> <n>``, see
    ``raydist.pool.worker.markers``) and Ray's own tqdm lines."""
    kept: List[str] = []
    tqdm: List[str] = []
    marked: Optional[int] = None
    for line in lines:
        if token in line:
            before, _, after = line.partition(token)
            if before:  # the code's last line had no newline
                kept.append(before)
            try:
                marked = int(after.split()[0])
            except (IndexError, ValueError):
                pass  # mangled in transit: the wait times out instead
        elif _RAY_TQDM_MAGIC in line:
            tqdm.append(line)
        else:
            kept.append(line)
    return kept, marked, tqdm


_RAYLET_DEATH = re.compile(r"A worker died or was killed while executing .*?Worker PID: (\d+)")


def raylet_death_report_of(lines: Sequence[str], pids: "Set[str]") -> bool:
    """True for Ray's "(raylet) A worker died or was killed ..." paragraph
    about one of ``pids``: raydist's error already says what happened to that rank."""
    for line in lines:
        match = _RAYLET_DEATH.search(line)
        if match and match.group(1) in pids:
            return True
    return False
