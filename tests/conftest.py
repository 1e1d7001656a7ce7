"""Shared fixtures and checks for both tiers (see tests/README.md).

- ``ray_local``: one local Ray with 4 CPUs, started once, shared by every
  test that asks for it.
- ``cluster``: a simulated multi-node cluster of the shape the test's
  ``@pytest.mark.nodes(head, *others)`` names; a warm one of the same shape
  is reused (starting one costs ~6 s; nodes a test removed are added again),
  and the live tier is ordered so that tests needing the same Ray run together.
- ``assert_nothing_left()``: the one leak check (actors, placement groups,
  worker processes, their files, the driver's listening ports).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parent.parent
# Workers must import the test modules that define the functions they run.
TEST_DIRS = [REPO / "tests", REPO / "tests" / "live", REPO / "tests" / "unit"]
# RAYDIST_TEST_INSTALLED (the version matrix, noxfile.py): raydist is the installed
# wheel, in this process and the workers; the checkout is never on their path.
INSTALLED = bool(os.environ.get("RAYDIST_TEST_INSTALLED"))
PATHS = [*map(str, TEST_DIRS), *([] if INSTALLED else [str(REPO)]), os.environ.get("PYTHONPATH")]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, PATHS))
sys.path[:0] = [str(REPO / "tests")]
if INSTALLED:
    import raydist as _raydist

    _here = Path(_raydist.__file__).resolve().parent
    assert _here != REPO / "raydist", f"RAYDIST_TEST_INSTALLED: raydist imported from the checkout ({_here})"

LOCAL_CPUS = 4
RAYDIST_ACTORS = (
    "RayWorker",
    "NodeAgent",
    "StateKeeper",
    "BlockHolder",
)  # StateKeeper: save_state's keeper and holders; BlockHolder: split_dataset(exactly_once=True)


def repeats(quick: int, soak: int, every_session: Optional[int] = None) -> "pytest.MarkDecorator":
    """A repetition count: ``quick`` in ``make test`` (0: the test runs only in
    ``make soak``), and under the ``soak`` marker ``soak``, the count the
    acceptance asked for, or, where given, ``every_session``: what ``make
    soak`` runs in CI after every session (the rare races add up over the
    sessions), the full count with ``RAYDIST_SOAK_FULL=1`` (``make soak-full``)."""
    counts = [pytest.param(quick, id=f"x{quick}")] if quick else []
    if every_session is not None and not os.environ.get("RAYDIST_SOAK_FULL"):
        soak = every_session
    return pytest.mark.parametrize("repeat", [*counts, pytest.param(soak, id=f"x{soak}", marks=pytest.mark.soak)])


# -- the one Ray this test process is attached to --------------------------

# kind: None, "local" or the repr of a cluster's node list (its shape).
_current: Dict[str, Any] = {"kind": None, "cluster": None, "nodes": None, "specs": {}}  # specs: worker node id -> its keywords


# raydist's driver threads that make Ray calls on their own (``Cluster.after``'s polls).
def _end_dropped_runs() -> None:
    """Before this process shuts its Ray down for the next test: a group a test
    dropped without ``shutdown()`` is shut down when collected (its end waits
    for its polls: a Ray call that meets the shutdown ends the whole process)."""
    import gc

    gc.collect()


def _shutdown_current() -> None:
    if "ray" not in sys.modules:  # the unit tier never imports it
        return
    import ray

    if ray.is_initialized():
        _end_dropped_runs()
        ray.shutdown()
    cluster = _current["cluster"]
    if cluster is not None:
        cluster.shutdown()
    _current.update(kind=None, cluster=None, nodes=None, specs={})


def use_local_ray() -> None:
    """Make this process's Ray the shared local one (4 CPUs), starting it if needed."""
    import ray

    if _current["kind"] != "local":
        _shutdown_current()
        # address="local": never attach to another Ray that happens to run on the machine.
        # Figures reach the metrics endpoint every 2 s (Ray: 10 s), so a test of them waits less.
        system = {"metrics_report_interval_ms": 2000}
        ray.init(address="local", num_cpus=LOCAL_CPUS, include_dashboard=True, log_to_driver=True, _system_config=system)
        _current["kind"] = "local"


@pytest.fixture
def ray_local() -> None:
    """A local Ray with 4 CPUs, started once and shared by every test that uses it."""
    use_local_ray()


