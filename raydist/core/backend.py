"""The interface a communication backend implements, and the registry of backends.

``init_distributed()`` picks one implementation per process (torch.distributed,
horovod, or a plugin) by name from the registry, and the object collectives
talk only to it. A backend moves pickled payloads; deciding what travels by reference
through Ray's object store, and when it may be freed, stays in
``raydist.core.collectives`` so that every backend gets it the same way.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.metadata
import threading
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from raydist.core.environment import WorldInfo

if TYPE_CHECKING:
    import torch


class Backend(ABC):
    """One way for the ranks of a job to find each other and exchange objects.

    Every method but ``init`` and ``shutdown`` is a collective: all ranks call
    it, in the same order.
    """

    # What DistInfo.backend reports ("gloo", "nccl", "horovod", ...); final once ``init`` returns.
    name: Optional[str]
    # This process's accelerator device (e.g. cuda:1), set by ``init_distributed``
    # before ``init`` when it will pin one; None on CPU. A backend that binds
    # its communicator to a device uses it; others ignore it.
    device_id: Optional["torch.device"] = None

    def __init__(
        self,
        backend: Optional[str] = None,
        dist_url: Optional[str] = None,
        timeout: Optional[datetime.timedelta] = None,
    ) -> None:
        """The one constructor signature ``init_distributed`` builds every backend with.

        ``backend``: the name the caller asked for when it is not the entry's
        own (torch.distributed's "gloo", "nccl", ...), else None; ``dist_url``
        and ``timeout``: ``init_distributed``'s, for backends that use them.
        Nothing may join the job here: that is ``init``'s job.
        """

    @abstractmethod
    def init(self, device_type: str) -> WorldInfo:
        """Join the job from the launcher's environment; this process's place in it.

        ``device_type`` ("cuda", "cpu", ...) is the kind of device this process
        uses; ``init_distributed`` pins the device itself afterwards.
        """

    @abstractmethod
    def broadcast(self, payload: Any, src: int) -> Any:
        """Rank ``src``'s payload, on every rank."""

    @abstractmethod
    def all_gather(self, payload: Any) -> List[Any]:
        """Every rank's payload, indexed by rank, on every rank."""

    @abstractmethod
    def gather(self, payload: Any, dst: int) -> Optional[List[Any]]:
        """Every rank's payload, indexed by rank, on rank ``dst`` only; None elsewhere."""

    @abstractmethod
    def scatter(self, payloads: Optional[Sequence[Any]], src: int) -> Any:
        """Rank ``src`` passes one payload per rank; each rank gets its own."""

    @abstractmethod
    def barrier(self) -> None:
        """Return once every rank has called it."""

    @abstractmethod
    def shutdown(self) -> None:
        """Leave the job; harmless when ``init`` never completed."""


# -- registry -----------------------------------------------------------------

ENTRY_POINT_GROUP = "raydist.backends"
TORCH_BACKEND = "torch"  # the entry of every name not registered otherwise


@dataclass(frozen=True)
class BackendEntry:
    """Everything raydist needs to know about a backend, as strings: nothing is
    imported until a process uses it (the worker's class on workers, the hooks
    on the driver)."""

    name: str  # what users pass: backend="horovod", --backend horovod
    worker: str  # "module:attr" of the Backend subclass, built in each worker
    driver_hooks: str  # "module:attr" of the driver-side hooks class, built as cls(config)
    reserved_env: FrozenSet[str] = frozenset()  # variables its launcher side sets on each rank
    reserved_env_prefixes: Tuple[str, ...] = ()  # and the prefixes of those
    requires: Optional[str] = None  # a module the driver must be able to import
    install_hint: str = ""  # how to install ``requires``, for the ImportError

    def __post_init__(self) -> None:
        for field_name in ("name", "worker", "driver_hooks"):
            value = getattr(self, field_name)
            if not isinstance(value, str) or not value.strip():
                raise TypeError(f"BackendEntry.{field_name} must be a non-empty string, got {value!r}")
        for field_name in ("worker", "driver_hooks"):
            if ":" not in getattr(self, field_name):
                raise ValueError(f"BackendEntry.{field_name} must be 'module:attr', got {getattr(self, field_name)!r}")
        object.__setattr__(self, "name", self.name.strip().lower())
        object.__setattr__(self, "reserved_env", frozenset(self.reserved_env))
        object.__setattr__(self, "reserved_env_prefixes", tuple(self.reserved_env_prefixes))

    def check_requires(self) -> None:
        """ImportError saying how to install ``requires`` when it cannot be imported.

        Run on the driver before Ray starts, so a missing library fails at once.
        """
        if self.requires is None:
            return
        try:
            importlib.import_module(self.requires)
        except ImportError as error:
            hint = self.install_hint or f"install the package that provides {self.requires!r}"
            raise ImportError(f"backend {self.name!r} needs {self.requires}, which cannot be imported: {hint}") from error


# The built-in backends' entries, each kept in its own package with both of
# its halves; loaded at the registry's first use (they import this module).
BUILTIN_BACKENDS: Tuple[str, ...] = (
    "raydist.backends.torch_distributed:ENTRY",
    "raydist.backends.horovod:ENTRY",
)

_lock = threading.Lock()
_registry: Dict[str, BackendEntry] = {}  # filled with the built-in entries at first use
_not_plugins: Set[str] = set()  # names already looked up among the entry points, in vain
_all_plugins_loaded = False
_builtins_loaded = False


def _load_builtins() -> None:
    """Put the built-in entries in the registry, once, before anything else is."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    entries = [load(ref) for ref in BUILTIN_BACKENDS]  # outside the lock: importing runs their modules
    with _lock:
        if not _builtins_loaded:
            _registry.update({entry.name: entry for entry in entries})
            _builtins_loaded = True


def register_backend(entry: BackendEntry) -> BackendEntry:
    """Make ``entry`` known by its name in this process (a second entry of the
    same name replaces the first); returns it."""
    if not isinstance(entry, BackendEntry):
        raise TypeError(f"register_backend takes a raydist.core.backend.BackendEntry, not {type(entry).__name__}")
    _load_builtins()
    with _lock:
        _registry[entry.name] = entry
        _not_plugins.discard(entry.name)
    return entry


def _plugin_entry(point: importlib.metadata.EntryPoint) -> BackendEntry:
    entry = point.load()
    if not isinstance(entry, BackendEntry):
        raise TypeError(
            f"entry point {point.name!r} of group {ENTRY_POINT_GROUP!r} ({point.value}) must load a "
            f"raydist.core.backend.BackendEntry, not {type(entry).__name__}"
        )
    if entry.name != point.name.strip().lower():
        raise ValueError(f"entry point {point.name!r} of group {ENTRY_POINT_GROUP!r} loads the entry of backend {entry.name!r}")
    return entry


def _entry_points(name: Optional[str] = None) -> List[importlib.metadata.EntryPoint]:
    found: Any = importlib.metadata.entry_points()
    # Python 3.10+ selects by group; 3.9 returns a dict of groups.
    points = found.select(group=ENTRY_POINT_GROUP) if hasattr(found, "select") else found.get(ENTRY_POINT_GROUP, ())
    return [point for point in points if name is None or point.name.strip().lower() == name]


def backend_entry(name: Optional[str]) -> BackendEntry:
    """The entry for backend ``name`` (case-insensitive): registered in this
    process, else a pip-installed plugin (entry-point group "raydist.backends"),
    else torch.distributed's, whose backends (gloo, nccl, hccl, xccl, ccl,
    mpi, ...) are many and open-ended. None is torch.distributed."""
    key = TORCH_BACKEND if name is None else name.strip().lower()
    _load_builtins()
    with _lock:
        entry = _registry.get(key)
        if entry is not None or key in _not_plugins:
            return entry or _registry[TORCH_BACKEND]
    points = _entry_points(key)
    if not points:
        with _lock:
            _not_plugins.add(key)
        return backend_entry(TORCH_BACKEND)
    return register_backend(_plugin_entry(points[0]))


def registered_backends() -> Tuple[BackendEntry, ...]:
    """Every backend known here: the built-in ones, those registered in this
    process and every installed plugin (loaded on the first call)."""
    global _all_plugins_loaded
    _load_builtins()
    if not _all_plugins_loaded:
        for point in _entry_points():
            if point.name.strip().lower() in _registry:
                continue
            try:
                register_backend(_plugin_entry(point))
            except Exception as error:  # noqa: BLE001 - one broken plugin must not break every run
                warnings.warn(f"backend plugin {point.name!r} ({point.value}) cannot be loaded: {error!r}")
        _all_plugins_loaded = True
    with _lock:
        return tuple(_registry.values())


def reserved_env() -> Tuple[FrozenSet[str], Tuple[str, ...]]:
    """The variables (and prefixes) the launcher side of any known backend sets on its ranks."""
    entries = registered_backends()
    names = frozenset().union(*(entry.reserved_env for entry in entries))
    prefixes = tuple(prefix for entry in entries for prefix in entry.reserved_env_prefixes)
    return names, prefixes


def load(ref: str) -> Any:
    """The object a "module:attr" string names (attr may be dotted), imported now."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'module:attr', got {ref!r}")
    value: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        value = getattr(value, part)
    return value
