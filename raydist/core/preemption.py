"""Whether this rank's node is about to go away, and by when.

When Ray drains a rank's node (a spot preemption, ``ray drain-node``),
raydist's driver has a small task on that node write the deadline to the
file named by RAYDIST_PREEMPTION_FILE and then send the rank SIGTERM (or the
signal chosen with ``preemption_signal``), as a cloud does before it takes a
machine back. A SIGTERM handler, or a training loop that checks between
steps, reads the deadline here to save a checkpoint in time. Ray-free, like
the rest of the core.
"""

from __future__ import annotations

import math
import os
from typing import Optional

PREEMPTION_FILE_VAR = "RAYDIST_PREEMPTION_FILE"


def preemption_requested() -> Optional[float]:
    """The time (seconds since the epoch, as ``time.time()``) by which this
    rank's node will be gone, ``math.inf`` if its drain has no deadline, or
    None while no drain concerns this rank (and outside raydist)."""
    path = os.environ.get(PREEMPTION_FILE_VAR)
    if not path:
        return None
    try:
        with open(path) as note:
            text = note.read().strip()
    except OSError:
        return None
    try:
        return float(text) if text else math.inf
    except ValueError:
        return math.inf
