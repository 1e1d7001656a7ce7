"""raydist's own cost per rank, on the in-memory fake cluster (no Ray).

``raydist.testing.fake.FakeCluster`` stands in for Ray: its workers are
objects in this process and its clock is virtual, so a world of 4,096 ranks
starts, calls, fails and restarts in well under a second of real time. What
is real is the CPU work of raydist's driver code, and that is what this
measures, phase by phase, at 8, 64, 512 and 4,096 ranks on 1 .. 512 nodes
of 8 slots each (plus a node with room for a spare and for a lost node's 8
workers, where the fake re-places a lost node's bundles as Ray does):

* ``start``: ``WorkerGroup(...)`` until its world is ready (layout, placement,
  each rank's environment and set-up);
* ``call``: one ``group.run`` of a small function (small arguments and
  values): fan-out and gather; the median of several;
* ``rank failure``: a call in which rank 1 dies, until it raises with the
  new world ready (the failure report, the survivors settled, a spare in
  the dead rank's place, the world initialised again);
* ``restart plan``: ``plan_restart`` alone for that failure;
* ``node loss``: a call during which the last node is lost, until the new
  world is ready;
* ``state step (per-rank)`` / ``state step (shared)``: the state keeper's
  bookkeeping for one ``save_state`` step (``StateKeeper.ack`` of every rank,
  its ``CommitLog``, the waiters released at the commit), with a part per
  rank, or one shared part per node; the parts' bytes travel through Ray's
  object store, which is not simulated;
* ``straggler poll``: one ``StragglerWatch.poll`` over every rank's flight
  recorder (64 entries a rank, 20 of them new, made up beforehand);
* ``output routing``: every rank's 10 lines and its end-of-call marker
  through the driver's ``OutputRouter``, while the call waits for the
  markers (``GroupOutput.settle``); the median of several calls, also
  given as lines per second;
* ``shutdown``: ``group.shutdown()``.

Each phase's wall time (``time.perf_counter``) and the driver's CPU time
(``time.process_time``, every thread) are medians over ``reps`` rounds; peak
memory (``tracemalloc``, above what was allocated when the phase began) comes
from one more round with tracemalloc on, since tracing slows Python down.
Objects alive when a phase begins are frozen out of the garbage collector
until it ends (see ``FROZEN``).
The fake's own work (its workers running the function, its bookkeeping of
calls) is part of the ``start``, ``call`` and restart figures: they are an
upper bound on raydist's.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import statistics
import threading
import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

SIZES = (8, 64, 512, 4096)
SLOTS_PER_NODE = 8
SPARE_NODE = "node-spare"
LINES_PER_RANK = 10  # output routing: each rank's lines in one call
RECORDER_ENTRIES = 64  # straggler poll: what one rank's flight recorder holds
NEW_PER_POLL = 20  # of which this many are new since the last poll
PHASES = (
    "start",
    "call",
    "rank failure",
    "restart plan",
    "node loss",
    "state step (per-rank)",
    "state step (shared)",
    "straggler poll",
    "output routing",
    "shutdown",
)


@dataclass
class Cost:
    seconds: float
    cpu_seconds: float
    peak_bytes: int = 0


@dataclass
class SimResult:
    """Every phase's cost at every size, and the extras the tables print."""

    sizes: Tuple[int, ...]
    reps: int
    costs: Dict[str, Dict[int, Cost]] = field(default_factory=dict)
    output_lines_per_s: Dict[int, float] = field(default_factory=dict)
    wall_s: float = 0.0

    def seconds(self, phase: str) -> List[float]:
        return [self.costs[phase][n].seconds for n in self.sizes]

    def exponent(self, phase: str, low: int = 512, high: int = 4096) -> Optional[float]:
        """The log-log slope of the phase's time between ``low`` and ``high`` ranks."""
        found = self.costs.get(phase, {})
        if low not in found or high not in found:
            return None
        return growth_exponent([low, high], [found[low].seconds, found[high].seconds])

    def exponent_all(self, phase: str) -> Optional[float]:
        return growth_exponent(list(self.sizes), self.seconds(phase))

    def call_us_per_rank(self, n: int = 4096) -> Optional[float]:
        cost = self.costs.get("call", {}).get(n)
        return None if cost is None else cost.seconds / n * 1e6


def growth_exponent(ranks: Sequence[int], seconds: Sequence[float]) -> Optional[float]:
    """Least-squares slope of log(seconds) against log(ranks) (two points: the slope between them)."""
    points = [(math.log(n), math.log(s)) for n, s in zip(ranks, seconds) if s > 0]
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


