"""Every private Ray API raydist relies on, in one place.

Each function says which public API is missing. When a private API is gone
or fails (a newer Ray), the fallback logs a warning once instead of quietly
changing behaviour.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import psutil
import ray

logger = logging.getLogger("raydist")
_warned: set = set()

# Ray's log monitor takes a line starting with this token as the actor's
# display name and prefixes the actor's later output with it ("(rank=3 pid=...)").
# No public API names an actor's log prefix after creation.
ACTOR_NAME_TOKEN = ":actor_name:"
HANDOVER_POLL_S = 0.005  # wait_actor_handed_over's look at the GCS actor table


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning("raydist: %s", message)


def cluster_has_autoscaler() -> bool:
    """True when an autoscaler may add nodes, so an unmet request may still be met.

    No public API says whether a cluster can grow. Every head runs a monitor;
    without a cluster config it uses Ray's read-only provider, whose node
    types are just ``node_<node id>``; autoscaler v2 sets a flag in the GCS.
    If this cannot be read, assume an autoscaler (wait, with progress, rather
    than refuse a request that might be met) and say so.
    """
    try:
        from ray._private import ray_constants
        from ray.autoscaler._private.util import format_readonly_node_type
        from ray.experimental.internal_kv import internal_kv_get_gcs_client

        gcs = internal_kv_get_gcs_client()
        v2 = gcs.internal_kv_get(
            ray._raylet.GCS_AUTOSCALER_V2_ENABLED_KEY.encode(),  # type: ignore[attr-defined]
            namespace=ray._raylet.GCS_AUTOSCALER_STATE_NAMESPACE.encode(),  # type: ignore[attr-defined]
        )
        if v2 == b"1":
            return True
        status = gcs.internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS.encode(), namespace=None)
        report = (json.loads(status).get("autoscaler_report") or {}) if status else {}
        types = (report.get("node_type_mapping") or {}).items()
        return any(node_type != format_readonly_node_type(node) for node, node_type in types)
    except Exception as error:  # noqa: BLE001 - a private API of another Ray version
        warn_once(
            "autoscaler",
            f"cannot tell whether this cluster autoscales ({type(error).__name__}: {error}); "
            "requests that do not fit now will be waited for up to startup_timeout",
        )
        return True


def wrap_worker_output_printer(wrap: Callable[[Callable[[Dict[str, Any]], None]], Callable[[Dict[str, Any]], None]]) -> bool:
    """Replace the driver's printer of worker output with ``wrap(printer)``.

    No public API lets a driver see worker lines as they are forwarded (only
    ``log_to_driver`` on/off). False, with a warning, where this Ray has no
    printer to wrap.
    """
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

        with dispatcher._lock:
            for index, (name, handler) in enumerate(dispatcher.handlers):
                if name == "ray_print_logs":
                    dispatcher.handlers[index] = (name, wrap(handler))
                    return True
    except Exception as error:  # noqa: BLE001 - a private API of another Ray version
        warn_once(
            "printer", f"cannot follow worker output ({type(error).__name__}: {error}); the last lines of a run may print after it ends"
        )
        return False
    warn_once(
        "printer",
        "no worker-output printer to follow (ray.init(log_to_driver=False), or Ray Client); "
        "worker lines are not followed: no per-rank log files, and the last lines of a call may print after it returns",
    )
    return False


def drop_pickled_reference(ref: ray.ObjectRef) -> None:
    """Drop the extra local reference that pickling ``ref`` out of band added.

    Ray pins an object whose reference was serialised out of band and offers
    no public call to unpin it; without this the object would stay in the
    store until the worker exits.
    """
    try:
        ray._private.worker.global_worker.core_worker.remove_object_ref_reference(ref)  # type: ignore[attr-defined]
    except Exception as error:  # noqa: BLE001 - a private API of another Ray version
        warn_once("unpin", f"cannot release large objects early ({type(error).__name__}: {error}); they are freed when the worker exits")


def probe_gcs(address: str) -> None:
    """Ask the GCS at ``address`` for one value; raise what Ray raises.

    ``ray.init`` against a token-protected cluster without a token prints
    ``InvalidAuthToken`` once a second for 20 s before failing, and against a
    port that is no Ray it retries for minutes; a bare GCS client fails at
    once with ``ray.exceptions.AuthenticationError`` (or after ~40 s with
    ``RpcError``). The GCS client is not public API.
    """
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    GcsClient(address=address).internal_kv_get(b"raydist-probe", namespace=None, timeout=5)


def draining_nodes() -> Dict[str, float]:
    """Nodes Ray is draining (``ray drain-node``, spot preemption), with each
    deadline in seconds since the epoch (``math.inf``: none).

    Ray has no public API for drain state (Ray Train v2 reads it the same
    way). An empty answer, with a warning, where this Ray cannot say.
    """
    try:
        drains = ray._private.state.state.get_draining_nodes()
    except Exception as error:  # noqa: BLE001 - a private API of another Ray version
        warn_once("drains", f"cannot read node drains ({type(error).__name__}: {error}); preemption is not watched")
        return {}
    return {node_id: (deadline_ms / 1000.0 if deadline_ms else math.inf) for node_id, deadline_ms in drains.items()}


def job_is_alive(job_id: str) -> bool:
    """Whether the job (hex id) still has its driver: Ray marks it dead when the
    driver process goes, however it went.

    No public API reads a job's state without the dashboard (``ray.util.state``
    needs it); the GCS job table says. True, with a warning, where it cannot
    be read or does not list the job: never end what may still be in use.
    """
    try:
        jobs = ray._private.state.jobs()
    except Exception as error:  # noqa: BLE001 - a private API of another Ray version
        warn_once("jobs", f"cannot read Ray's job table ({type(error).__name__}: {error}); a killed driver's state is kept")
        return True
    return not any(job["JobID"] == job_id and job["IsDead"] for job in jobs)


def wait_actor_handed_over(actor: Any, timeout: float) -> None:
    """Return once the GCS has taken ``actor``'s creation (its state past
    ``DEPENDENCIES_UNREADY``), or after ``timeout`` seconds.

    Until then the creating process owns the creation, even of a detached
    actor: if it dies first (a rank's ``os._exit`` right after it created
    the run's state keeper), the GCS cancels the actor, and every later
    caller finds it dead under its name. Ray has no public wait for it; the
    GCS actor table says (a few milliseconds). Where it cannot be read, no
    wait: the actor is then as safe as Ray made it.
    """
    actor_id = actor._actor_id.hex()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            row = ray._private.state.actors(actor_id=actor_id)
            if row and row.get("State") != "DEPENDENCIES_UNREADY":
                return
            time.sleep(HANDOVER_POLL_S)  # a GCS read per poll, no event to wait on
    except Exception as error:  # noqa: BLE001 - a private API of another Ray version
        warn_once("actor-table", f"cannot read Ray's actor table ({type(error).__name__}: {error})")


def available_resources_per_node() -> Dict[str, Dict[str, float]]:
    """What is free on each alive node now (Ray's DeveloperAPI; no public
    per-node view). Falls back, with a warning, to each node's total."""
    try:
        return {k: dict(v) for k, v in ray._private.state.available_resources_per_node().items()}
    except Exception as error:  # noqa: BLE001 - a private API of another Ray version
        warn_once("available", f"cannot read free resources per node ({type(error).__name__}: {error}); using totals")
        return {n["NodeID"]: dict(n["Resources"]) for n in ray.nodes() if n["Alive"]}


def recorded_cluster() -> Tuple[Optional[str], str]:
    """The address the last ``ray start`` on this machine recorded, which
    ``ray.init()`` without an address joins, and the file it is in (None
    where there is no record). ``ray stop`` removes the record; a head that
    was killed or crashed leaves it behind."""
    try:
        from ray._common.utils import get_ray_address_file

        path = get_ray_address_file(None)
        return ray._private.utils.read_ray_address(None) or None, path
    except Exception:  # noqa: BLE001 - a private API of another Ray version: ray.init() decides alone
        return None, ""


def start_private_ray(**options: Any) -> None:
    """``ray.init(**options)``, starting a lighter head if this starts a
    private Ray for raydist's runs: only the GCS, the raylet, its runtime-env
    agent and the log monitor (the ranks' output). Left out: the autoscaler
    monitor (a local Ray has nothing to scale), the dashboard's API server
    (job submission, the state API) and the dashboard agent, which would run
    as in a minimal ``pip install ray`` (no metrics or HTTP server) and is
    replaced by ``agent_stub.py``, which writes the port files the raylet
    waits for without importing Ray (~1 CPU-second). Ray's own wait for the
    new node to register polls about once a second; this polls every 20 ms.
    A run uses none of what is left out; on 2 cores it cost ~3 s of a
    ``raydist run`` from nothing, starting and stopping. No public option
    does any of this: ``ray.init`` does not pass ``RayParams.no_monitor``
    on, and ``include_dashboard=False`` still starts the API server and the
    full agent. Joining a running cluster is unaffected.
    """
    try:
        patches = _lighter_head()
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    except (ImportError, AttributeError) as error:
        warn_once("head", f"cannot trim the private Ray's start ({type(error).__name__}: {error}); it starts ~3 s slower")
        ray.init(**options)
        return
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    try:
        ray.init(**options)
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def room_for_data(cpus: int) -> Dict[str, Any]:
    """``ray.init`` options for a private Ray with ``cpus`` logical CPUs
    beyond the machine's, labelled as such (``DATA_CPUS_LABEL``): Ray Data's
    tasks need a CPU beside the workers', and a group sized to the machine
    (``-n`` = its cores, or the default) would otherwise hold them all and
    leave a split that never yields a batch. A default-sized group leaves
    them out. How many CPUs the machine has is Ray's own count (private:
    ``ray.init`` counts them the same way, cgroup limits included)."""
    from raydist.pool.rules.sizing import DATA_CPUS_LABEL

    try:
        from ray._private.utils import get_num_cpus

        machine = int(get_num_cpus())
    except Exception:  # noqa: BLE001 - a private API of another Ray version
        machine = os.cpu_count() or 1
    return {"num_cpus": machine + cpus, "labels": {DATA_CPUS_LABEL: str(cpus)}}


AGENT_STUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent_stub.py")
NODE_POLL_S = 0.02
NODE_WAIT_S = 30.0  # Ray's own limit for a new raylet to register


def _lighter_head() -> List[Tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for each of Ray's functions a lighter
    private head replaces while ``ray.init`` runs."""
    from ray._private import ray_constants, services
    from ray._private import utils as ray_utils
    from ray._private.node import Node

    python_command = services._build_python_executable_command_memory_profileable
    get_node = services.get_node

    def agent_command(component: str, session_dir: str, unbuffered: bool = True) -> List[str]:
        command = python_command(component, session_dir, unbuffered)
        # Ray's agent.py and its arguments follow: the stub reads what it needs of them.
        return [*command, AGENT_STUB] if component == ray_constants.PROCESS_TYPE_DASHBOARD_AGENT else command

    def registered_node(gcs_address: str, node_id: str) -> Any:
        _wait_until_registered(gcs_address, node_id)
        return get_node(gcs_address, node_id)

    return [
        (Node, "start_monitor", lambda self: None),
        (Node, "start_api_server", lambda self, **kwargs: None),
        # Decides the agent's --minimal flag by importing the dashboard's web stack (~0.4 s) in the driver.
        (ray_utils, "get_dashboard_dependency_error", lambda: ImportError("a private Ray for raydist runs no dashboard")),
        (services, "_build_python_executable_command_memory_profileable", agent_command),
        (services, "get_node", registered_node),
    ]


def _wait_until_registered(gcs_address: str, node_id: str) -> None:
    """Until the GCS lists ``node_id`` (or ``NODE_WAIT_S`` passed, or the
    table cannot be read): then Ray's own lookup answers, or fails, at once."""
    from ray._private import services, state

    table = state.GlobalState()
    try:
        table._initialize_global_state(services._get_gcs_client_options(gcs_address))
        deadline = time.monotonic() + NODE_WAIT_S
        while time.monotonic() < deadline and not any(row.get("NodeID") == node_id for row in table.node_table()):
            time.sleep(NODE_POLL_S)  # polling the GCS while the raylet starts, with a deadline
    except Exception:  # noqa: BLE001 - a private API of another Ray version: Ray's own wait decides
        pass
    finally:
        table.disconnect()


def own_children() -> Set[int]:
    """The pids of this process's children now."""
    return {child.pid for child in psutil.Process().children()}


def stop_half_started_ray(before: Set[int]) -> None:
    """Stop a private Ray whose start was interrupted: ``ray.shutdown`` knows
    none of it when ``ray.init`` did not return, and the raylet's agents
    (DashboardAgent, RuntimeEnvAgent) outlive a killed raylet. Kills the
    children started since ``before`` was taken and all their descendants.
    No public API stops a half-started node."""
    try:
        ray.shutdown()
    except Exception:  # noqa: BLE001 - what it could not stop is killed below
        pass
    tree: List[psutil.Process] = []
    for child in psutil.Process().children():
        if child.pid in before:
            continue
        try:
            tree += [child, *child.children(recursive=True)]
        except psutil.Error:
            tree.append(child)
    for process in tree:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(tree, timeout=5)


def shutdown_ray(exiting: bool = False) -> None:
    """``ray.shutdown()``, about a second sooner for a Ray this process started
    (``exiting``: as Ray's own exit-time shutdown, which first gives the last
    worker log lines 0.5 s to print; its flag is private).

    ``ray.shutdown()`` stops the GCS before it asks the autoscaler monitor to
    stop, and the monitor spends its whole grace period (~1 s) trying to
    report to the GCS that is gone. No public API stops a private Ray's
    monitor; killing it first is safe because all of that Ray stops now.
    A driver attached to a cluster starts no monitor, and nothing is killed.
    """
    try:
        node = ray._private.worker._global_node
        if node is not None and node.is_head():
            node.kill_monitor(check_alive=False)
    except Exception as error:  # noqa: BLE001 - a private API of another Ray version
        warn_once("monitor", f"cannot stop Ray's monitor early ({type(error).__name__}: {error}); shutdown takes ~1 s longer")
    if exiting:
        ray.shutdown(_exiting_interpreter=True)
    else:
        ray.shutdown()


class _TokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Token authentication is enabled for this Ray cluster")


def quiet_token_notice() -> None:
    """Drop Ray's "Token authentication is enabled" notice, logged on every
    private start: it says nothing about the user's run (the warning that
    authentication is *disabled* stays). No public setting silences one
    message; the logger's name is Ray's module path."""
    target = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _TokenNotice) for f in target.filters):
        target.addFilter(_TokenNotice())


def drop_raylet_messages(drop: Callable[[List[str]], bool]) -> None:
    """Keep Ray's "(raylet) ..." messages whose lines ``drop`` accepts off
    the driver's console (the last ``drop`` given decides).

    Ray prints the raylet's error messages (a worker's death, at length)
    through ``ray._private.worker.print_to_stdstream``, not through the
    printer of worker output; no public API filters them.
    """
    try:
        from ray._private import worker as ray_worker

        printer = ray_worker.print_to_stdstream
        original = getattr(printer, "__raydist_original__", printer)

        def print_to_stdstream(data: Dict[str, Any], ignore_prefix: bool) -> None:
            if data.get("pid") == "raylet" and drop(list(data.get("lines") or [])):
                return
            original(data, ignore_prefix)

        print_to_stdstream.__raydist_original__ = original  # type: ignore[attr-defined]
        ray_worker.print_to_stdstream = print_to_stdstream
    except Exception as error:  # noqa: BLE001 - a private API of another Ray version
        warn_once("raylet", f"cannot filter Ray's worker-death messages ({type(error).__name__}: {error}); they are printed")
