"""The records the pool's parts pass to each other: where a worker landed,
which rank it holds, where it leaves evidence, what its call returned, and
what it needs to set itself up. Pure data, no Ray: the rules, the driver and
the worker all import this module, and it imports none of them."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, FrozenSet, Mapping, Optional, Tuple

from raydist.errors import CallEnd, CollectiveEntry  # noqa: F401 - CallEnd re-exported: the records name it

if TYPE_CHECKING:
    from raydist.config import RunConfig

# Calls up to this size travel inside each actor task (no object-store round
# trip), and a worker keeps the last one: the same call again is sent without it.
INLINE_CALL_BYTES = 64 * 1024

# The types a value may have to travel back bare, as the actor method's own
# return value: Ray reads some others itself (a generator as several return
# values, a Ray error as the task's failure), so anything else goes inside
# its Outcome, where Ray pickles it as it would any argument.
BARE_RESULT_TYPES: FrozenSet[type] = frozenset({type(None), bool, int, float, complex, str, bytes, list, tuple, dict})

# A run's training state: the variable that tells each rank where it lives, and
# the namespace its keeper (named after the run's state) is found in.
STATE_SETTINGS_VAR = "RAYDIST_STATE"
STATE_NAMESPACE = "raydist-state"


@dataclass(frozen=True)
class WorkerEvidence:
    """Where one worker process leaves what it wrote and how it ended (paths on its node)."""

    stderr_path: Optional[str]  # the file Ray sends this process's stderr to (Ray's, never removed by raydist)
    exit_note_path: str  # os._exit(n) writes n here first; a fatal signal -n
    stack_path: str  # faulthandler writes the stacks here on STACK_SIGNAL
    preemption_path: str  # the driver writes the drain deadline here (see raydist.core.preemption)
    diagnostics_path: str = ""  # the worker's diagnostics socket (its flight recorder, on request)
    error_path: str = ""  # TORCHELASTIC_ERROR_FILE when no log directory on this node holds it

    @property
    def own_files(self) -> Tuple[str, ...]:
        """The files raydist made for this process, removed once it is gone."""
        paths = (self.exit_note_path, self.stack_path, self.preemption_path, self.error_path, self.diagnostics_path)
        return tuple(p for p in paths if p)

    @classmethod
    def for_process(cls, pid: int, scratch_dir: str) -> "WorkerEvidence":
        try:
            stderr_path: Optional[str] = os.readlink("/proc/self/fd/2")  # Linux; Ray's per-worker .err file
        except OSError:
            stderr_path = None
        return cls(
            stderr_path=stderr_path if stderr_path and os.path.isfile(stderr_path) else None,
            exit_note_path=os.path.join(scratch_dir, f"exit-{pid}"),
            stack_path=os.path.join(scratch_dir, f"stacks-{pid}"),
            preemption_path=os.path.join(scratch_dir, f"preempted-{pid}"),
            diagnostics_path=os.path.join(scratch_dir, f"diag-{pid}.sock"),
            error_path=os.path.join(scratch_dir, f"error-{pid}.json"),
        )


@dataclass(frozen=True)
class Placement:
    """What a started worker reports about itself."""

    index: int  # position of the actor in the group's actor list
    node_id: str
    node_ip: str
    pid: int
    accelerator_ids: Tuple[str, ...]
    free_port: int
    evidence: Optional[WorkerEvidence] = None  # where the process leaves its stderr, exit note, stacks
    hostname: str = ""  # the node's host name (socket.gethostname()), ${hostname} in a log line prefix


@dataclass(frozen=True)
class WorkerInfo:
    """One worker of a group: where it runs and which rank it holds."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    node_id: str
    node_ip: str
    pid: int
    device_ids: Tuple[str, ...]  # this worker's device ids as Ray assigned them
    visible_device_ids: Tuple[str, ...]  # the group's device ids on this node, in id order
    device_index: Optional[int]  # own first device's position in visible_device_ids; None without devices
    actor_index: int
    evidence: Optional[WorkerEvidence] = None  # paths on the worker's node (stderr file, ...)
    hostname: str = ""  # the node's host name, as its process sees it


