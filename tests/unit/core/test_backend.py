"""The backend registry (raydist.core.backend): lookup by name, plugins found
through the "raydist.backends" entry-point group, requirements checked with an
install hint, reserved variables fed to RunConfig, and the import layering
that lets the core build a backend it never imports by name. No Ray."""

from __future__ import annotations

import ast
import inspect
import os
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from raydist.core import backend as registry
from raydist.core.backend import BackendEntry, backend_entry, load, register_backend, registered_backends

PACKAGE = Path(registry.__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts from the built-in entries, and leaves nothing behind."""
    monkeypatch.setattr(registry, "_registry", {entry.name: entry for entry in map(load, registry.BUILTIN_BACKENDS)})
    monkeypatch.setattr(registry, "_builtins_loaded", True)
    monkeypatch.setattr(registry, "_not_plugins", set())
    monkeypatch.setattr(registry, "_all_plugins_loaded", False)
    yield


def demo_entry(name: str = "demo", **kwargs: object) -> BackendEntry:
    return BackendEntry(name=name, worker="demo_mod:DemoBackend", driver_hooks="demo_mod:DemoHooks", **kwargs)  # type: ignore[arg-type]


def test_builtin_entries() -> None:
    torch_entry = backend_entry(None)
    assert torch_entry.name == registry.TORCH_BACKEND == "torch"
    assert torch_entry.worker == "raydist.backends.torch_distributed.worker:TorchDistributedBackend"
    assert torch_entry.driver_hooks == "raydist.backends.torch_distributed.driver:TorchDistributedHooks"
    horovod = backend_entry("horovod")
    assert horovod.worker == "raydist.backends.horovod.worker:HorovodBackend"
    assert horovod.driver_hooks == "raydist.backends.horovod.driver:HorovodHooks"
    assert horovod.reserved_env_prefixes == ("HOROVOD_GLOO_RENDEZVOUS_",)
    assert horovod.requires == "horovod.torch"
    assert backend_entry(" HoroVod ") is horovod
    assert {entry.name for entry in registered_backends()} >= {"torch", "horovod"}


@pytest.mark.parametrize("name", ["gloo", "nccl", "hccl", "xccl", "ccl", "mpi", "NCCL", "torch"])
def test_torch_distributed_backends_are_torch_entry(name: str) -> None:
    assert backend_entry(name) is backend_entry(None)


def test_register_and_replace() -> None:
    entry = register_backend(demo_entry(name="Demo"))
    assert entry.name == "demo" and backend_entry("DEMO") is entry
    assert entry in registered_backends()
    replacement = register_backend(demo_entry(reserved_env={"DEMO_PORT"}))
    assert backend_entry("demo") is replacement
    with pytest.raises(TypeError, match="BackendEntry"):
        register_backend("demo")  # type: ignore[arg-type]


def test_entries_are_checked() -> None:
    with pytest.raises(ValueError, match="module:attr"):
        BackendEntry(name="x", worker="no_colon", driver_hooks="m:a")
    with pytest.raises(TypeError, match="name"):
        BackendEntry(name="", worker="m:a", driver_hooks="m:a")


def test_load() -> None:
    assert load("os.path:join") is os.path.join
    assert load("raydist.core.backend:BackendEntry.check_requires") is BackendEntry.check_requires
    with pytest.raises(ValueError, match="module:attr"):
        load("os.path.join")
    with pytest.raises(ModuleNotFoundError):
        load("no_such_module_for_raydist:x")


def test_requires_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = demo_entry(requires="no_such_module_for_raydist", install_hint="pip install demo-raydist")
    with pytest.raises(ImportError, match="pip install demo-raydist"):
        entry.check_requires()
    demo_entry().check_requires()  # nothing required
    monkeypatch.setitem(sys.modules, "horovod", None)  # None in sys.modules: the import fails
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    with pytest.raises(ImportError, match="scripts/install-horovod.sh"):
        backend_entry("horovod").check_requires()


def write_plugin(root: Path, name: str, entry_code: str) -> None:
    """A pip-installed plugin as site-packages holds it: a module and its dist-info."""
    module = f"{name}_raydist_plugin"
    (root / f"{module}.py").write_text("from raydist.core.backend import BackendEntry\n" + textwrap.dedent(entry_code))
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[raydist.backends]\n{name} = {module}:ENTRY\n")


def test_plugin_found_through_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_plugin(
        tmp_path,
        "plugged",
        """
        ENTRY = BackendEntry(
            name="plugged", worker="plugged_raydist_plugin:Backend", driver_hooks="plugged_raydist_plugin:Hooks",
            reserved_env_prefixes=("PLUGGED_RDV_",), reserved_env={"PLUGGED_PORT"},
        )
        """,
    )
    assert backend_entry("plugged").name == "torch"  # not installed yet (and the miss is remembered)
    monkeypatch.setattr(registry, "_not_plugins", set())
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = backend_entry("Plugged")
    assert entry.name == "plugged" and entry.reserved_env_prefixes == ("PLUGGED_RDV_",)
    assert backend_entry("plugged") is entry  # registered on first use
    assert backend_entry("gloo").name == "torch"  # other names are still torch.distributed's


def test_registered_backends_loads_every_plugin_and_config_reserves_their_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raydist.config import RunConfig

    write_plugin(
        tmp_path,
        "reserving",
        """
        ENTRY = BackendEntry(
            name="reserving", worker="m:B", driver_hooks="m:H",
            reserved_env={"RESERVING_PORT"}, reserved_env_prefixes=("RESERVING_RDV_",),
        )
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "reserving" in {entry.name for entry in registered_backends()}
    for key in ("RESERVING_PORT", "RESERVING_RDV_ADDR", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "RANK", "TORCHELASTIC_X"):
        with pytest.raises(ValueError, match=key):
            RunConfig(env={key: "1"})
    assert RunConfig(env={"RESERVING": "1", "HOROVOD_GLOO_IFACE": "eth0"}).env["RESERVING"] == "1"


def test_a_plugin_that_loads_something_else_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_plugin(tmp_path, "wrong", "ENTRY = 'not an entry'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match="must load a raydist.core.backend.BackendEntry"):
        backend_entry("wrong")
    with pytest.warns(UserWarning, match="'wrong'"):
        registered_backends()  # one broken plugin does not break the others


def test_config_backend_checks_use_the_registry() -> None:
    from raydist.config import RunConfig

    with pytest.raises(ValueError, match="no effect"):
        RunConfig(backend="gloo", init_process_group=False)
    register_backend(demo_entry())
    # A backend other than torch.distributed's is always initialised, as horovod is.
    assert RunConfig(backend="demo", init_process_group=False).backend == "demo"
    # A backend whose library is missing is refused when the config is built, before Ray.
    register_backend(demo_entry(requires="no_such_module_for_raydist", install_hint="pip install demo-raydist"))
    try:
        with pytest.raises(ImportError, match="pip install demo-raydist"):
            RunConfig(backend="demo")
    finally:
        register_backend(demo_entry())


def test_every_backend_has_the_uniform_constructor() -> None:
    expected = ["self", "backend", "dist_url", "timeout"]
    assert list(inspect.signature(registry.Backend.__init__).parameters) == expected
    for entry in map(load, registry.BUILTIN_BACKENDS):
        cls = load(entry.worker)
        assert issubclass(cls, registry.Backend)
        assert list(inspect.signature(cls.__init__).parameters) == expected, entry.name


def _raydist_imports(path: Path) -> set:
    """The raydist modules ``path`` imports (absolute imports, anywhere in the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "raydist")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "raydist":
            found.add(node.module)
    return found


@pytest.mark.parametrize("folder", ["core", "backends"])
def test_core_and_backends_import_only_the_core(folder: str) -> None:
    """A backend's entry and worker half run without Ray (under torchrun too);
    only its driver half reads what the worker group hands it."""
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        if path.name == "driver.py":
            continue
        own = f"raydist.{folder}.{path.parent.name}" if path.parent != PACKAGE / folder else "raydist.core"
        outside = {name for name in _raydist_imports(path) if not name.startswith(("raydist.core", own))}
        assert not outside, f"{path.relative_to(PACKAGE)} imports {sorted(outside)}"


def test_each_backend_keeps_its_halves_and_entry_in_its_own_package() -> None:
    for ref in registry.BUILTIN_BACKENDS:
        package = ref.partition(":")[0]
        entry = load(ref)
        assert entry.worker.startswith(f"{package}.worker:") and entry.driver_hooks.startswith(f"{package}.driver:")
        assert issubclass(load(entry.worker), registry.Backend)
        assert (PACKAGE.parent / package.replace(".", "/") / "driver.py").is_file()  # imports Ray: not loaded here


def test_config_imports_only_the_core() -> None:
    for path in sorted((PACKAGE / "config").glob("*.py")):
        outside = {name for name in _raydist_imports(path) if not name.startswith(("raydist.core", "raydist.config"))}
        assert not outside, path.name


FAKE_BACKEND = """
from raydist.core.backend import Backend
from raydist.core.environment import WorldInfo

built = []


class FakeBackend(Backend):
    name = "fake"

    def __init__(self, backend=None, dist_url=None, timeout=None):
        built.append((backend, dist_url, timeout))

    def init(self, device_type):
        return WorldInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0)

    def broadcast(self, payload, src):
        return payload

    def all_gather(self, payload):
        return [payload]

    def gather(self, payload, dst):
        return [payload]

    def scatter(self, payloads, src):
        return payloads[0]

    def barrier(self):
        pass

    def shutdown(self):
        built.append("shutdown")
"""


@pytest.mark.parametrize("flag", [False, True], ids=["backend='horovod'", "horovod=True"])
def test_init_distributed_builds_the_entry_by_name(flag: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import raydist
    from raydist.core import initialize

    (tmp_path / "fake_raydist_backend.py").write_text(FAKE_BACKEND)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_raydist_backend", raising=False)  # a fresh record per test
    # The horovod entry, pointed at a stand-in: the core reaches the class only through the registry.
    register_backend(BackendEntry(name="horovod", worker="fake_raydist_backend:FakeBackend", driver_hooks="m:H"))
    fake = __import__("fake_raydist_backend")
    assert initialize._context is None
    try:
        info = (
            raydist.init_distributed(device="cpu", horovod=True)
            if flag
            else raydist.init_distributed(device="cpu", backend="horovod", dist_url="tcp://x:1")
        )
        assert info.backend == "fake" and info.horovod and info.distributed
        assert fake.built == [(None, None if flag else "tcp://x:1", None)]  # the entry's own name is not passed on
    finally:
        raydist.shutdown()
    assert fake.built[-1] == "shutdown"
