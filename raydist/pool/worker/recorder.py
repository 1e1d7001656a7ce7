"""A worker's flight recorder, readable while the worker is stuck.

torch records every collective in its flight recorder (``TORCH_FR_BUFFER_SIZE``
entries, gloo included), with the op, the per-group sequence number, the
tensors and when the rank entered it. A rank stuck in a collective cannot
answer a Ray call, but gloo waits with the GIL released, so a small thread in
the worker can: it listens on a Unix socket on the worker's node (owner-only),
and the node's ``NodeAgent`` asks it for the last entries. Reading costs about
15 us per buffered entry, which is why raydist keeps the buffer short.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

from raydist.pool.records import CollectiveEntry

ASK_TIMEOUT_S = 3.0
LAST_ENTRIES = 64  # the most entries a reply carries

# torch's scalar type names as the recorder writes them -> torch.<dtype> names.
_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
}


def _entry(raw: Dict[str, Any]) -> CollectiveEntry:
    group = raw.get("process_group") or ("?", "")
    name = str(raw.get("profiling_name") or "?")
    return CollectiveEntry(
        group=str(group[0]),
        seq=int(raw.get("collective_seq_id") or 0),
        op=name.split(":", 1)[-1],  # "gloo:all_reduce" -> "all_reduce"
        shapes=tuple(tuple(int(d) for d in shape) for shape in raw.get("input_sizes") or ()),
        dtypes=tuple(_DTYPES.get(str(d), str(d).lower()) for d in raw.get("input_dtypes") or ()),
        created_ns=int(raw.get("time_created_ns") or 0),
        completed=bool(raw.get("retired")) or raw.get("state") == "completed",
    )


def recent_collectives(limit: int = LAST_ENTRIES) -> Optional[Tuple[CollectiveEntry, ...]]:
    """This process's last ``limit`` recorded collectives (oldest first); None
    when torch is not loaded or has no recorder. Never imports torch."""
    if "torch" not in sys.modules:
        return None
    try:
        from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]

        dump = pickle.loads(_dump_fr_trace(includeCollectives=True, includeStackTraces=False))
    except Exception:  # noqa: BLE001 - an older torch, or no recorder: nothing to report
        return None
    entries = [e for e in dump.get("entries", ()) if not e.get("is_p2p")]
    return tuple(_entry(raw) for raw in entries[-limit:])


def _answer(connection: socket.socket) -> None:
    with connection:
        connection.settimeout(ASK_TIMEOUT_S)
        request = connection.makefile("r").readline().strip()
        if request == "collectives":
            entries = recent_collectives()
            reply: Any = None if entries is None else [list(e.__dict__.values()) for e in entries]
        else:
            reply = {"error": f"unknown request {request!r}"}
        connection.sendall(json.dumps(reply).encode() + b"\n")


def serve_diagnostics(path: str) -> None:
    """Answer the node agent's requests on ``path`` from a daemon thread."""
    try:
        os.remove(path)  # left by an earlier process with this pid
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)  # owner-only: the recorder says what the job runs
    try:
        server.bind(path)
    finally:
        os.umask(old_mask)
    server.listen(8)

    def serve() -> None:
        while True:
            connection, _ = server.accept()
            try:
                _answer(connection)
            except Exception:  # noqa: BLE001 - one bad request must not stop the server
                pass

    threading.Thread(target=serve, name="raydist-diagnostics", daemon=True).start()


def ask_worker(path: str, request: str = "collectives", timeout: float = ASK_TIMEOUT_S) -> Optional[List[CollectiveEntry]]:
    """Ask a worker on this node for its recorded collectives; None if it does not answer."""
    if not path:
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(timeout)
            client.connect(path)
            client.sendall(request.encode() + b"\n")
            reply = json.loads(client.makefile("r").readline() or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(reply, list):
        return None
    return [
        CollectiveEntry(group, seq, op, tuple(tuple(s) for s in shapes), tuple(dtypes), created, done, failed)
        for group, seq, op, shapes, dtypes, created, done, failed in reply
    ]
