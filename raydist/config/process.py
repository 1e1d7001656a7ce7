"""The options that shape each worker's process: its backend, environment,
binding, role and debugging aids; each with its checks."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Mapping, Tuple

from raydist.config.flags import flag, parse_env_pair, parse_seconds
from raydist.config.option import Option
from raydist.config.values import at_least, check_bool, check_name, check_seconds, choice, empty_if_none, optional, type_name
from raydist.core.accelerators import ROWS, VISIBLE_DEVICES_VARS
from raydist.core.backend import TORCH_BACKEND, backend_entry, reserved_env
from raydist.core.environment import DEVICE_INDEX_VAR, TORCHRUN_ENV_VARS

# Measured break-even against gloo pickling among 4 ranks: 2-4 MB for
# broadcast, 1-2 MB for all-gather (benchmarks/collectives.py).
DEFAULT_OBJECT_STORE_THRESHOLD = 4 << 20
# torchrun's --numa-binding modes (torch.numa.binding.AffinityMode).
NUMA_BINDING_MODES: Tuple[str, ...] = ("node", "socket", "exclusive", "core-complex")

# The launcher variables raydist sets per rank: an override would give ranks
# a world that disagrees with the real one (a hang, or a port clash): torchrun's
# own (read off ``torchrun_env``), the device index and the visible devices.
# Each backend's launcher side adds its own (the registry's reserved_env).
LAUNCHER_ENV_VARS = frozenset({*TORCHRUN_ENV_VARS, DEVICE_INDEX_VAR, *VISIBLE_DEVICES_VARS})
LAUNCHER_ENV_PREFIXES: Tuple[str, ...] = ("TORCHELASTIC_", "RAYDIST_")

# torch.distributed backends that device vendors' extensions register on import
# (not in Backend.backend_list until then): known, so not typos.
_EXTENSION_BACKENDS = frozenset({row.default_backend for row in ROWS} | {row.fallback.backend for row in ROWS if row.fallback is not None})
# torch.distributed backends every torch build has, and those a build may lack.
_ALWAYS_BUILT = frozenset({"gloo", "fake"})
_BUILD_OPTIONS = frozenset({"nccl", "mpi", "ucc", "xccl"})


def reserved_env_vars() -> Tuple[FrozenSet[str], Tuple[str, ...]]:
    """The variables (and prefixes) ``env`` may not set: the launcher's, and
    those of every registered backend's launcher side."""
    names, prefixes = reserved_env()
    return LAUNCHER_ENV_VARS | names, LAUNCHER_ENV_PREFIXES + prefixes


def check_env(name: str, env: Any) -> Dict[str, str]:
    """Extra worker variables: strings only, none of the launcher variables raydist sets."""
    if not isinstance(env, Mapping):
        raise TypeError(f"{name} must be a mapping of variable names to strings, not {type_name(env)}")
    reserved, reserved_prefixes = reserved_env_vars() if env else (frozenset(), ())
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"{name} key {key!r} is not a valid environment variable name")
        if not isinstance(value, str):
            raise TypeError(f"{name}[{key!r}] must be a string, not {type_name(value)} {value!r}")
        if "\0" in value:  # execve cannot carry it: the workers would fail after Ray started
            raise ValueError(f"{name}[{key!r}] contains a NUL character, which no environment variable can hold")
        if key in reserved or key.startswith(reserved_prefixes):
            raise ValueError(
                f"{name}[{key!r}]: raydist sets {key} on every rank from where the workers run; "
                "choose the world with num_workers / resources_per_worker instead"
            )
    return dict(env)


def check_backend(name: str, value: Any) -> str:
    """A registered backend (horovod, a plugin) whose library the driver can
    import, or a torch.distributed backend this torch knows and was built with."""
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"{name} must be a backend name such as 'gloo' or 'horovod', not {value!r}")
    backend = value.strip().lower()
    entry = backend_entry(backend)
    if entry.name == TORCH_BACKEND:
        _check_torch_backend(backend)
    entry.check_requires()  # ImportError saying how to install it, before Ray starts
    return backend


def torch_backend_parts(name: str) -> Tuple[str, ...]:
    """ "cpu:gloo,cuda:nccl" -> ("gloo", "nccl")."""
    return tuple(part.partition(":")[2] if ":" in part else part for part in name.split(","))


def _check_torch_backend(name: str) -> None:
    for part in torch_backend_parts(name):
        if part in _ALWAYS_BUILT or (part in _EXTENSION_BACKENDS and part not in _BUILD_OPTIONS):
            continue  # known without importing torch (the CLI stays quick for --backend gloo)
        import torch
        import torch.distributed as dist

        known = (set(dist.Backend.backend_list) - {"undefined"}) | _EXTENSION_BACKENDS
        if part not in known:  # backend_list includes those torch plugins registered here
            raise ValueError(f"unknown backend {name!r}: not in raydist's registry nor torch.distributed's ({', '.join(sorted(known))})")
        available = getattr(dist, f"is_{part}_available", None)
        if available is not None and not available():
            raise ValueError(f"backend {name!r}: this torch ({torch.__version__}) was built without {part}")


