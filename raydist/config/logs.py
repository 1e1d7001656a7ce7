"""The options that say where the ranks' output goes (torchrun's --log-dir,
-r, -t, --local-ranks-filter); each with its checks."""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from raydist.config.flags import flag
from raydist.config.option import Option
from raydist.config.values import check_int, check_path_text, optional, type_name

# torchrun's stream codes for -r/--redirects and -t/--tee: a bit per stream.
STD_NONE, STD_OUT, STD_ERR, STD_ALL = 0, 1, 2, 3
# One code for every local rank, or a code per local rank ({local_rank: code}).
StdSpec = Union[int, Dict[int, int]]
_STD_CODES = "0 none, 1 stdout, 2 stderr, 3 both"
_STD_ONE = re.compile(r"^[0-3]$")
_STD_PER_RANK = re.compile(r"^\d+:[0-3](,\d+:[0-3])*$")


def _std_code(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where} must be a stream code ({_STD_CODES}), not {type_name(value)} {value!r}")
    if not STD_NONE <= value <= STD_ALL:
        raise ValueError(f"{where} must be a stream code ({_STD_CODES}), got {value}")
    return value


def parse_std(name: str, value: Any) -> StdSpec:
    """torchrun's value for -r/--redirects and -t/--tee: one stream code for
    every local rank (``3``, ``"3"``) or codes per local rank
    (``{0: 1, 1: 2}``, ``"0:1,1:2"``; local ranks not named get 0)."""
    if isinstance(value, str):
        text = value.strip()
        if _STD_ONE.match(text):
            return int(text)
        if not _STD_PER_RANK.match(text):
            raise ValueError(f"{name} {value!r} is neither a stream code ({_STD_CODES}) nor LOCAL_RANK:CODE pairs such as '0:1,1:2'")
        pairs = [pair.split(":") for pair in text.split(",")]
        ranks = [int(rank) for rank, _ in pairs]
        twice = sorted({rank for rank in ranks if ranks.count(rank) > 1})
        if twice:  # a dict would keep the last one silently
            raise ValueError(f"{name} {value!r} gives local rank {twice[0]} more than once")
        value = {int(rank): int(code) for rank, code in pairs}
    if isinstance(value, Mapping):
        codes: Dict[int, int] = {}
        for rank, code in value.items():
            check_int(f"{name} key", rank, 0)
            codes[rank] = _std_code(f"{name}[{rank}]", code)
        return codes
    return _std_code(name, value)


