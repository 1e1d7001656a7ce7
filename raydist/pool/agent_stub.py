"""What the raylet of a private Ray started for raydist's runs runs in place
of Ray's dashboard agent (see ``ray_private.start_private_ray``).

There the agent would run as in a minimal ``pip install ray``: no gRPC or
HTTP server, nothing a run reads; what the raylet needs of it is the three
port files saying so ("-1": not in use), which it waits for before it
registers its node. Importing Ray and the dashboard's modules to write them
cost ~1 CPU-second, in the middle of the start. This writes them at once
and lives as long as the raylet (which ends when its agent ends), without
importing anything of Ray or raydist.

Run by the raylet as ``python -u agent_stub.py <Ray's agent.py> --node-id=...
--session-dir=... ...``; the arguments it does not need are ignored.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import Dict, List

PORT_FILES = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port")
PR_SET_PDEATHSIG = 1


def write_port_files(session_dir: str, node_id: str) -> None:
    for name in PORT_FILES:
        path = os.path.join(session_dir, f"{name}_{node_id}")
        partial = f"{path}.partial"
        with open(partial, "w") as f:
            f.write("-1")
        os.replace(partial, path)  # the raylet never reads half a file


def main(argv: List[str]) -> None:
    options: Dict[str, str] = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
    raylet = os.getppid()
    try:  # SIGTERM the moment the raylet goes
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    write_port_files(options["session-dir"], options["node-id"])
    while os.getppid() == raylet:  # where the death signal is not available
        time.sleep(1.0)


if __name__ == "__main__":
    main(sys.argv[1:])