def _still_has_shape(nodes: List[Dict[str, Any]]) -> bool:
    """The warm cluster still has as many live nodes and CPUs as it was started
    with (a test that removed a node and did not add it back leaves it smaller)."""
    import ray

    draining = _draining()
    alive = [node for node in ray.nodes() if node["Alive"] and node["NodeID"] not in draining]
    cpus = sum(node["Resources"].get("CPU", 0) for node in alive)
    return len(alive) == len(nodes) and cpus == sum(node.get("num_cpus", 0) for node in nodes)


def _restore_shape(cluster: Any) -> bool:
    """Bring a warm cluster back to its shape after a test lost or added
    worker nodes: a node added is removed, a node lost is added again with its
    keywords (seconds, where a new cluster costs ~6 s and a new ``ray.init``).
    False where the head is gone (the cluster must be started anew)."""
    import ray

    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]} - set(_draining())  # a drained node takes nothing new
    specs: Dict[str, Dict[str, Any]] = _current["specs"]
    if cluster.head_node is None or cluster.head_node.node_id not in alive:
        return False
    for node in list(cluster.worker_nodes):
        if node.node_id not in specs or node.node_id not in alive:
            cluster.remove_node(node, allow_graceful=False)
    for node_id, spec in list(specs.items()):
        if node_id not in alive:
            del specs[node_id]
            specs[cluster.add_node(**spec).node_id] = spec
    cluster.wait_for_nodes()
    return True


def _draining() -> Dict[str, float]:
    from raydist.pool.ray_private import draining_nodes

    return draining_nodes()


def drain_node(address: str, node_id: str, deadline_s: int) -> None:
    """What a spot preemption does to a node: ``ray drain-node`` with a deadline
    (the node stays up, taking nothing new; the warm cluster replaces it for the next test)."""
    command = [
        str(Path(sys.executable).parent / "ray"),
        "drain-node",
        "--address",
        address,
        "--node-id",
        node_id,
        "--reason",
        "DRAIN_NODE_REASON_PREEMPTION",
        "--reason-message",
        "spot reclaim",
        "--deadline-remaining-seconds",
        str(deadline_s),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=60)


def start_cluster(nodes: List[Dict[str, Any]]) -> Any:
    """A simulated multi-node cluster (several raylets on this machine); the
    first entry is the head node. A warm cluster of the same shape is reused;
    anything else this process was attached to is shut down first."""
    import ray
    from ray.cluster_utils import Cluster

    kind = repr(nodes)
    warm = _current["kind"] == kind and ray.is_initialized()
    if warm and (_still_has_shape(nodes) or (_restore_shape(_current["cluster"]) and _still_has_shape(nodes))):
        return _current["cluster"]
    _shutdown_current()
    cluster = Cluster(initialize_head=True, head_node_args=dict(nodes[0], include_dashboard=False))
    _current.update(cluster=cluster, specs={})  # a start that fails half-way is still shut down
    for node in nodes[1:]:
        _current["specs"][cluster.add_node(**node).node_id] = node
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    _current.update(kind=kind, nodes=nodes)
    return cluster


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Any:
    """The simulated cluster named by the test's (or its module's)
    ``@pytest.mark.nodes(head, *others)``: each argument a node's
    ``Cluster.add_node`` keywords. Returns the ``ray.cluster_utils.Cluster``."""
    marker = request.node.get_closest_marker("nodes")
    assert marker is not None and marker.args, "the cluster fixture needs @pytest.mark.nodes(head, *other_nodes)"
    return start_cluster(list(marker.args))


def _ray_need(item: pytest.Item) -> Tuple[int, str]:
    """(0, '') for no Ray of this process, (1, '') for the local Ray, (2, shape) for a cluster."""
    names = getattr(item, "fixturenames", ())
    marker = item.get_closest_marker("nodes")
    if marker is not None and "cluster" in names:
        return (2, repr(list(marker.args)))
    return (1, "") if "ray_local" in names else (0, "")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (``--dist loadgroup``)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: List[pytest.Item]) -> None:
    """Tests that need the same Ray run together: those that need none of this
    process's Rays first, then the local Ray's, then each cluster shape in
    turn. A test that needs no Ray stays with the first Ray its module needs,
    so the module's own fixtures are set up once. In several processes
    (pytest-xdist), see ``_share_out``."""
    needs = {item: _ray_need(item) for item in items}
    first_of_module: Dict[str, Tuple[int, str]] = {}
    for item, need in needs.items():
        if need[0]:
            module = item.nodeid.split("::")[0]
            first_of_module[module] = min(first_of_module.get(module, need), need)
    order = {item: needs[item] if needs[item][0] else first_of_module.get(item.nodeid.split("::")[0], (0, "")) for item in items}
    items.sort(key=order.__getitem__)  # stable: a module keeps its order within each group