def _flag_off(given: bool) -> bool:
    return not given


BACKEND = Option(
    None,
    check=optional(check_backend),
    doc='torch.distributed backend (default: the device\'s: nccl, hccl, xccl, gloo), or "horovod" '
    "to run hvd.init() instead (or a backend plugin's name); a backend whose library cannot be "
    "imported here is refused.",
    flag=flag(
        "--backend",
        metavar="NAME",
        help="initialise torch.distributed with this backend (gloo, nccl, hccl, ...) or "
        "'horovod' (or an installed plugin's) before the script starts, for scripts that expect "
        "an initialised process group (raydist.init_distributed() and raydist.compat reuse it; a "
        "direct dist.init_process_group() call would fail). Default: leave initialization to the "
        "script, as torchrun does",
    ),
)
ENV = Option(
    {},
    check=empty_if_none(check_env, {}),
    doc="extra environment variables for every worker (not the launcher's own).",
    flag=flag(
        "--env",
        parse=parse_env_pair,
        action="append",
        metavar="KEY=VALUE",
        to_option=dict,
        help="set an environment variable on every worker (repeatable); workers on a "
        "remote cluster do not inherit this shell's environment",
    ),
)
INIT_PROCESS_GROUP = Option(
    True,
    check=check_bool,  # raydist run: only with --backend
    doc="initialise torch.distributed before the function runs.",
)
OBJECT_STORE_THRESHOLD = Option(
    DEFAULT_OBJECT_STORE_THRESHOLD,
    check=optional(at_least(0)),
    doc="objects at least this many bytes travel through Ray's object store in raydist's object collectives (None: never).",
)
PG_TIMEOUT = Option(
    None,
    check=optional(check_seconds),
    doc="seconds the process group waits in a collective before it fails (torch's "
    "``init_process_group(timeout=)``); None: torch's default.",
    flag=flag(
        "--pg-timeout",
        parse=parse_seconds,
        metavar="SECONDS",
        help="how long a collective may wait before the process group fails it (torch's "
        "init_process_group timeout); applies with --backend, where raydist initialises the group",
    ),
)
NUMA_BINDING = Option(
    None,
    check=optional(choice(NUMA_BINDING_MODES)),
    doc="torchrun's ``--numa-binding`` mode (node, socket, exclusive, core-complex), applied in each worker before the code runs.",
    flag=flag(
        "--numa-binding",
        "--numa_binding",
        parse=str.lower,
        choices=NUMA_BINDING_MODES,
        metavar="MODE",
        help="torchrun's NUMA binding: before the script starts, bind each worker's threads to the "
        "CPUs near its GPU (torch.numa.binding's node, socket, exclusive or core-complex). Where "
        "a node gives no topology to bind by (no CUDA GPU, no NUMA information), nothing is bound "
        "and local rank 0 there prints one line saying why",
    ),
)
VIRTUAL_LOCAL_RANK = Option(
    False,
    check=check_bool,
    doc="torchrun's ``--virtual-local-rank``: each worker sees only its own device(s), and LOCAL_RANK=0.",
    flag=flag(
        "--virtual-local-rank",
        "--virtual_local_rank",
        action="store_true",
        help="as torchrun: every worker sees only its own device(s) (CUDA_VISIBLE_DEVICES and the "
        "like) and LOCAL_RANK=0, so its device is index 0",
    ),
)
ROLE = Option(
    "default",
    check=check_name,
    doc="torchrun's ``--role``: ROLE_NAME, and ``${role_name}`` in the log prefix.",
    flag=flag(
        "--role",
        metavar="ROLE",
        help="the workers' role name, as torchrun's: ROLE_NAME on every rank and ${{role_name}} "
        "in TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (default: {default})",
    ),
)
FLIGHT_RECORDER = Option(
    True,
    check=check_bool,
    doc="switch torch's flight recorder on in every worker (a short buffer): a hang's report then "
    "says at which collective the ranks diverged, and a rank that reaches collectives "
    "consistently late is named (``WorkerGroup.stragglers()``).",
    flag=flag(
        "--no-flight-recorder",
        action="store_true",
        to_option=_flag_off,
        help="switch off torch's flight recorder in the workers (on by default, with a short "
        "buffer): without it a hang's report cannot say at which collective the ranks diverged, "
        "and no rank is named as a straggler",
    ),
)
POST_MORTEM = Option(
    False,
    check=check_bool,
    doc="keep a rank that raised alive at its exception, in pdb (in the launching terminal, or attached with ``raydist debug``).",
    flag=flag(
        "--post-mortem",
        action="store_true",
        help="keep a rank that raises alive at its exception and open pdb there (in this "
        "terminal, or through `raydist debug` from another shell); the run goes on when pdb ends",
    ),
)