@dataclass(frozen=True)
class Outcome:
    """What one rank's call ended with (raising is reported, not propagated)."""

    value: Any = None
    traceback: Optional[str] = None
    exception_type: Optional[str] = None
    exception: Optional[bytes] = None  # the pickled exception, when it pickles
    exit_code: Optional[int] = None  # sys.exit(n) with n != 0
    timestamp: float = 0.0
    collectives: Optional[Tuple[CollectiveEntry, ...]] = None  # a failed call's last collectives, when it was in one
    spans: Tuple[Any, ...] = ()  # what the rank did since its last result, for the run's timeline (``timeline.Span``)
    waits: Tuple[Tuple[str, float], ...] = ()  # seconds waited since its last result, by kind ("data", "state")

    @property
    def ok(self) -> bool:
        return self.traceback is None and self.exit_code is None

    def to_send(self) -> Any:
        """What travels back to the driver: a plain success whose value is of
        a ``BARE_RESULT_TYPES`` type as that value (a warm call then pickles no
        wrapper), anything else as the Outcome."""
        plain = self.ok and self.exception_type is None and self.collectives is None and not self.spans and not self.waits
        return self.value if plain and type(self.value) in BARE_RESULT_TYPES else self


@dataclass(frozen=True)
class ClusterNode:
    node_id: str
    ip: str
    resources: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)  # Ray's node labels (ray.io/node-id, the user's)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one worker needs to set itself up, sent in one piece.

    ``config`` is the run's whole (frozen, Ray-free) configuration, so an
    option the worker reads needs no new argument anywhere on the way.
    """

    worker: WorkerInfo
    env: Mapping[str, str]  # the launcher environment for this rank
    config: "RunConfig"
    device_type: str  # torch's device type of the group's accelerator kind
    init_kwargs: Optional[Mapping[str, Any]]  # the backend's init_distributed arguments; None: the code initialises itself
    backend_entry: Any = None  # config.backend's registry entry, registered in the worker before init


class GroupPhase(enum.Enum):
    """Where a worker group is in its life; changed under the group's short
    lock, only along ``PHASE_TRANSITIONS`` (``check_transition``)."""

    STARTING = "starting"  # an attempt's world is being placed and built (the first, or a fresh restart's)
    RUNNING = "running"  # a world takes calls
    RESTARTING = "restarting"  # a warm restart builds the next world: calls wait for it
    SHUTTING_DOWN = "shutting down"  # releasing everything; entered once, by shutdown, cancel or growth
    CLOSED = "closed"  # nothing left


# Every move a group's phase may make (from, to); any other is a bug.
PHASE_TRANSITIONS: FrozenSet[Tuple[GroupPhase, GroupPhase]] = frozenset(
    {
        (GroupPhase.STARTING, GroupPhase.RUNNING),
        (GroupPhase.STARTING, GroupPhase.SHUTTING_DOWN),  # the start failed, or shutdown() from another thread
        (GroupPhase.RUNNING, GroupPhase.RESTARTING),
        (GroupPhase.RUNNING, GroupPhase.STARTING),  # a fresh (or larger) restart of a run: the next attempt is placed
        (GroupPhase.RUNNING, GroupPhase.SHUTTING_DOWN),
        (GroupPhase.RESTARTING, GroupPhase.RUNNING),  # the next world is installed (or the warm restart failed)
        (GroupPhase.RESTARTING, GroupPhase.SHUTTING_DOWN),  # a shutdown wins over the restart
        (GroupPhase.SHUTTING_DOWN, GroupPhase.CLOSED),
    }
)


def check_transition(current: GroupPhase, to: GroupPhase) -> None:
    """Refuse a phase change that ``PHASE_TRANSITIONS`` does not list."""
    if (current, to) not in PHASE_TRANSITIONS:
        raise RuntimeError(f"a worker group cannot go from {current.value} to {to.value}")