# Each live test's seconds (setup, call and teardown) as last measured on a
# 2-core machine: `RAYDIST_TEST_COSTS=1 make test` (or `make soak`) updates the
# tests it ran. They set the order in which files are handed out to processes.
COSTS = REPO / "tests" / "live" / "costs.json"
UNKNOWN_COST_S = 5.0  # a test not yet measured: about one run of a few workers


class _ShareOut:
    """The order for several processes (``-n 2 --dist loadfile --no-loadscope-reorder``:
    each file whole in one process, handed out in this order as processes come
    free): the longest files first (by the selected tests' measured seconds), so
    that no long file is left for the end while the other process waits."""

    def __init__(self) -> None:
        self.costs: Dict[str, float] = json.loads(COSTS.read_text()) if COSTS.exists() else {}
        self.measured: Dict[str, float] = {}

    @pytest.hookimpl(trylast=True)  # after -m deselected: only the tests that run count
    def pytest_collection_modifyitems(self, items: List[pytest.Item]) -> None:
        if not os.environ.get("PYTEST_XDIST_WORKER"):
            return
        seconds: Dict[str, float] = {}
        for item in items:
            module = item.nodeid.split("::")[0]
            seconds[module] = seconds.get(module, 0.0) + self.costs.get(item.nodeid, _unknown_cost(item))
        items.sort(key=lambda item: -seconds[item.nodeid.split("::")[0]])  # stable: each file keeps its order

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.measured[report.nodeid] = self.measured.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        """With RAYDIST_TEST_COSTS set, in the process that ran or gathered every test: the costs updated."""
        if os.environ.get("RAYDIST_TEST_COSTS") and not os.environ.get("PYTEST_XDIST_WORKER") and self.measured:
            live = {nodeid: round(s, 1) for nodeid, s in self.measured.items() if nodeid.startswith("tests/live/")}
            COSTS.write_text(json.dumps(dict(sorted({**self.costs, **live}.items())), indent=0) + "\n")


def _unknown_cost(item: pytest.Item) -> float:
    """A guess for a test not yet measured: a run per repetition (``repeats``)."""
    callspec = getattr(item, "callspec", None)
    return UNKNOWN_COST_S * (callspec.params.get("repeat", 1) if callspec is not None else 1)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_ShareOut(), "raydist-share-out")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _shutdown_current()


_FAILED = pytest.StashKey[bool]()  # set on a test whose call failed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[_FAILED] = True
    return report


@pytest.fixture(autouse=True)
def _clear_after_a_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """A failed test may leave a run going in a thread of its own (a group
    holding the warm cluster's CPUs): end it, so that the next test finds
    the cluster free and the failure is reported once, not again by every
    test after it."""
    yield
    if request.node.stash.get(_FAILED, False) and "ray" in sys.modules:
        _end_what_a_test_left(timeout=60)


def _end_what_a_test_left(timeout: float) -> None:
    import psutil
    import ray
    from ray import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    if not ray.is_initialized():
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [
            t
            for t in threading.enumerate()
            if not t.daemon and t is not threading.main_thread() and not t.name.startswith("pytest_timeout")
        ]
        for pg_id in live_placement_groups():
            ray.util.remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))
        for actor in live_raydist_actors():
            if actor["Pid"]:
                with contextlib.suppress(psutil.Error):
                    psutil.Process(actor["Pid"]).kill()  # every simulated node is on this machine
            else:  # not started (pid 0 would signal this whole process group): Ray drops its creation
                ray._private.worker.global_worker.core_worker.kill_actor(ray.ActorID.from_hex(actor["ActorID"]), True)
        if not running and not _ray_leftovers():
            return
        time.sleep(0.5)  # the test's own thread sees its workers go and ends: poll, with a deadline


# -- what Ray and the machine hold -----------------------------------------


def ray_address() -> str:
    """This process's cluster, named explicitly: other Rays may run on the machine."""
    import ray

    return ray.get_runtime_context().gcs_address


def _raydist_actor_table() -> List[Dict[str, Any]]:
    """raydist's actors (workers and node agents), dead or alive, read from the
    GCS (works without a dashboard, so on simulated clusters too)."""
    import ray

    table = ray._private.state.actors()
    return [a for a in table.values() if a["ActorClassName"].split(".")[-1] in RAYDIST_ACTORS]


