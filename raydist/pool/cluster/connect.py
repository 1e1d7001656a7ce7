"""One way to reach Ray, for the Python API and the CLI alike.

``ray.init(address=...)`` retries a closed port for many minutes, hangs on a
port that accepts and never answers, and against a token-protected cluster
prints ``InvalidAuthToken`` once a second for 20 s. ``connect`` checks the
address first (a TCP probe, then one GCS request) so each of these fails in
seconds with a ConnectionError that names the address and what to do.
"""

from __future__ import annotations

import atexit
import functools
import os
import socket
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

import ray

from raydist.pool import ray_private, signals

DEFAULT_GCS_PORT = 6379
DEFAULT_CLIENT_PORT = 10001
# A closed port refuses at once; this bounds an address that drops packets.
TCP_PROBE_TIMEOUT_S = 4.0
# Ray's own GCS client gives up on a silent port after ~40 s.
GCS_ANSWER_TIMEOUT_S = 45.0
# A private Ray started for a run: only what a run needs (no dashboard).
PRIVATE_RAY_OPTIONS: Dict[str, Any] = {"include_dashboard": False}
# Logical CPUs a private Ray has beyond the machine's, for Ray Data's tasks (ray_private.room_for_data).
DATA_CPUS = 1

TOKEN_HINT = (
    "set RAY_AUTH_MODE=token here and make the cluster's token readable on this machine: "
    "~/.ray/auth_token, a file named by RAY_AUTH_TOKEN_PATH, or the RAY_AUTH_TOKEN variable "
    "(`ray get-auth-token` on the head node prints it)"
)


def resolve_address(address: Optional[str], standalone: bool = False) -> Tuple[Optional[str], str]:
    """The address to use and where it came from (for messages)."""
    if standalone:
        return "local", "--standalone"
    if address:
        return address, "address"
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    return None, "default"


def host_and_port(address: str) -> Tuple[str, int]:
    """Host and port of a Ray address (``HOST[:PORT]``, ``[IPv6]:PORT``, ``ray://HOST:PORT``)."""
    rest, port = address, DEFAULT_GCS_PORT
    if rest.startswith("ray://"):
        rest, port = rest[len("ray://") :], DEFAULT_CLIENT_PORT
    rest = rest.split("/", 1)[0]
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        return host, int(tail[1:]) if tail.startswith(":") and tail[1:].isdigit() else port
    host, sep, port_text = rest.rpartition(":")
    if not sep:
        return rest, port
    if not port_text.isdigit():
        raise ValueError(f"invalid Ray address {address!r}: port {port_text!r} is not a number")
    return host, int(port_text)


def _check_reachable(address: str, source: str) -> None:
    host, port = host_and_port(address)
    try:
        socket.create_connection((host, port), timeout=TCP_PROBE_TIMEOUT_S).close()
    except OSError as error:
        raise ConnectionError(f"cannot reach the Ray cluster at {address} (from {source}): {error}") from None


