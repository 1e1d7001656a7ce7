"""The package's shape, read from its source: imports run one way, nothing
imports in a circle, objects own their fields. Sizes are the design's to
set: no line counts."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "raydist"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Dict[str, ast.Module] = {module_name(p): ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.AST, top_level_only: bool, type_checking: bool = False) -> Iterator[str]:
    """raydist modules imported by ``tree``: everywhere (lazy imports too), or
    only those at module level (under TYPE_CHECKING too if ``type_checking``)."""
    nodes = list(ast.iter_child_nodes(tree))
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If) and top_level_only and not type_checking and _type_checking(node):
            nodes.extend(node.orelse)
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and top_level_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("raydist"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("raydist"):
            # `from raydist.pool import ray_private` imports a submodule
            yield from (f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module for a in node.names)
        nodes.extend(ast.iter_child_nodes(node))


def test_the_core_imports_nothing_else_of_raydist_and_backends_only_the_core() -> None:
    for name, tree in MODULES.items():
        used = set(imports(tree, top_level_only=False))
        if name.startswith("raydist.core"):
            assert {m for m in used if not m.startswith("raydist.core")} == set(), name
        if name.startswith("raydist.backends") and not name.endswith(".driver"):
            assert {m for m in used if not m.startswith(("raydist.core", "raydist.backends"))} == set(), name
        if name.startswith("raydist.backends") and name.endswith(".driver"):  # a backend's driver half
            allowed = ("raydist.core", "raydist.backends", "raydist.config", "raydist.pool.records")
            assert {m for m in used if not m.startswith(allowed)} == set(), name


def test_errors_sit_below_the_pool() -> None:
    """Every layer reads raydist.errors; it reads nothing of raydist (the
    call ends and collective records its errors carry are defined there)."""
    assert set(imports(MODULES["raydist.errors"], top_level_only=False)) == set()


def test_the_core_names_no_pool_module_even_as_a_string() -> None:
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        assert "raydist.pool" not in path.read_text(), path.name


def test_ray_stays_out_of_the_core_backends_config_and_rules() -> None:
    ray_free = ("raydist.core", "raydist.backends", "raydist.config", "raydist.errors", "raydist.pool.rules", "raydist.pool.records")
    for name, tree in MODULES.items():
        if name.startswith(ray_free) and not name.endswith(".driver"):  # a backend's driver half may use Ray
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                )
                assert not any(n == "ray" or n.startswith("ray.") for n in names), name


# Within the pool, each part may read the ones after it in this list, never one before:
# the driver (the engine) sits on the cluster's seam, and both on the worker side's records and rules.
POOL_LAYERS = ("raydist.pool.driver", "raydist.pool.cluster", "raydist.pool.worker", "raydist.pool.rules")


def test_the_pools_parts_import_downward_only() -> None:
    for name, tree in MODULES.items():
        layer = next((i for i, prefix in enumerate(POOL_LAYERS) if name.startswith(prefix)), None)
        if layer is None:
            continue
        above = POOL_LAYERS[:layer]
        upward = {m for m in imports(tree, top_level_only=False) if m.startswith(above)}
        assert upward == set(), name


def test_only_the_tests_use_the_test_harness() -> None:
    """``raydist.testing`` (the fake cluster) is for tests: nothing of the package imports it."""
    users = {
        name
        for name, tree in MODULES.items()
        if not name.startswith("raydist.testing")
        for m in imports(tree, top_level_only=False)
        if m.startswith("raydist.testing")
    }
    assert users == set()


def ray_imports(tree: ast.Module) -> Set[str]:
    """The modules of Ray that ``tree`` imports, anywhere (lazy imports too)."""
    found: Set[str] = set()
    for node in ast.walk(tree):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        found.update(n for n in names if n == "ray" or n.startswith("ray."))
    return found


def imports_ray(tree: ast.Module) -> bool:
    return bool(ray_imports(tree))


# What of Ray the driver's parts import themselves: only the check that a
# user's ``datasets=`` are Ray Data datasets; everything else goes through the seam.
DRIVER_RAY_IMPORTS = {"raydist.pool.driver.datasets": {"ray.data"}}


def test_the_engine_reaches_ray_only_through_the_cluster_seam() -> None:
    """Start-up, calls, restarts, spares, state and shutdown (``raydist.pool.driver``)
    ask a ``Cluster`` (``raydist.pool.cluster.seam``, itself Ray-free); only
    ``raydist.pool.cluster`` and the worker side import Ray."""
    assert not imports_ray(MODULES["raydist.pool.cluster.seam"])
    testing = [name for name in MODULES if name.startswith("raydist.testing")]
    assert len(testing) > 3 and [name for name in testing if imports_ray(MODULES[name])] == []  # the fake cluster too
    on_ray = {name: ray_imports(tree) for name, tree in MODULES.items() if name.startswith("raydist.pool.driver") and imports_ray(tree)}
    assert on_ray == DRIVER_RAY_IMPORTS


def test_the_ray_import_finder_sees_lazy_and_from_imports() -> None:
    assert imports_ray(ast.parse("def f():\n    import ray.util\n"))
    assert imports_ray(ast.parse("from ray.exceptions import RayActorError\n"))
    assert not imports_ray(ast.parse("import raydist\nfrom raydist import ray_private\n"))


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    state: Dict[str, int] = {}  # 1: on the path, 2: done
    path: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


@pytest.mark.parametrize("type_checking", [False, True], ids=["run-time", "with-TYPE_CHECKING"])
def test_no_module_imports_in_a_circle(type_checking: bool) -> None:
    """Not even through imports made only for the type checker: a circle there
    is a circle of knowledge (calls -> group -> calls) all the same."""
    graph = {
        name: {m for m in imports(tree, top_level_only=True, type_checking=type_checking) if m in MODULES and m != name}
        for name, tree in MODULES.items()
    }
    assert find_cycle(graph) == []


def test_a_type_checking_import_counts_for_circles() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from raydist.pool.driver.group import WorkerGroup\n")
    assert list(imports(tree, top_level_only=True)) == []
    assert list(imports(tree, top_level_only=True, type_checking=True)) == ["raydist.pool.driver.group"]


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


# Private names written from outside their object that are not raydist's own
# classes' fields: torch's state-dict ``_metadata`` (read by load_state_dict),
# the marker raydist puts on a wrapped function, and the os._exit that notes a worker's status.
FOREIGN_PRIVATE_WRITES = {"rebuilt._metadata", "noted._raydist_noted", "os._exit"}


def private_writes(tree: ast.Module) -> List[str]:
    """Assignments to ``x._name`` where ``x`` is not ``self`` or ``cls``."""
    found = []
    for node in ast.walk(tree):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        )
        for target in [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]:
            private = isinstance(target, ast.Attribute) and target.attr.startswith("_") and not target.attr.startswith("__")
            if private and not (isinstance(target.value, ast.Name) and target.value.id in ("self", "cls")):  # type: ignore[attr-defined]
                found.append(ast.unparse(target))
    return found


def test_no_function_writes_another_objects_private_fields() -> None:
    """A class owns its fields: a module function that sets ``group._world``
    is a method in hiding (the run's controller owns what it changes)."""
    writes = {f"{name}: {write}" for name, tree in MODULES.items() for write in private_writes(tree)}
    assert {write.split(": ", 1)[1] for write in writes} <= FOREIGN_PRIVATE_WRITES, sorted(writes)
    assert private_writes(ast.parse("def f(group):\n    group._world = None\n    self._ok = 1\n")) == ["group._world"]


def test_no_object_is_built_past_its_constructor() -> None:
    calls = [
        name
        for name, tree in MODULES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__new__"
    ]
    assert calls == []


def test_one_module_decides_restarts() -> None:
    """Only the run's attempts (``raydist.pool.driver.attempts``) ask the restart policy."""
    askers = {
        name
        for name, tree in MODULES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "raydist.pool.rules.policy" and any(a.name == "decide" for a in node.names)
    }
    assert askers == {"raydist.pool.driver.attempts"}


def test_an_attempt_is_made_in_one_place_and_numbered_by_the_one_counter() -> None:
    """One object per attempt: only ``GroupBuilder`` makes an ``Attempt``, and
    only ``Attempts`` counts them (no module adds to an attempt's number)."""
    makers = {
        name
        for name, tree in MODULES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Attempt"
    }
    assert makers == {"raydist.pool.driver.startup"}
    counters = {
        name
        for name, tree in MODULES.items()
        for node in ast.walk(tree)
        if (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and _is_number(node.target))
        or (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.right, ast.Constant) and _is_number(node.left))
    }
    assert counters == {"raydist.pool.driver.attempts"}


def _is_number(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "number"


def test_an_attempts_watchers_are_its_own() -> None:
    """What watches an attempt's ranks is started and stopped by the attempt
    itself (``Attempt.start`` / ``stop_watching``), nowhere else."""
    outside = sorted(
        name
        for name, tree in MODULES.items()
        if name != "raydist.pool.driver.attempt"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"start", "stop"}
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id in {"GroupWatcher", "StragglerWatch"}
    )
    assert outside == []
