"""The store of ``save_state`` / ``load_state`` inside a raydist rank.

``save_state`` copies each part of the step (the rank's own state; the
shared state once per node, by local rank 0) straight into Ray's object
store on its node (``state_parts``: the tensors' bytes out of band, no
pickling), the only copy made on this node. The loop waits for it, except
for the tensors of an optimizer given to the same ``save_state``: they are
put in the background and the optimizer's next ``step()`` waits for that
(``pack_later``: one changed in place meanwhile drops the step, and the
keeper is told, so that no rank waits on its commit). State on a device:
the loop waits for its copy to host memory, reused from save to save; the
put follows in the background. In the background two
holders keep each part, outside the rank: the one on its node keeps that
very memory (no copy), one on another node (a second process on a one-node
cluster) a copy Ray moves there. The rank then acknowledges the step to the
primary keeper, which commits it once every rank has.

A ``save_state`` never waits for the step before it. Which steps are sent
is the keeper's word (``StateKeeper.want``, ``rules.commits.SendPlan``),
asked at each save and read by the sender: the first rank to ask about a
step decides for all, and the step is sent when that rank had nothing on
its way out. Every rank sends the same steps (none waits on a commit that
cannot come), a new step goes out once the last is committed and the
rank's pace allows (``rules.pacing.SendPace``: no more often than the loop
can afford, ``state_overhead``, as measured), and a step not sent costs its
copy only until the keeper's answer. The newest
step, if not sent, is kept until a newer save: at a call's end (``flush``)
or in ``wait_committed`` every rank asks for it again, and it is sent once
all have. The rank keeps the objects of the committed step (a survivor of
a warm restart loads from it), the one being sent and at most one more.

A rank that joins a restarted attempt starts loading the committed step as
it is set up (``install``), in the background: its part comes from its own
object or a holder while the code builds its model, and ``load_state`` only
hands it over. A survivor whose rank changed (the ranks of a node follow
its devices) needs another rank's part, which only a holder has.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, FrozenSet, List, Mapping, Optional, Set, Tuple

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raydist.core import state
from raydist.core.state import Snapshot, StateStore, check_world, from_bytes, host_copy, storage_pointer
from raydist.core.state_files import SHARED, SnapshotMeta, rank_key
from raydist.pool.ray_private import wait_actor_handed_over
from raydist.pool.records import STATE_NAMESPACE, STATE_SETTINGS_VAR
from raydist.pool.rules.commits import store_room_warning
from raydist.pool.rules.pacing import SendPace
from raydist.pool.timeline import SPANS
from raydist.pool.worker.metrics import FIGURES_HERE, state_waited
from raydist.pool.worker.state_keeper import DURABLE, keeper_actor
from raydist.pool.worker.state_parts import Deferred, on_device, pack, pack_later, tensor_bytes, tensors_of, unpack

KEEPER_HANDOVER_S = 10.0  # how long a rank that created the keeper waits for the GCS to take its creation
FLUSH_TIMEOUT = 120.0  # seconds a finished call waits for its last step to reach the holders
ASK_FIRST_BYTES = 8 * 2**20  # a step at least this big saved while one is on its way out: the keeper is asked before it is copied

_stores: Dict[str, "RayStateStore"] = {}
Found = Optional[Tuple[SnapshotMeta, Dict[str, Any], Dict[str, Any]]]


def install(env: Mapping[str, str]) -> None:
    """Make the run's store this process's (the same one across attempts: it keeps the own copies)."""
    text = env.get(STATE_SETTINGS_VAR)
    if not text:
        return
    settings = json.loads(text)
    store = _stores.setdefault(settings["name"], RayStateStore(settings))
    state.set_store(store, observe=state_waited)
    store.load_ahead(int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")))


def flush() -> None:
    """Wait until the step being sent has reached its holders (a call ends only then)."""
    for store in _stores.values():
        store.flush()


@dataclass
class _Sending:
    """One step on its way to the holders: the parts already in the object store
    (``refs``), those put in the background (``staged``: a device part's host
    copy, or a ``Deferred`` part reading the optimizer's live tensors), the copies each needs."""

    rank: int
    step: int
    meta_json: str
    world: int
    world_size: int
    refs: Dict[str, Any] = field(default_factory=dict)
    staged: Dict[str, Any] = field(default_factory=dict)
    copies: Dict[str, int] = field(default_factory=dict)
    room: Optional[Snapshot] = None  # the step whose sizes are checked against the object store
    copied: threading.Event = field(default_factory=threading.Event)  # the optimizer's live tensors are read
    checked: threading.Event = field(default_factory=threading.Event)  # and their versions compared, by the loop's thread
    changed: int = 0  # how many of them had changed
    stager: Optional[threading.Thread] = None  # a queued step's background puts, begun at its save
    stage_error: Optional[BaseException] = None
    put: bool = False  # the staged parts are in the object store (or failed to be: ``stage_error``)
    answer: Any = None  # the keeper's word: whether the ranks send this step (``StateKeeper.want``)


class RayStateStore(StateStore):
    def __init__(self, settings: Mapping[str, Any]) -> None:
        self._settings = dict(settings)
        self._keeper: Any = None
        self._holders: List[Tuple[str, Any]] = []
        self._dead: Set[int] = set()
        self._own: Dict[int, Dict[str, Any]] = {}  # step -> part key -> this rank's object (a survivor loads it)
        self._lock = threading.Lock()
        self._sending: Optional[threading.Thread] = None
        self._busy_world: Optional[int] = None  # the attempt whose steps the sender is sending (None: idle)
        self._queue: Deque[_Sending] = collections.deque()  # steps saved and not yet sent or let go, oldest first
        self._newest: Optional[_Sending] = None  # the newest step saved
        self._unsent: Optional[_Sending] = None  # the newest step saved, when the keeper had it not sent
        self._staging: Dict[str, Any] = {}  # part key -> the host copy of a part with device tensors, reused
        self._room_checked = False  # whether the object store's room was checked (at the first save)
        self._idle = threading.Event()  # every step saved is committed or given up (a call may end; ``wait_committed``)
        self._idle.set()
        self._committed: Optional[int] = None  # the newest step known committed (loaded, or sent)
        self._latest: Optional[_Sending] = None  # the step whose copy an optimizer step waits for
        self._defer = True  # off once a guarded tensor was changed while being copied
        self._keeper_answers = False  # the keeper has answered: a busy rank may ask it before copying
        self._ahead: Optional[_LoadAhead] = None
        self._pace: Tuple[int, SendPace] = (-1, SendPace(None))  # (attempt, how often it sends)
        self._sent_since_save = False  # a step was sent since the last save began (the pace's measure; under the lock)

    # -- save -------------------------------------------------------------------

    def save(self, snapshot: Snapshot) -> None:
        """Copy the step (the loop waits for that only) and send it in the background.
        A save never waits for the step before it. Whether a step is sent is the
        keeper's word (``StateKeeper.want``): the first rank to ask decides for all,
        and it is sent when that rank had nothing on its way out, so every rank
        sends the same steps and a new one goes out as soon as the last is committed."""
        self.wait_copied()  # the previous step's copy is checked: its sender goes on to commit it
        self._drop_ahead()  # saved before loading: the step it read may be superseded
        world, now = _world(), time.monotonic()
        with self._lock:
            idle = self._busy_world != world  # nothing of this attempt on its way out
            busy, self._sent_since_save = self._sent_since_save or not idle, not idle
        pace = self._pace_of(world)
        pace.saved(now, busy)
        free = idle and pace.due(now)  # (sending more often would cost the loop more than its budget)
        if free:
            pace.sending(now)
            with self._lock:
                self._sent_since_save = True  # (its copy, next, is the send's too)
        if idle and self._sending is not None and self._sending.is_alive():
            self._staging = {}  # a dead attempt's step may still read it: fresh memory
        sending = _Sending(snapshot.rank, snapshot.step, snapshot.meta.to_json(), world, snapshot.world_size)
        sending.answer = self._keeper_handle(create=True).want.remote(world, snapshot.step, free)  # read by the sender
        # A big step saved while one is on its way out is seldom sent: asking costs less than its copy.
        asked = not free and self._keeper_answers and _state_bytes(snapshot) >= ASK_FIRST_BYTES
        watched = _watched(snapshot) if asked else None  # (while the keeper answers)
        if watched is not None and not _sent(sending):
            self._watch(watched, sending)
            return
        try:
            self._copy(snapshot, sending, fresh=not idle)
        except BaseException:
            self._drop(sending)  # (the object store is full, ...): no rank waits on this step's commit
            raise
        if not self._room_checked and snapshot.local_rank == 0:  # once per node, in the background (a GCS read)
            self._room_checked, sending.room = True, snapshot
        if not any(isinstance(part, Deferred) for part in sending.staged.values()):
            sending.copied.set()
            sending.checked.set()
        if not idle and sending.staged:  # its puts begin now: the optimizer's next step waits for them, not for the sender
            sending.stager = threading.Thread(target=self._stage_apart, args=(sending,), daemon=True, name="raydist-state-stage")
            sending.stager.start()
        self._latest = sending
        with self._lock:
            start = self._busy_world != world  # (the sender may have finished meanwhile)
            if start:
                self._busy_world = world
                self._queue.clear()  # a dead attempt's steps are not sent
            if self._unsent is not None:  # a newer step than the one not sent: that one is let go
                self._forget(self._unsent)
                self._unsent = None
            self._settle_unwanted()
            self._queue.append(sending)
            self._newest = sending
            self._own[snapshot.step] = sending.refs
            self._idle.clear()
        if start:
            self._start_sender(world)

    def _watch(self, watched: Tuple[Dict[str, Deferred], Dict[str, int]], sending: "_Sending") -> None:
        """A step not sent, and not copied: its tensors watched (their versions) as the
        newest step saved, in case every rank asks for it again before the next save
        (``_settle``)."""
        sending.staged, sending.copies = dict(watched[0]), dict(watched[1])
        with self._lock:
            if self._unsent is not None:
                self._forget(self._unsent)
            self._unsent = sending  # (unchecked: its tensors are read only if it is asked for)
            self._newest = sending

    def _pace_of(self, world: int) -> SendPace:
        """This attempt's pace (a new world's steps may take another time)."""
        if self._pace[0] != world:
            self._pace = (world, SendPace(self._settings.get("overhead")))
        return self._pace[1]

    def _start_sender(self, world: int) -> None:
        self._sending = threading.Thread(target=self._send_all, args=(world,), daemon=True, name="raydist-state-send")
        self._sending.start()

    def _settle_unwanted(self) -> None:
        """Under the lock: let go of the queued steps the keeper has said are not sent (their memory)."""
        answered = [s for s in self._queue if ray.wait([s.answer], timeout=0)[0]]
        for sending in [s for s in answered if not ray.get(s.answer)]:
            self._queue.remove(sending)
            self._forget(sending)

    def _forget(self, sending: "_Sending") -> None:
        """Under the lock: this rank keeps nothing of a step that is not sent."""
        if self._own.get(sending.step) is sending.refs:
            del self._own[sending.step]

    def _copy(self, snapshot: Snapshot, sending: "_Sending", fresh: bool) -> None:
        """The step's parts: in the object store, or staged for a put in the background.
        ``fresh``: a step is being sent, which may still read the reused host memory."""
        for key, states, count in _parts(snapshot):
            sending.copies[key] = count
            if on_device(states) and fresh:
                sending.staged[key] = host_copy(states, None)
            elif on_device(states):  # the loop waits for the device-to-host copy only, into memory reused
                sending.staged[key] = self._staging[key] = host_copy(states, self._staging.get(key))
            elif self._defer and (later := pack_later(states, snapshot.guarded)) is not None:
                sending.staged[key] = later  # the optimizer's tensors: put in the background, its next step waits
            else:  # the one copy: the live tensors' bytes straight into the object store (out of band)
                sending.refs[key] = ray.put(pack(states))

    def wait_committed(self, timeout: Optional[float]) -> Optional[int]:
        if timeout != 0:
            self._settle(timeout)
        return self._committed

    def flush(self) -> None:
        self._drop_ahead()  # a call that never loaded: its copy is not kept
        self._settle(FLUSH_TIMEOUT)

    def _settle(self, timeout: Optional[float]) -> None:
        """Wait until every step saved is committed or given up; where the newest one
        was not sent, ask for it once more (``StateKeeper.final``: sent once every
        rank has asked, as each does at the same point of its loop) and wait for it."""
        self._pace[1].waited()  # (the wait is no step: it would read as the cost of a send)
        self.wait_copied()  # the sender acknowledges a step once the loop checked the optimizer's copy
        if not self._idle.wait(timeout):
            return
        world = _world()
        with self._lock:
            last, self._unsent = self._unsent, None
            if last is None or last.world != world or self._busy_world is not None:
                return
        keeper = self._keeper_handle(create=True)
        if not last.checked.is_set():  # a step only watched: its tensors are read now, if unchanged since its save
            changed = sum(part.changed() for part in last.staged.values() if isinstance(part, Deferred))
            if changed:  # the others' asks end: it is not sent
                print(
                    f"raydist: rank {last.rank} could not keep step {last.step}: {changed} of its tensors changed in place "
                    "after save_state, before its copy was asked for",
                    file=sys.stderr,
                    flush=True,
                )
                self._drop(last)
                return
            last.copied.set()
            last.checked.set()
        with self._lock:
            last.answer = keeper.final.remote(world, last.rank, last.step, last.world_size)
            self._queue.append(last)
            self._own[last.step] = last.refs
            self._busy_world = world
            self._idle.clear()
        self._start_sender(world)
        self._idle.wait(timeout)

    def wait_copied(self) -> None:
        """On the loop's thread: once the copy of the optimizer's tensors is made, whether
        they changed meanwhile. Here any in-place op this thread began has ended (its
        version counter moves only then), so none is missed."""
        latest = self._latest
        if latest is None or latest.checked.is_set():
            return
        latest.copied.wait()
        latest.changed = sum(part.changed() for part in latest.staged.values() if isinstance(part, Deferred))
        latest.staged = {}  # the live tensors are not read any more
        if latest.changed and latest.world == _world():  # (not a dead attempt's step)
            self._defer = False  # the step is not kept (its sender drops it, if it is sent); later saves copy before returning
            print(
                f"raydist: rank {latest.rank} could not keep step {latest.step}: {ChangedWhileCopied(latest.changed)}",
                file=sys.stderr,
                flush=True,
            )
        latest.checked.set()

    def _stage(self, sending: "_Sending") -> None:
        """The staged parts into the object store: the optimizer's tensors first (its next step waits for them)."""
        parts = dict(sending.staged)
        try:
            staged = {key: ray.put(part.packed) for key, part in parts.items() if isinstance(part, Deferred)}
        finally:
            sending.copied.set()
        staged.update({key: ray.put(pack(part)) for key, part in parts.items() if key not in staged})
        del parts
        with self._lock:
            sending.refs.update(staged)  # this step's own objects: the staging memory is the next step's

    def _stage_apart(self, sending: "_Sending") -> None:
        try:
            self._stage(sending)
        except BaseException as error:  # noqa: BLE001 - raised by its sender, which drops the step
            sending.stage_error = error
        finally:
            sending.put = True

    def _send_all(self, world: int) -> None:
        """The sender of attempt ``world``: the steps saved, oldest first, each sent
        if the keeper says so; it ends when none is left (or a newer attempt's took over)."""
        while True:
            with self._lock:
                if self._busy_world != world:
                    return
                if not self._queue:
                    self._busy_world = None
                    self._idle.set()
                    return
                sending = self._queue.popleft()
            if self._wanted(sending):
                with self._lock:
                    self._sent_since_save = True
                self._send(sending)
                continue
            with self._lock:  # not sent: kept while it is the newest step saved (a flush may ask for it)
                if self._newest is sending and self._busy_world == world:
                    self._unsent = sending
                else:
                    self._forget(sending)

    def _wanted(self, sending: "_Sending") -> bool:
        """Whether the keeper has this step sent; its staged parts put first (the optimizer waits for them)."""
        if sending.stager is not None:
            sending.stager.join()
        elif not sending.put:
            self._stage_apart(sending)
        try:
            wanted = bool(ray.get(sending.answer))
            self._keeper_answers = True
            return wanted
        except Exception as error:  # noqa: BLE001 - sent anyway: the send fails and drops the step, saying why
            sending.stage_error = sending.stage_error or error
            return True

    def _send(self, sending: "_Sending") -> None:
        rank, step, started = sending.rank, sending.step, time.time()
        try:
            if sending.stage_error is not None:  # (staged before the keeper was asked: ``_wanted``)
                raise sending.stage_error
            if sending.room is not None:
                _check_room(sending.room, {key: tensor_bytes(states) for key, states, _ in _parts(sending.room)})
            keeper = self._keeper_handle(create=True)
            holders = self._holder_list()
            locations = {key: _hand_over(holders, self._dead, step, key, ref, sending.copies[key]) for key, ref in sending.refs.items()}
            sending.checked.wait()  # by the loop's thread: its next optimizer step, save_state, load_state or the call's end
            if sending.changed:
                raise ChangedWhileCopied(sending.changed)
            committed = ray.get(keeper.ack.remote(sending.world, rank, sending.meta_json, locations))
            now = time.time()
            SPANS.add(f"step {step} copied", "state", started, now, step=step, committed=committed)
            if committed:
                self._committed = max(step, self._committed if self._committed is not None else step)
                SPANS.add(f"step {step} committed", "state", now, now, step=step)  # a moment
                FIGURES_HERE.record("raydist_committed_step", step, {"rank": str(rank)})
            with self._lock:  # the committed step is the oldest worth keeping; one never committed is not kept
                for other in [s for s in self._own if s < step] if committed else []:
                    del self._own[other]
                if not committed and self._own.get(step) is sending.refs:
                    del self._own[step]
        except Exception as error:  # noqa: BLE001 - the step is dropped; training goes on
            if not isinstance(error, ChangedWhileCopied):  # (said when it was seen)
                print(f"raydist: rank {rank} could not keep step {step}: {error}", file=sys.stderr, flush=True)
            self._drop(sending)

    def _drop(self, sending: "_Sending") -> None:
        """Tell the keeper this rank cannot keep the step: the ranks waiting on its commit go on."""
        with self._lock:  # never loaded: the committed step stays the one kept
            if self._own.get(sending.step) is sending.refs:  # (not a newer attempt's save of the same step)
                del self._own[sending.step]
        sending.refs = {}
        try:
            ray.get(self._keeper_handle(create=True).drop.remote(sending.world, sending.step))
        except Exception as error:  # noqa: BLE001 - the keeper itself is gone: the attempt is ending
            print(f"raydist: rank {sending.rank} could not drop step {sending.step}: {error!r}", file=sys.stderr, flush=True)

    # -- load -------------------------------------------------------------------

    def load_ahead(self, rank: int, world_size: int) -> None:
        """In a restarted attempt, begin ``load`` now, in the background (``load`` takes its result)."""
        self._drop_ahead()
        if _world() > 0:
            self._ahead = _LoadAhead(self._load, rank, world_size)

    def _drop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.wait()

    def load(self, rank: int, world_size: int) -> Found:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.fits(rank, world_size):
            # No rank of this attempt can have committed a newer step: it needs this rank's save.
            return ahead.take(lambda: self._load(rank, world_size, create=bool(self._settings.get("state_dir"))))
        if _world() == 0 and not self._settings.get("state_dir") and not self._own:
            # Nothing can be committed before this rank's first save. The keeper is started
            # now, not by that save: its start overlaps the loop's first steps instead of
            # holding up the second save (which waits for the first to be committed).
            self._keeper_handle(create=True)
            return None
        return self._load(rank, world_size, create=bool(self._settings.get("state_dir")))

    def _load(self, rank: int, world_size: int, create: bool) -> Found:
        keeper = self._keeper_handle(create=create)
        if keeper is None:
            return None
        found = ray.get(keeper.committed.remote(_world()))
        if found is None:
            return None
        meta, locations = SnapshotMeta.from_json(found[0]), found[1]
        check_world(meta, world_size)
        self._committed = meta.step
        with self._lock:
            mine = dict(self._own.get(meta.step, {}))
        shared = _read_part(keeper, self._holder_list, meta.step, SHARED, mine, locations.get(SHARED, [])) if meta.shared else {}
        own = _read_part(keeper, self._holder_list, meta.step, rank_key(rank), mine, locations.get(rank_key(rank), [])) if meta.own else {}
        return meta, shared, own

    # -- the keeper -------------------------------------------------------------

    def _keeper_handle(self, create: bool) -> Any:
        if self._keeper is None:
            name = self._settings["name"]
            try:
                self._keeper = ray.get_actor(name, namespace=STATE_NAMESPACE)
            except ValueError:
                if not create:
                    return None
                node = self._settings["driver_node"]  # none through Ray Client: the keeper goes where Ray puts it
                placement = NodeAffinitySchedulingStrategy(node, soft=False) if node else "DEFAULT"
                self._keeper = (
                    keeper_actor()
                    .options(name=name, namespace=STATE_NAMESPACE, lifetime="detached", get_if_exists=True, scheduling_strategy=placement)
                    .remote(True, self._settings.get("state_dir"), int(self._settings.get("keep", 2)))
                )
                # Not its start (that overlaps the first steps): only that this process's death can no longer cancel it.
                wait_actor_handed_over(self._keeper, KEEPER_HANDOVER_S)
        return self._keeper

    def _holder_list(self) -> List[Tuple[str, Any]]:
        if not self._holders:
            self._holders = ray.get(self._keeper_handle(create=True).holders.remote())
        return self._holders


def _hand_over(holders: List[Tuple[str, Any]], dead: Set[int], step: int, key: str, ref: Any, copies: int) -> List[int]:
    """Hand a part to ``copies`` holders, own node first, then another node: each
    keeps the object's memory (the one here costs no copy; a raydist restart may
    kill a rank stuck beside a lost node, so its own copy is not counted). ``dead``:
    holders found gone (their nodes), skipped from then on."""
    here = ray.get_runtime_context().get_node_id()
    local = [i for i, (node, _) in enumerate(holders) if node == here]
    others = [i for i, (node, _) in enumerate(holders) if node != here]
    order = [i for i in local[:1] + others + local[1:] if i not in dead]
    kept: List[int] = []
    while len(kept) < copies and order:
        batch, order = order[: copies - len(kept)], order[copies - len(kept) :]
        for index, call in [(i, holders[i][1].store.remote(step, key, [ref])) for i in batch]:  # a list: read by the holder
            try:
                ray.get(call)
                kept.append(index)
            except ray.exceptions.RayActorError:
                dead.add(index)  # its node is gone: the next holder takes the copy
    if not kept:
        raise RuntimeError(f"no holder took step {step} ({key})")
    return kept


def _read_part(
    keeper: Any, holder_list: Callable[[], List[Tuple[str, Any]]], step: int, key: str, mine: Dict[str, Any], where: List[int]
) -> Dict[str, Any]:
    """A survivor's own object (on its node), else the first holder that still has it (own node first)."""
    if key in mine:
        return unpack(ray.get(mine[key]))  # its own object, on its node
    if DURABLE in where:
        return from_bytes(ray.get(keeper.fetch_durable.remote(step, key)))
    holders = holder_list()
    here = ray.get_runtime_context().get_node_id()
    for index in sorted(where, key=lambda i: holders[i][0] != here if i < len(holders) else True):
        try:
            packed = ray.get(holders[index][1].fetch.remote(step, key))
        except ray.exceptions.RayActorError:
            continue
        if packed is not None:
            return unpack(packed)
    raise RuntimeError(f"load_state: no holder keeps step {step} ({key}) any more: the nodes of both copies are gone")


class _LoadAhead:
    """A load begun in the background for (attempt, rank, world size). Without
    a keeper yet it finds nothing and leaves the load to ``load_state``
    (which creates one when there is a ``state_dir`` to read)."""

    def __init__(self, load: Callable[[int, int, bool], Found], rank: int, world_size: int) -> None:
        self._key = (_world(), rank, world_size)
        self._found: Found = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(load, rank, world_size), daemon=True, name="raydist-state-load")
        self._thread.start()

    def _run(self, load: Callable[[int, int, bool], Found], rank: int, world_size: int) -> None:
        try:
            self._found = load(rank, world_size, False)
        except BaseException as error:  # noqa: BLE001 - raised by load_state, as its own load would
            self._error = error

    def fits(self, rank: int, world_size: int) -> bool:
        return self._key == (_world(), rank, world_size)

    def wait(self) -> None:
        self._thread.join()

    def take(self, again: Callable[[], Found]) -> Found:
        """The step it loaded; ``again`` where it found nothing (no keeper, or none committed)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._found if self._found is not None else again()


class ChangedWhileCopied(RuntimeError):
    """A tensor copied in the background was changed in place before the copy was made."""

    def __init__(self, count: int) -> None:
        super().__init__(
            f"{count} of its optimizer's tensors changed in place while save_state copied them in the "
            "background (outside optimizer.step(), which waits for the copy). save_state copies before returning from now on"
        )


def _parts(snapshot: Snapshot) -> List[Tuple[str, Dict[str, Any], int]]:
    """(key, states, copies) this rank keeps: its own part, on two holders; the
    shared part once per node (local rank 0), on its node's holder: every
    node has it, so nothing crosses nodes (two holders on a one-node cluster)."""
    parts = [(rank_key(snapshot.rank), snapshot.own, 2)] if snapshot.own else []
    if snapshot.shared and snapshot.local_rank == 0:
        parts.append((SHARED, snapshot.shared, 1 if snapshot.local_world_size < snapshot.world_size else 2))
    return parts


def _sent(sending: "_Sending") -> bool:
    """The keeper's word on the step, waited for (True where the keeper cannot say: it is copied)."""
    try:
        return bool(ray.get(sending.answer))
    except Exception:  # noqa: BLE001 - the keeper gone (its node lost): the attempt is ending, the copy does no harm
        return True