def live_raydist_actors() -> List[Dict[str, Any]]:
    """raydist's actors that are not dead (GCS rows: ActorClassName, Pid, State, ...)."""
    return [a for a in _raydist_actor_table() if a["State"] != "DEAD"]


def raydist_actors_ever_created() -> int:
    """How many of raydist's worker actors this Ray has seen, dead or alive."""
    return sum(1 for a in _raydist_actor_table() if a["ActorClassName"].endswith("RayWorker"))


def live_placement_groups() -> List[str]:
    import ray

    return [pg_id for pg_id, pg in ray.util.placement_group_table().items() if pg["state"] != "REMOVED"]


def raydist_files_of(pids: Iterable[int]) -> List[str]:
    """The files raydist made for one of ``pids`` that are still there: a
    worker's own files (``WorkerEvidence.own_files``: its exit note, stacks,
    diagnostics socket, ...) in the workers' scratch folder, and a driver's
    pdb relay entries. Only raydist's own folders and names count: another
    program's folder named like raydist's (a virtualenv, whose ``cp500.pyi``
    has a pid's number in it) is not raydist's leftover."""
    from raydist.pool.driver.debug_relay import REGISTERED, registry_dir
    from raydist.pool.records import WorkerEvidence
    from raydist.pool.worker.evidence import scratch_dir

    wanted = set(pids)
    found = [path for pid in sorted(wanted) for path in WorkerEvidence.for_process(pid, scratch_dir()).own_files if os.path.lexists(path)]
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(registry_dir())):
            entry = REGISTERED.match(name)
            if entry is not None and int(entry.group(1)) in wanted:
                found.append(os.path.join(registry_dir(), name))
    return found


def listening_ports() -> Set[int]:
    """TCP ports this (driver) process listens on."""
    import psutil

    return {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def _live_actor_processes(pids: Iterable[int]) -> List[str]:
    """Those of ``pids`` that still run as a Ray worker process (a pid the OS
    gave to another program since does not count)."""
    import psutil

    alive = []
    for pid in set(pids):
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE and process.name().startswith("ray::"):
                alive.append(f"pid {pid} ({process.name()})")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return alive


def _ray_leftovers() -> List[str]:
    found = [f"actor {a['ActorClassName']} pid {a['Pid']} {a['State']}" for a in live_raydist_actors()]
    return found + [f"placement group {pg}" for pg in live_placement_groups()]


def _machine_leftovers(ports_before: Optional[Set[int]], files: bool) -> List[str]:
    pids = [a["Pid"] for a in _raydist_actor_table() if a["Pid"]]
    found = [f"process {line}" for line in _live_actor_processes(pids)]
    if files:
        found += [f"file {path}" for path in raydist_files_of(pids)]
    found += [f"file {path}" for path in raydist_files_of([os.getpid()])]  # this driver's pdb relays
    if ports_before is not None:
        found += [f"listening port {port}" for port in sorted(listening_ports() - ports_before)]
    return found


def exported_figures() -> Dict[str, str]:
    """raydist's figures among what this (one-node) Ray exports for Prometheus: name -> its lines."""
    import urllib.request

    import ray

    from raydist.pool.worker.metrics import FIGURES

    port = ray.nodes()[0]["MetricsExportPort"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    lines = [line for line in text.splitlines() if line.startswith("ray_raydist_")]
    return {name: "\n".join(line for line in lines if line.startswith(f"ray_{name}")) for name in FIGURES}


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)  # polling state the code under test changes, with a deadline


def _settled(find: Callable[[], List[str]], timeout: float) -> List[str]:
    """What ``find`` still reports after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    found = find()
    while found and time.monotonic() < deadline:
        time.sleep(0.2)  # teardown the code under test started: poll, with a deadline
        found = find()
    return found


def assert_nothing_left(ports_before: Optional[Set[int]] = None, files: bool = True, within: float = 0.0, exit_s: float = 30.0) -> None:
    """The one leak check, after a group or run has ended: no raydist actor
    alive and no placement group (at once, or ``within`` seconds where the
    end is asynchronous, as after a restart); no process of any raydist actor
    this Ray ran, none of the files raydist made for them (``raydist_files_of``;
    ``files=False`` where a test SIGKILLed a worker, whose files the next
    start on that machine removes), and, given ``ports_before``, no new
    listening port in the driver, within ``exit_s`` (processes exit
    asynchronously)."""
    found = _settled(_ray_leftovers, within)
    found += _settled(lambda: _machine_leftovers(ports_before, files), exit_s)
    assert found == [], "left behind:\n" + "\n".join(found)
