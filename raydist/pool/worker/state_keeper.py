"""The actors that hold training-state copies for a run, outside the ranks.

The primary keeper, on the driver's node, is created by the first rank that
calls ``load_state`` or ``save_state`` (detached, named after the run, so
that it outlives every rank and every attempt; the driver kills it when the
run ends) and creates one holder on every other node (a second one on a
one-node cluster). It holds copies itself, records commits
(``CommitLog``), tells the holders what they may drop, and writes committed
steps to ``state_dir`` in the background. A holder is created by the
primary, so it dies with it.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Dict, List, Optional, Tuple

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raydist.core import state_files
from raydist.core.state_files import SnapshotMeta
from raydist.pool.rules.commits import CommitLog, Locations, SendPlan
from raydist.pool.worker.state_owner import watch_driver
from raydist.pool.worker.state_parts import Packed, nbytes, packed_to_bytes

DURABLE = -1  # a location: the primary reads the part from state_dir


class StateKeeper:
    """Holds parts (step, key) -> packed state; the primary also commits and writes state_dir."""

    def __init__(self, primary: bool, state_dir: Optional[str] = None, keep: int = 2) -> None:
        self._parts: Dict[Tuple[int, str], Packed] = {}
        self._state_dir, self._keep = state_dir, keep
        self._log = CommitLog()
        self._waiters: Dict[Tuple[int, int], asyncio.Future] = {}
        self._plan = SendPlan()  # which steps the ranks send
        self._finals: Dict[Tuple[int, int], asyncio.Future] = {}  # (attempt, step) asked for again -> its answer
        self._holders: List[Tuple[str, Any]] = []
        self._durable_done: Optional[int] = None
        self._writer: Optional["asyncio.Task[None]"] = None
        if primary:
            self._holders = _start_holders()
            watch_driver()  # detached: it must still end when a killed driver cannot release it

    # -- every holder ---------------------------------------------------------

    async def store(self, step: int, key: str, wrapped: List[Any]) -> int:
        """Keep a rank's object: its arrays, read without a copy, keep the object's
        memory after the rank drops it or dies (copied here from another node)."""
        packed = await wrapped[0]
        self._parts[(step, key)] = packed
        return nbytes(packed)

    async def fetch(self, step: int, key: str) -> Optional[Packed]:
        return self._parts.get((step, key))

    async def prune(self, below: int) -> int:
        """Drop every part older than ``below`` (the newest committed step); the bytes kept."""
        for part in [p for p in self._parts if p[0] < below]:
            del self._parts[part]
        return await self.held_bytes()

    async def held_bytes(self) -> int:
        return sum(nbytes(packed) for packed in self._parts.values())

    # -- the primary ----------------------------------------------------------

    async def holders(self) -> List[Tuple[str, Any]]:
        return self._holders

    async def want(self, world: int, step: int, free: bool) -> bool:
        """Whether the ranks of attempt ``world`` send ``step``. The first rank to ask
        decides for all: it is sent when that rank had nothing on its way out
        (``free``). So every rank sends the same steps, none waits for another's, and
        a new step goes out as soon as the last one is committed or given up."""
        if not self._current(world, step):
            return False
        return self._plan.want(world, step, free)

    async def final(self, world: int, rank: int, step: int, world_size: int) -> bool:
        """Rank ``rank``'s newest step was not sent and it asks for it again (its call
        ends, or it waits for the commit): sent once every rank has asked (each does
        at the same point of its loop); False if the attempt ends first."""
        if not self._current(world, step):
            return False
        waiter = self._finals.setdefault((world, step), asyncio.get_running_loop().create_future())
        if self._plan.ask_again(world, rank, step, world_size) and not waiter.done():
            waiter.set_result(True)
            del self._finals[(world, step)]
        return bool(await waiter)

    def _current(self, world: int, step: int) -> bool:
        """A word from attempt ``world`` about ``step``: whether the step may still be committed."""
        current, aborted = self._log.enter(world)
        self._abort(aborted)
        done = self._log.committed
        if not current or self._log.was_dropped(step):  # (a rank could not keep it: never sent)
            return False
        return not (done is not None and done.world == world and step <= done.meta.step)

    async def ack(self, world: int, rank: int, meta_json: str, locations: Locations) -> bool:
        """Rank ``rank`` of attempt ``world`` holds its copies; returns once the step is committed (True) or aborted."""
        if world < self._log.world:  # a rank of a dead attempt
            return False
        meta = SnapshotMeta.from_json(meta_json)
        waiter = self._waiters.setdefault((world, meta.step), asyncio.get_running_loop().create_future())
        committed, aborted = self._log.ack(world, rank, meta, locations)
        self._abort(aborted)
        if committed:
            await self._committed(meta.step)
        elif self._log.world == world and self._log.was_dropped(meta.step):  # dropped before these copies came: let them go
            await self._forget_everywhere(meta.step)
        return bool(await waiter)

    async def committed(self, world: int) -> Optional[Tuple[str, Locations]]:
        """The newest committed step for a rank of attempt ``world``: (meta, where each part is)."""
        _, aborted = self._log.enter(world)
        self._abort(aborted)
        done = self._log.committed
        if done is not None:
            return done.meta.to_json(), done.locations
        if self._state_dir:  # nothing in memory yet: an earlier run's durable snapshot
            meta = await asyncio.to_thread(state_files.newest, self._state_dir)
            if meta is not None:
                return meta.to_json(), {key: [DURABLE] for key in meta.parts()}
        return None

    async def fetch_durable(self, step: int, key: str) -> bytes:
        assert self._state_dir
        return await asyncio.to_thread(state_files.read_part, self._state_dir, step, key)

    async def drop(self, world: int, step: int) -> None:
        """A rank of attempt ``world`` cannot keep ``step``: the ranks waiting on its commit go on,
        and the parts of it already held are let go (the holders keep the committed step and those being sent)."""
        aborted = self._log.drop(world, step)
        self._abort(aborted)
        if step in aborted:
            await self._forget_everywhere(step)

    async def _forget_everywhere(self, step: int) -> None:
        await self.forget(step)
        others = [holder.forget.remote(step) for _, holder in self._holders[1:]]
        await asyncio.gather(*others, return_exceptions=True)  # a holder of a lost node has nothing to let go

    async def forget(self, step: int) -> None:
        for part in [p for p in self._parts if p[0] == step]:
            del self._parts[part]

    async def abort(self, world: int) -> None:
        """Attempt ``world`` failed: its uncommitted steps never will be (ranks waiting on them go on)."""
        _, aborted = self._log.enter(world + 1)
        self._abort(aborted)

    async def close(self) -> None:
        """Finish writing the last committed step to state_dir, then stop the holders."""
        if self._writer is not None:
            await self._writer
        for _, holder in self._holders[1:]:
            ray.kill(holder)
        self._parts.clear()

    def _abort(self, steps: List[int]) -> None:
        for (world, step), waiter in list(self._waiters.items()):
            if world < self._log.world or step in steps:
                if not waiter.done():
                    waiter.set_result(False)
                del self._waiters[(world, step)]
        for (world, step), final in list(self._finals.items()):
            if world < self._log.world or step in steps:
                if not final.done():
                    final.set_result(False)
                del self._finals[(world, step)]
        self._plan.ended(self._log.world)

    async def _committed(self, step: int) -> None:
        """Holders drop older steps first, then the ranks waiting on this step go on."""
        await self.prune(step)
        others = [holder.prune.remote(step) for _, holder in self._holders[1:]]
        await asyncio.gather(*others, return_exceptions=True)  # a holder of a lost node has nothing to drop
        for (world, waited), waiter in list(self._waiters.items()):
            if waited <= step:
                if not waiter.done():
                    waiter.set_result(waited == step and world == self._log.world)
                del self._waiters[(world, waited)]
        self._plan.settled(self._log.world, step)
        for (world, asked), final in list(self._finals.items()):
            if asked <= step or world < self._log.world:  # older than the commit: never sent
                if not final.done():
                    final.set_result(False)
                del self._finals[(world, asked)]
        if self._state_dir and (self._writer is None or self._writer.done()):
            self._writer = asyncio.get_running_loop().create_task(self._write_durable())

    async def _write_durable(self) -> None:
        """Write the newest committed step (skipping any that were superseded meanwhile)."""
        while self._log.committed is not None and self._log.committed.meta.step != self._durable_done:
            done = self._log.committed
            parts: Dict[str, bytes] = {}
            for key, where in done.locations.items():
                packed = await _first_copy(self._holders, done.meta.step, key, where)
                if packed is None:
                    break
                parts[key] = await asyncio.to_thread(packed_to_bytes, packed)
            else:
                try:
                    await asyncio.to_thread(state_files.write_snapshot, self._state_dir or "", done.meta, parts, self._keep)
                except Exception as error:  # noqa: BLE001 - any storage's error (fsspec: credentials too): said, and the next commit tries again
                    print(
                        f"raydist: could not write step {done.meta.step} to {self._state_dir}: {type(error).__name__}: {error}",
                        file=sys.stderr,
                    )
            if self._log.committed is done:
                self._durable_done = done.meta.step


async def _first_copy(holders: List[Tuple[str, Any]], step: int, key: str, where: List[int]) -> Optional[Packed]:
    for index in where:
        if index == DURABLE or index >= len(holders):
            continue
        try:
            data = await holders[index][1].fetch.remote(step, key)
        except ray.exceptions.RayActorError:
            continue
        if data is not None:
            return data
    return None


def _start_holders() -> List[Tuple[str, Any]]:
    """Holder 0 is this actor; one more on every other alive node, or a second here on a one-node cluster."""
    context = ray.get_runtime_context()
    here = context.get_node_id()
    holders: List[Tuple[str, Any]] = [(here, context.current_actor)]
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    for node in nodes or [here]:
        holder = keeper_actor().options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(False)
        holders.append((node, holder))
    return holders


def keeper_actor() -> Any:
    """The actor class: no CPU of its own (it only holds bytes), never restarted."""
    return ray.remote(num_cpus=0, max_restarts=0)(StateKeeper)
