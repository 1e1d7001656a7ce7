"""Shared fixtures: one local Ray per test session (start-up costs seconds),
and simulated multi-node clusters for the tests that need node layouts."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

REPO = Path(__file__).resolve().parent.parent
# Workers must import the test modules that define the functions they run.
TEST_DIRS = [REPO / "tests", REPO / "tests" / "live", REPO / "tests" / "unit"]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [*map(str, TEST_DIRS), str(REPO), os.environ.get("PYTHONPATH")]))
sys.path[:0] = [str(REPO / "tests")]

LOCAL_CPUS = 4


def repeats(quick: int, soak: int) -> "pytest.MarkDecorator":
    """A repetition count: ``quick`` in ``make test``, ``soak`` (the count the
    acceptance asks for) under the ``soak`` marker, run by ``make soak``."""
    return pytest.mark.parametrize(
        "repeat", [pytest.param(quick, id=f"x{quick}"), pytest.param(soak, id=f"x{soak}", marks=pytest.mark.soak)]
    )
_current: Dict[str, object] = {"kind": None, "cluster": None}


def _shutdown_current() -> None:
    if "ray" not in sys.modules:  # the unit tier never imports it
        return
    import ray

    if ray.is_initialized():
        ray.shutdown()
    cluster = _current["cluster"]
    if cluster is not None:
        cluster.shutdown()  # type: ignore[attr-defined]
    _current.update(kind=None, cluster=None)


def use_local_ray() -> None:
    """Make this process's Ray the shared local one (4 CPUs), starting it if needed."""
    import ray

    if _current["kind"] != "local":
        _shutdown_current()
        # address="local": never attach to another Ray that happens to run on the machine.
        ray.init(address="local", num_cpus=LOCAL_CPUS, include_dashboard=True, log_to_driver=True)
        _current["kind"] = "local"


@pytest.fixture
def ray_local() -> Iterator[None]:
    """A local Ray with 4 CPUs, started once and shared by every test that uses it."""
    use_local_ray()
    yield


def start_cluster(nodes: List[Dict[str, object]]) -> object:
    """A simulated multi-node cluster (several raylets on this machine); the
    first entry is the head node. Replaces whatever Ray this process had."""
    import ray
    from ray.cluster_utils import Cluster

    _shutdown_current()
    cluster = Cluster(initialize_head=True, head_node_args=dict(nodes[0], include_dashboard=False))
    for node in nodes[1:]:
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    _current.update(kind="cluster", cluster=cluster)
    return cluster


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _shutdown_current()


def live_raydist_actors() -> List[object]:
    """raydist's actors (workers and node agents) that are not dead (via Ray's state API)."""
    from ray.util.state import list_actors

    actors = list_actors(address=ray_address(), filters=[("state", "!=", "DEAD")])
    return [a for a in actors if a.class_name in ("RayWorker", "NodeAgent")]


def ray_address() -> str:
    """This process's cluster, named explicitly: other Rays may run on the machine."""
    import ray

    return ray.get_runtime_context().gcs_address


def live_placement_groups() -> List[str]:
    import ray

    return [pg_id for pg_id, pg in ray.util.placement_group_table().items() if pg["state"] != "REMOVED"]


def raydist_actors_ever_created() -> int:
    """How many of raydist's worker actors this Ray has seen, dead or alive."""
    from ray.util.state import list_actors

    actors = list_actors(address=ray_address(), limit=10_000, raise_on_missing_output=False)
    return sum(1 for a in actors if "RayWorker" in a.class_name)