def _check_answers(address: str, source: str, timeout: float) -> None:
    """One GCS request, bounded by ``timeout`` even if Ray's client hangs."""
    outcome: Dict[str, BaseException] = {}

    def probe() -> None:
        try:
            ray_private.probe_gcs(address)
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            outcome["error"] = error

    thread = threading.Thread(target=probe, name="raydist-gcs-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    where = f"the Ray cluster at {address} (from {source})"
    if thread.is_alive():
        raise ConnectionError(f"no Ray cluster answered at {address} (from {source}) within {timeout:g} s")
    error = outcome.get("error")
    if error is None:
        return
    if isinstance(error, ray.exceptions.AuthenticationError):
        mode = os.environ.get("RAY_AUTH_MODE", "unset")
        raise ConnectionError(
            f"{where} requires token authentication and rejected this driver (RAY_AUTH_MODE is {mode}): {TOKEN_HINT}"
        ) from None
    raise ConnectionError(f"no Ray cluster answered at {address} (from {source}): {error}") from None


def connect(address: Optional[str] = None, *, startup_timeout: float = 300.0, standalone: bool = False) -> bool:
    """Connect to Ray unless this process already is; True if this call connected.

    ``address`` (else RAY_ADDRESS) names a cluster; without one, ``ray.init()``
    joins a cluster started with ``ray start`` on this machine or starts a
    private local Ray (``standalone``: always a private one); a record of a
    ``ray start`` whose head no longer answers is passed over, with a
    warning. A cluster that cannot be reached, does not answer within
    ``startup_timeout`` or rejects this driver's token raises ConnectionError
    naming the address.
    """
    if ray.is_initialized():
        return False
    with _connect_lock:  # threads making their first run at once share one Ray
        if ray.is_initialized():
            return False
        return _connect(address, startup_timeout, standalone)


# Two threads that both saw no Ray would each start one; Ray then kills the process.
_connect_lock = threading.Lock()


def _connect(address: Optional[str], startup_timeout: float, standalone: bool) -> bool:
    ray_private.quiet_token_notice()
    address, source = resolve_address(address, standalone)
    if address is None:
        address = _unless_the_recorded_cluster_is_gone()
    if address in (None, "local"):
        _start_private_ray(address)
        return True
    if address != "auto":
        _check_reachable(address, source)
        if not address.startswith("ray://"):
            _check_answers(address, source, min(startup_timeout, GCS_ANSWER_TIMEOUT_S))
    try:
        with signals.deferred():  # a signal lands once the driver's core worker is whole (see deferred)
            ray.init(address=address)
    except ConnectionError:
        raise
    except KeyboardInterrupt:  # held through ray.init: disconnect the ordinary way, then go on stopping
        if ray.is_initialized():
            ray_private.shutdown_ray()
        raise
    except Exception as error:  # noqa: BLE001 - Ray raises several kinds; all mean the same here
        raise ConnectionError(f"cannot connect to the Ray cluster at {address} (from {source}): {error}") from None
    return True


def _unless_the_recorded_cluster_is_gone() -> Optional[str]:
    """``"local"`` where ``ray.init()`` would join the cluster the last ``ray
    start`` here recorded and nothing answers there (its head was killed):
    Ray would retry it for minutes. None lets ``ray.init()`` decide."""
    recorded, path = ray_private.recorded_cluster()
    if recorded is None:
        return None
    try:
        _check_reachable(recorded, path)
    except ConnectionError:
        print(
            f"raydist: the Ray cluster last started on this machine ({recorded}, recorded in {path}) does not answer: "
            "starting a private Ray instead (`ray stop` removes the record; pass an address to use a cluster)",
            file=sys.stderr,
            flush=True,
        )
        return "local"
    return None


def _start_private_ray(address: Optional[str]) -> None:
    """Start a private Ray from the main thread, or else from a thread that
    lives as long as this process.

    Ray starts its GCS and raylet with PR_SET_PDEATHSIG, which Linux fires
    when the *thread* that started them ends: a first run made from a worker
    thread would take Ray down with that thread, under the runs of every
    other thread (which then hang for 60 s and die).
    """
    start = functools.partial(_start_whole_or_not_at_all, address)
    if threading.current_thread() is threading.main_thread():
        start()
        return
    failed: List[BaseException] = []
    started = threading.Event()

    def parent() -> None:
        try:
            start()
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(error)
            return
        finally:
            started.set()
        threading.Event().wait()  # never set: this thread is Ray's parent until the process ends

    threading.Thread(target=parent, name="raydist-ray-parent", daemon=True).start()
    started.wait()
    if failed:
        raise failed[0]


def _start_whole_or_not_at_all(address: Optional[str]) -> None:
    """Start a private Ray; interrupted (a signal, KeyboardInterrupt), stop all of it first.

    Every signal with a Python handler (raydist's, Python's Ctrl-C, the
    program's own) is held until Ray is up (``signals.deferred``), then Ray
    is stopped the ordinary way; a start that failed on its own is killed
    whole (``ray.shutdown`` knows nothing of it)."""
    before = ray_private.own_children()
    try:
        with signals.deferred():
            ray_private.start_private_ray(address=address, **PRIVATE_RAY_OPTIONS, **ray_private.room_for_data(DATA_CPUS))
    except BaseException:
        if ray.is_initialized():  # up: the held signal came after the start
            ray_private.shutdown_ray()
        else:
            ray_private.stop_half_started_ray(before)
        raise


def _shutdown_at_exit() -> None:
    """Ray's own exit-time shutdown, done first and with signals held: a
    second Ctrl-C during Ray's (which sleeps 0.5 s for the last log lines)
    would leave the driver's core worker running into the C++ exit handler
    that crashes on it (see ``signals.deferred``). Registered after Ray's,
    so it runs before it; Ray's then finds nothing to do."""
    if ray.is_initialized():
        with signals.deferred(deliver=False):
            ray_private.shutdown_ray(exiting=True)


atexit.register(_shutdown_at_exit)


def connected_session() -> Optional[str]:
    """An id of the Ray this process is connected to (None when it is not).

    Actor handles are valid only in the session that made them; the GCS
    address and job id tell sessions apart.
    """
    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    return f"{context.gcs_address}/{context.get_job_id()}"