def parse_local_ranks(name: str, value: Any) -> Optional[Tuple[int, ...]]:
    """torchrun's --local-ranks-filter: ``"0,1"``, an int or a collection of
    ints; sorted, each once. Empty means no filter, as under torchrun."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            items = [int(part) for part in value.split(",")] if value.strip() else []
        except ValueError:
            raise ValueError(f"{name} must be comma-separated local ranks such as '0,1', got {value!r}") from None
    elif isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, (list, tuple, set, frozenset, range)):
        items = list(value)
    else:
        raise TypeError(f"{name} must be local ranks such as '0,1' or {{0, 1}}, not {type_name(value)} {value!r}")
    for item in items:
        check_int(f"{name} entry", item, 0)
    twice = sorted({item for item in items if items.count(item) > 1})
    if twice:  # most likely a typo for another rank
        raise ValueError(f"{name} names local rank {twice[0]} more than once, in {value!r}")
    return tuple(sorted(set(items))) or None


def check_log_dir(name: str, value: Any) -> str:
    """A directory to create (or reuse) for per-rank logs; not an existing file."""
    path = check_path_text(name, value, "directory")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{name} {path!r} exists and is not a directory")
    return path


LOG_DIR = Option(
    None,
    check=optional(check_log_dir),
    doc="directory for per-rank log files, laid out as torchrun lays them out "
    "(``<log_dir>/<run_id>_<random>/attempt_<k>/<rank>/stdout.log``); written on the driver's "
    "machine. None: a temporary directory, made only when ``redirects`` or ``tee`` asks for files.",
    flag=flag(
        "--log-dir",
        "--log_dir",
        metavar="DIR",
        help="directory for per-rank log files, laid out as torchrun does: "
        "DIR/<run id>_<random>/attempt_<k>/<rank>/stdout.log and stderr.log, one attempt_<k> per "
        "restart. Written on this machine (the driver's), for every rank on every node",
    ),
)
REDIRECTS = Option(
    STD_NONE,
    check=parse_std,
    doc="torchrun's ``-r``: streams written to the log files instead of the console, one code for "
    'all local ranks (0 none, 1 stdout, 2 stderr, 3 both) or per local rank (``"0:1,1:2"``, '
    "``{0: 1, 1: 2}``).",
    flag=flag(
        "-r",
        "--redirects",
        metavar="CODES",
        help="send streams to the log files instead of the console: 0 none, 1 stdout, 2 stderr, "
        "3 both, for every local rank (-r 3) or per local rank (-r 0:1,1:2); without --log-dir "
        "the files go to a new temporary directory (default {default})",
    ),
)
TEE = Option(
    STD_NONE,
    check=parse_std,
    doc="torchrun's ``-t``: streams written to the log files and the console (same codes).",
    flag=flag(
        "-t",
        "--tee",
        metavar="CODES",
        help="send streams to the log files and the console (codes as for --redirects; default {default})",
    ),
)


def check_template(name: str, value: Any) -> str:
    """A text with ``${...}`` macros; any other ``$`` is kept as written (``string.Template.safe_substitute``)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a text such as '${{hostname}}:${{rank}}: ', not {type_name(value)} {value!r}")
    return value


LOG_LINE_PREFIX_TEMPLATE = Option(
    None,
    check=optional(check_template),
    doc="torchrun's ``--log-line-prefix-template`` (torch >= 2.14): the prefix of each rank's console lines, "
    "with ``${rank}``, ``${local_rank}``, ``${role_name}`` and ``${hostname}`` (the rank's node's short host "
    "name). None: ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` if set (the option wins over it, as in torchrun), "
    "else raydist's ``(rank=N pid=P)``.",
    flag=flag(
        "--log-line-prefix-template",
        "--log_line_prefix_template",
        metavar="TEMPLATE",
        help="the prefix of each rank's console lines, e.g. '${{hostname}}:${{rank}}: ', with ${{rank}}, "
        "${{local_rank}}, ${{role_name}} and ${{hostname}} (as torchrun's; it wins over "
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE). Default: '(rank=N pid=P)'",
    ),
)
LOCAL_RANKS_FILTER = Option(
    None,
    check=parse_local_ranks,
    doc="torchrun's ``--local-ranks-filter``: only these local ranks reach the console (files are not filtered); None: all.",
    flag=flag(
        "--local-ranks-filter",
        "--local_ranks_filter",
        metavar="RANKS",
        help="only these local ranks reach the console, e.g. 0 or 0,1 (their log files are written all the same)",
    ),
)


def check_timeline(name: str, value: Any) -> str:
    """A file to write in an existing directory; not a directory."""
    path = check_path_text(name, value, "file")
    if os.path.isdir(path):
        raise ValueError(f"{name} {path!r} is a directory; give a file path such as {os.path.join(path, 'timeline.json')!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{name} {path!r}: its directory {folder!r} does not exist")
    return path


TIMELINE = Option(
    None,
    check=optional(check_timeline),
    doc="write the run's timeline to this file as it goes: every attempt's placement, each rank's "
    "start, initialisation and calls, failures with their cause, restarts and spares, and the run's "
    "phases, as Chrome trace JSON (open it in ui.perfetto.dev or chrome://tracing). Written on the "
    "driver's machine; a driver killed mid-run leaves the events so far (drop the last comma, add ``]``).",
    flag=flag(
        "--timeline",
        metavar="FILE",
        help="write the run's timeline to FILE as it goes (Chrome trace JSON: open it in "
        "ui.perfetto.dev): placement, each rank's start, init and calls, failures, restarts, spares",
    ),
)