def _watched(snapshot: Snapshot) -> Optional[Tuple[Dict[str, Deferred], Dict[str, int]]]:
    """The step's parts packed to be read later, if asked for (their tensors watched),
    and the copies each needs; None where a part cannot be read later (a tensor on a
    device, a subclass, no tensor at all): the step is copied then, as any other."""
    parts: Dict[str, Deferred] = {}
    copies: Dict[str, int] = {}
    for key, states, count in _parts(snapshot):
        later = pack_later(states, _pointers(states))
        if later is None:
            return None
        parts[key], copies[key] = later, count
    return parts, copies


def _state_bytes(snapshot: Snapshot) -> int:
    return sum(tensor_bytes(states) for _, states, _ in _parts(snapshot))


def _pointers(states: Any) -> FrozenSet[int]:
    """The storages of every tensor in ``states`` (all watched: read later)."""
    return frozenset(p for p in (storage_pointer(t) for t in tensors_of(states)) if p is not None)


def _world() -> int:
    """The attempt this rank runs: only the newest one's acknowledgements count."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _check_room(snapshot: Snapshot, sizes: Dict[str, int]) -> None:
    """Says when two steps will not fit this node's object store (it would spill to disk)."""
    try:
        here = ray.get_runtime_context().get_node_id()
        node: Dict[str, Any] = next((n for n in ray.nodes() if n.get("NodeID") == here), {})
        capacity = float(node.get("Resources", {}).get("object_store_memory", 0))
    except Exception:  # noqa: BLE001 - only advice: the save goes on regardless
        return
    own = sum(size for key, size in sizes.items() if key != SHARED)
    multi = snapshot.local_world_size < snapshot.world_size
    line = store_room_warning(own, sizes.get(SHARED, 0), snapshot.local_world_size, multi, capacity)
    if line:
        print(line, file=sys.stderr, flush=True)