# -- measuring ------------------------------------------------------------------------


# Objects that exist when a phase begins are frozen (``gc.freeze``) until it
# ends: the collector's passes over what the phase allocates are the phase's,
# but a full collection that happens to fall in it, whose cost is set by all the
# process holds (the fake cluster's objects, the benchmark's, a user's), is not.
# Unfrozen, one such pass (20-35 ms over the ~110,000 objects of a 4,096-rank
# run) lands in the start and restart phases at 4,096 ranks and in none at 512.
FROZEN = True


class Meter:
    """Measures phases: wall and CPU time, and with ``memory`` the peak traced above the start."""

    def __init__(self, memory: bool):
        self.memory = memory

    @contextlib.contextmanager
    def phase(self, into: List[Cost]) -> Iterator[None]:
        if FROZEN:
            gc.freeze()  # what exists already is not the phase's to collect (its garbage too: see _round)
        else:
            gc.collect()
        base = 0
        if self.memory:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            cost = Cost(time.perf_counter() - wall, time.process_time() - cpu)
            if FROZEN:
                gc.unfreeze()
        if self.memory:
            cost.peak_bytes = max(0, tracemalloc.get_traced_memory()[1] - base)
        into.append(cost)


Samples = Dict[str, List[Cost]]


def _nodes(n: int) -> Dict[str, Dict[str, float]]:
    nodes: Dict[str, Dict[str, float]] = {f"node-{i}": {"CPU": SLOTS_PER_NODE} for i in range(max(1, n // SLOTS_PER_NODE))}
    nodes[SPARE_NODE] = {"CPU": 1 + SLOTS_PER_NODE}  # the spare, and a lost node's workers placed again
    return nodes


def echo(value: int) -> int:
    return value


def _group(n: int, faults: Sequence[Any]) -> Tuple[Any, Any]:
    from raydist.config import RunConfig
    from raydist.testing.fake import FakeCluster

    cluster = FakeCluster(_nodes(n), faults)
    config = RunConfig(num_workers=n, flight_recorder=False, max_restarts=1, spare_workers=1)
    return cluster, config


def measure_group(n: int, calls: int, meter: Meter, samples: Samples) -> None:
    """start, call (each of ``calls``), rank failure, shutdown; then node loss on a second group."""
    from raydist.errors import WorkerGroupError
    from raydist.pool.driver.group import WorkerGroup
    from raydist.testing.fake import Fault

    cluster, config = _group(n, [Fault("execute", "die", who=1, nth=calls)])
    with meter.phase(samples.setdefault("start", [])):
        group = WorkerGroup(config=config, cluster=cluster)
    times: List[Cost] = []
    for _ in range(calls):
        with meter.phase(times):
            values = group.run(echo, (7,))
        assert len(values) == n
    samples.setdefault("call", []).append(_median_cost(times))
    with meter.phase(samples.setdefault("rank failure", [])):
        try:
            group.run(echo, (7,))
            raise AssertionError("rank 1 did not die")
        except WorkerGroupError as failure:
            assert failure.restarted_in_place, failure
    assert group.num_workers == n and len(group.run(echo, (7,))) == n
    with meter.phase(samples.setdefault("shutdown", [])):
        group.shutdown()
    assert cluster.leftovers() == [], cluster.leftovers()

    cluster, config = _group(n, [Fault("execute", "lose-node", who=n - 1, nth=1)])
    group = WorkerGroup(config=config, cluster=cluster)
    group.run(echo, (7,))
    with meter.phase(samples.setdefault("node loss", [])):
        try:
            group.run(echo, (7,))
            raise AssertionError("no node was lost")
        except WorkerGroupError as failure:
            assert failure.restarted_in_place, failure
    assert group.num_workers == n and len(group.run(echo, (7,))) == n
    group.shutdown()
    assert cluster.leftovers() == [], cluster.leftovers()


def _median_cost(costs: Sequence[Cost]) -> Cost:
    return Cost(
        statistics.median(c.seconds for c in costs),
        statistics.median(c.cpu_seconds for c in costs),
        max(c.peak_bytes for c in costs),
    )


def _workers(n: int) -> List[Any]:
    """A world of ``n`` ranks, 8 to a node, ranked as the driver ranks them."""
    from raydist.pool.records import Placement
    from raydist.pool.rules.layout import assign_ranks

    placements = [
        Placement(i, f"node-{i // SLOTS_PER_NODE}", f"10.0.{i // 2048}.{i // SLOTS_PER_NODE % 256}", 10_000 + i, (), 0) for i in range(n)
    ]
    return assign_ranks(placements, None)


def measure_restart_plan(n: int, repeats: int, meter: Meter, samples: Samples) -> None:
    from raydist.pool.rules.restart_plan import Seat, plan_restart

    workers = _workers(n)
    times: List[Cost] = []
    for _ in range(repeats):
        with meter.phase(times):
            plan = plan_restart(
                workers,
                dead={1},
                stuck=(),
                leaving_nodes=set(),
                spares=[Seat(n, SPARE_NODE)],
                free_seats=[Seat(1, workers[1].node_id)],
                sizes=(n, n),
            )
        assert plan.size == n and plan.spares == (0,) and len(plan.kept) == n - 1
    samples.setdefault("restart plan", []).append(_median_cost(times))


def measure_state_step(n: int, shared: bool, meter: Meter, samples: Samples) -> None:
    """One step's acknowledgements from every rank through the keeper's bookkeeping."""
    from raydist.core.state_files import SHARED, SnapshotMeta, rank_key
    from raydist.pool.worker.state_keeper import StateKeeper

    nodes = max(1, n // SLOTS_PER_NODE)  # holder 0: the primary, on the driver's node; holder 1 + i on node i

    def locations(rank: int) -> Dict[str, List[int]]:
        node = rank // SLOTS_PER_NODE
        where = sorted({1 + node, 1 + (node + 1) % nodes})  # its node's holder, and another node's
        if not shared:
            return {rank_key(rank): where}
        return {SHARED: where} if rank % SLOTS_PER_NODE == 0 else {}

    acks = [locations(rank) for rank in range(n)]

    async def step(keeper: Any, number: int) -> None:
        meta = SnapshotMeta(number, n, ("model",) if shared else (), () if shared else ("model",)).to_json()
        done = await asyncio.gather(*(keeper.ack(0, rank, meta, acks[rank]) for rank in range(n)))
        assert all(done)

    async def steps() -> None:
        keeper = StateKeeper(primary=False)
        await step(keeper, 1)  # warm: the first commit
        with meter.phase(samples.setdefault("state step (shared)" if shared else "state step (per-rank)", [])):
            await step(keeper, 2)

    asyncio.run(steps())


class _Agents:
    """What ``StragglerWatch`` asks: every rank's flight recorder (made up before the poll)."""

    connected = True

    def __init__(self) -> None:
        self.reports: Dict[int, List[Any]] = {}

    def ask(self, workers: Sequence[Any], ranks: Sequence[int], what: str, timeout: float, start_missing: bool) -> Dict[int, Any]:
        assert what == "collectives"
        return self.reports


class _Clock:
    """All a poll asks of the cluster: the time, when it names a straggler."""

    def monotonic(self) -> float:
        return time.monotonic()


class _Recorders:
    """Every rank's last ``RECORDER_ENTRIES`` all_reduces as its agent would report them,
    rank ``late`` 50 ms behind, the others a few microseconds apart. Ranks with
    the same timings share their entries (made once), so that making the
    reports costs next to nothing beside the poll."""

    STEP_NS = 60_000_000
    KINDS = 7  # distinct on-time timings

    def __init__(self, n: int, late: int):
        self.n, self.late = n, late
        self._entries: Dict[Tuple[int, int], Any] = {}

    def _entry(self, kind: int, seq: int) -> Any:
        from raydist.pool.records import CollectiveEntry

        key = (kind, seq)
        if key not in self._entries:
            delay = 50_000_000 if kind == self.KINDS else kind * 1000
            self._entries[key] = CollectiveEntry("0", seq, "all_reduce", ((1024,),), ("float32",), seq * self.STEP_NS + delay, True)
        return self._entries[key]

    def up_to(self, last_seq: int, entries: int = RECORDER_ENTRIES) -> Dict[int, List[Any]]:
        seqs = range(max(1, last_seq - entries + 1), last_seq + 1)
        kinds = {kind: [self._entry(kind, seq) for seq in seqs] for kind in range(self.KINDS + 1)}
        return {rank: kinds[self.KINDS if rank == self.late else rank % self.KINDS] for rank in range(self.n)}


def measure_straggler_poll(n: int, meter: Meter, samples: Samples) -> None:
    from raydist.pool.driver.stragglers import KEPT_ENTRIES, StragglerWatch

    agents, recorders = _Agents(), _Recorders(n, late=3)
    watch = StragglerWatch(_workers(n), agents, cluster=_Clock())  # type: ignore[arg-type]
    agents.reports = recorders.up_to(RECORDER_ENTRIES + KEPT_ENTRIES, KEPT_ENTRIES)  # as after earlier polls: KEPT_ENTRIES a rank
    watch.poll()
    agents.reports = recorders.up_to(RECORDER_ENTRIES + KEPT_ENTRIES + NEW_PER_POLL)
    with meter.phase(samples.setdefault("straggler poll", [])):
        found = watch.poll()
    assert [s.rank for s in found] == [3], found


class _Sink:
    """The console, for the routed lines (a terminal's speed is not raydist's)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _settle(output: Any, call: int, results: List[Any], settled: List[Any]) -> None:
    settled.append(output.settle(call, results))


def measure_output(n: int, repeats: int, meter: Meter, samples: Samples, rates: Dict[int, float]) -> None:
    """Every rank's lines and end-of-call marker through the router, while the
    call waits for the markers; the median of ``repeats`` calls."""
    from raydist.config import RunConfig
    from raydist.pool.driver.output import GroupOutput, OutputRouter
    from raydist.pool.rules.logs import rank_route
    from raydist.pool.worker.markers import Printed

    workers = _workers(n)
    router = OutputRouter()
    router._print = lambda data: None  # Ray's own printer: for lines of no rank
    config = RunConfig(num_workers=n)
    output = GroupOutput(workers, [rank_route(config, w.rank, w.local_rank, None, None) for w in workers], router)
    lines = [f"step {i} loss {0.5 / (i + 1):.4f} lr 0.001" for i in range(LINES_PER_RANK)]
    sink = _Sink()
    times: List[Cost] = []
    for call in range(1, repeats + 1):
        results = [Printed(None, call, (True, False)) for _ in workers]
        batches = [
            {"ip": w.node_ip, "pid": w.pid, "is_err": False, "localhost": "127.0.0.1", "lines": [*lines, f"{router.token} {call}"]}
            for w in workers
        ]
        settled: List[Any] = []
        waiter = threading.Thread(target=_settle, args=(output, call, results, settled), name="call-waits-for-output")
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), meter.phase(times):  # type: ignore[type-var]
            waiter.start()
            for batch in batches:
                router._handle(batch)
            waiter.join()
        assert settled and len(settled[0]) == n
    output.close()
    cost = _median_cost(times)
    samples.setdefault("output routing", []).append(cost)
    rates[n] = n * LINES_PER_RANK / cost.seconds


# -- the whole simulation -------------------------------------------------------------


@contextlib.contextmanager
def _quiet_raydist() -> Iterator[None]:
    """The restart lines raydist logs are the measured work's, not its output."""
    logger = logging.getLogger("raydist")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _round(n: int, calls: int, memory: bool, only: Optional[Sequence[str]] = None) -> Tuple[Samples, Dict[int, float]]:
    meter = Meter(memory)
    samples: Samples = {}
    rates: Dict[int, float] = {}
    wants = lambda *phases: only is None or any(p in only for p in phases)  # noqa: E731
    if wants("start", "call", "rank failure", "node loss", "shutdown"):
        measure_group(n, calls, meter, samples)
    if wants("restart plan"):
        measure_restart_plan(n, calls, meter, samples)
    if wants("state step (per-rank)"):
        measure_state_step(n, False, meter, samples)
    if wants("state step (shared)"):
        measure_state_step(n, True, meter, samples)
    if wants("straggler poll"):
        measure_straggler_poll(n, meter, samples)
    if wants("output routing"):
        measure_output(n, calls, meter, samples, rates)
    gc.collect()  # what the phases left, once a round (a collection per phase would cost more than most phases)
    return samples, rates


def simulate(
    sizes: Sequence[int] = SIZES,
    reps: int = 3,
    calls: int = 9,
    progress: Callable[[str], None] = lambda line: print(line, flush=True),
    only: Optional[Sequence[str]] = None,
) -> SimResult:
    """Every phase at every size: ``reps`` timed rounds (medians), then one with tracemalloc for the peaks."""
    result = SimResult(tuple(sizes), reps)
    started = time.perf_counter()
    with _quiet_raydist():
        for n in sizes:
            timed: Samples = {}
            rates: List[float] = []
            for _ in range(reps):
                samples, rate = _round(n, calls, memory=False, only=only)
                for phase, costs in samples.items():
                    timed.setdefault(phase, []).extend(costs)
                rates.extend(rate.values())
            tracemalloc.start()
            try:
                traced, _ = _round(n, calls, memory=True, only=only)
            finally:
                tracemalloc.stop()
            for phase, costs in timed.items():
                cost = Cost(statistics.median(c.seconds for c in costs), statistics.median(c.cpu_seconds for c in costs))
                cost.peak_bytes = max(c.peak_bytes for c in traced[phase])
                result.costs.setdefault(phase, {})[n] = cost
            if rates:
                result.output_lines_per_s[n] = statistics.median(rates)
            progress(f"  simulated {n} ranks ({max(1, n // SLOTS_PER_NODE)} nodes): {time.perf_counter() - started:.1f} s so far")
    result.wall_s = time.perf_counter() - started
    return result


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_peak(nbytes: int) -> str:
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{nbytes / 2**10:.0f} KiB"


def tables(result: SimResult) -> List[Tuple[str, List[str], List[List[Any]]]]:
    """(title, columns, rows) of the simulation's tables."""
    sizes = result.sizes
    phases = [p for p in PHASES if p in result.costs]
    big = max(sizes)
    low = 512 if 512 in sizes and big > 512 else None

    def exp(value: Optional[float]) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    wall = [
        [
            phase,
            *(fmt_time(result.costs[phase][n].seconds) for n in sizes),
            exp(result.exponent(phase, low, big) if low else None),
            exp(result.exponent_all(phase)),
        ]
        for phase in phases
    ]
    cpu = [[phase, *(fmt_time(result.costs[phase][n].cpu_seconds) for n in sizes)] for phase in phases]
    peak = [[phase, *(fmt_peak(result.costs[phase][n].peak_bytes) for n in sizes)] for phase in phases]
    per_rank = [[phase, *(f"{result.costs[phase][n].seconds / n * 1e6:.1f} us" for n in sizes)] for phase in phases]
    heads = [f"{n} ranks" for n in sizes]
    title = f"raydist's driver on the fake cluster ({SLOTS_PER_NODE} slots a node), median of {result.reps}"
    out = [
        (f"{title}: wall time per phase", ["phase", *heads, f"exponent {low}-{big}" if low else "exponent", "exponent (all)"], wall),
        (f"{title}: driver CPU time per phase", ["phase", *heads], cpu),
        ("Peak memory allocated per phase (tracemalloc, one more round)", ["phase", *heads], peak),
        ("Wall time per rank", ["phase", *heads], per_rank),
    ]
    if result.output_lines_per_s:
        out.append(
            (
                f"Output routing: {LINES_PER_RANK} lines and a marker per rank, while the call waits for the markers",
                ["", *heads],
                [["lines per second", *(f"{result.output_lines_per_s[n]:,.0f}" for n in sizes)]],
            )
        )
    return out


def targets(result: SimResult) -> List[List[Any]]:
    """The acceptance rows: every phase at most linear, a call's cost per rank, the plan's time."""
    rows: List[List[Any]] = []
    big = max(result.sizes)
    if 512 in result.sizes and big > 512:
        for phase in PHASES:
            if phase in result.costs:
                value = result.exponent(phase, 512, big)
                rows.append([f"{phase}: exponent 512-{big} <= 1.1", f"{value:.2f}", _verdict(value is not None and value <= 1.1)])
    call = result.call_us_per_rank(big)
    if call is not None:
        rows.append([f"call: driver cost per rank at {big} <= 50 us", f"{call:.1f} us", _verdict(call <= 50)])
    plan = result.costs.get("restart plan", {}).get(big)
    if plan is not None:
        rows.append([f"restart plan at {big} <= 100 ms", fmt_time(plan.seconds), _verdict(plan.seconds <= 0.1)])
    return rows


def _verdict(met: bool) -> str:
    return "MET" if met else "MISSED"


def as_json(result: SimResult) -> Dict[str, Any]:
    big = max(result.sizes)
    plan = result.costs.get("restart plan", {}).get(big)
    return {
        "simulated": {
            phase: {
                "ranks": list(result.sizes),
                "seconds": result.seconds(phase),
                "cpu_seconds": [result.costs[phase][n].cpu_seconds for n in result.sizes],
                "peak_bytes": [result.costs[phase][n].peak_bytes for n in result.sizes],
                "exponent": result.exponent(phase, 512, big) if 512 in result.sizes and big > 512 else result.exponent_all(phase),
                "exponent_all": result.exponent_all(phase),
            }
            for phase in PHASES
            if phase in result.costs
        },
        "call_us_per_rank_at_4096": result.call_us_per_rank(4096),
        "restart_plan_s_at_4096": None if plan is None or big != 4096 else plan.seconds,
        "output_lines_per_s": {str(n): rate for n, rate in result.output_lines_per_s.items()},
    }
