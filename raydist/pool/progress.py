"""Progress of a slow start-up phase: a tqdm bar on a terminal; elsewhere
(a log file, CI) one plain line when the phase turns out slow, since a
bar's carriage-return redraws only garble a file."""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

# A phase shows progress only once it has taken this long.
PROGRESS_DELAY_S = 5.0


class PlainProgress:
    """tqdm's interface as the start-up uses it, writing one line per phase."""

    def __init__(self, total: int, desc: str, delay: float = PROGRESS_DELAY_S):
        self.total, self.n, self.desc = total, 0, desc
        self._shown_after = time.monotonic() + delay
        self._said = False
        self._postfix = ""

    def update(self, count: int = 1) -> None:
        self.n += count
        self._maybe_say()

    def set_postfix_str(self, text: str) -> None:
        self._postfix = text
        self._maybe_say()

    def _maybe_say(self) -> None:
        if self._said or time.monotonic() < self._shown_after or self.n >= self.total:
            return
        self._said = True
        detail = f" ({self._postfix})" if self._postfix else ""
        print(f"{self.desc}: {self.n} of {self.total} so far, still waiting{detail}", file=sys.stderr, flush=True)

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._said and exc_info[0] is None:
            print(f"{self.desc}: {self.n} of {self.total}", file=sys.stderr, flush=True)


def progress(total: int, desc: str, stream: Optional[Any] = None, unit: str = "worker") -> Any:
    """A progress bar for a phase of ``total`` units: tqdm on a terminal, else ``PlainProgress``."""
    stream = sys.stderr if stream is None else stream
    try:
        terminal = bool(stream.isatty())
    except Exception:  # noqa: BLE001 - a replaced stream without isatty
        terminal = False
    if not terminal:
        return PlainProgress(total, desc)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, delay=PROGRESS_DELAY_S, file=stream)
