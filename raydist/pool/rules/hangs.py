"""Pure rules that read the ranks' flight recorders (their last collectives)
and say where the ranks diverged: which rank did not enter the collective the
others wait in, and which entered a different one at the same sequence number.

Python stacks of ranks that all sit in a C++ collective look alike; the
sequence numbers do not: ``ranks 0-1, 3: waiting in all_reduce #6 (float32
[1]); rank 2: last completed all_reduce #5, not in a collective``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from raydist.pool.records import CollectiveEntry
from raydist.pool.rules.text import ranks_text

Recorders = Mapping[int, Optional[Sequence[CollectiveEntry]]]
_Signature = Tuple[str, Tuple[Tuple[int, ...], ...], Tuple[str, ...]]


def tensors_text(entry: CollectiveEntry) -> str:
    """``float32 [1]``, ``float32 [4, 2], int64 [3]``; ``no tensors`` for a barrier-like op."""
    parts = [f"{dtype} [{', '.join(map(str, shape))}]" for dtype, shape in zip(entry.dtypes, entry.shapes)]
    return ", ".join(parts) or "no tensors"


def in_flight(entries: Sequence[CollectiveEntry]) -> Optional[CollectiveEntry]:
    """The collective a rank is in now: its latest one not yet completed."""
    waiting = [entry for entry in entries if not entry.completed]
    return max(waiting, key=lambda entry: entry.seq) if waiting else None


def rank_state(entries: Sequence[CollectiveEntry]) -> str:
    """Where one rank is on one process group, in words."""
    current = in_flight(entries)
    if current is not None:
        doing = "failed in" if current.failed else "waiting in"
        return f"{doing} {current.op} #{current.seq} ({tensors_text(current)})"
    done = [entry for entry in entries if entry.completed]
    if not done:
        return "no collective yet"
    last = max(done, key=lambda entry: entry.seq)
    return f"last completed {last.op} #{last.seq}, not in a collective"


def _by_group(recorders: Recorders) -> Dict[str, Dict[int, List[CollectiveEntry]]]:
    groups: Dict[str, Dict[int, List[CollectiveEntry]]] = {}
    for rank, entries in recorders.items():
        for entry in entries or ():
            groups.setdefault(entry.group, {}).setdefault(rank, []).append(entry)
    return groups


def _signature(entry: CollectiveEntry) -> _Signature:
    return (entry.op, entry.shapes, entry.dtypes)


def first_mismatch(by_rank: Mapping[int, Sequence[CollectiveEntry]]) -> Optional[str]:
    """The lowest sequence number at which ranks entered different collectives
    (op, sizes or dtypes), said from the minority's side; None if they agree."""
    at_seq: Dict[int, Dict[int, CollectiveEntry]] = {}
    for rank, entries in by_rank.items():
        for entry in entries:
            at_seq.setdefault(entry.seq, {})[rank] = entry
    for seq in sorted(at_seq):
        ranks_at = at_seq[seq]
        kinds: Dict[_Signature, List[int]] = {}
        for rank, entry in sorted(ranks_at.items()):
            kinds.setdefault(_signature(entry), []).append(rank)
        if len(kinds) < 2:
            continue
        # The most ranks (then the lowest rank) define "the others".
        ordered = sorted(kinds.items(), key=lambda item: (-len(item[1]), item[1][0]))
        common = ranks_at[ordered[0][1][0]]
        lines = []
        for _, ranks in ordered[1:]:
            odd = ranks_at[ranks[0]]
            who = ranks_text(ranks)
            if odd.op != common.op:
                lines.append(f"{who} entered {odd.op} #{seq}, the others {common.op} #{seq}")
            else:
                lines.append(f"{who} entered {odd.op} #{seq} with {tensors_text(odd)}, the others with {tensors_text(common)}")
        return "mismatch: " + "; ".join(lines)
    return None


def where_collectives_are(recorders: Recorders) -> str:
    """Where every rank is in its collectives, grouped, and the first mismatch;
    "" when no rank recorded any collective (recorder off, or none ran)."""
    groups = _by_group(recorders)
    if not groups:
        return ""
    silent = sorted(rank for rank, entries in recorders.items() if entries is None)
    lines = []
    for name in sorted(groups, key=lambda group: (group != "0", group)):
        by_rank = groups[name]
        states: Dict[str, List[int]] = {}
        for rank in sorted(rank for rank, entries in recorders.items() if entries is not None):
            states.setdefault(rank_state(by_rank.get(rank, [])), []).append(rank)
        prefix = f"process group {name}: " if len(groups) > 1 else ""
        ordered = sorted(states.items(), key=lambda item: item[1][0])
        lines.append(prefix + "; ".join(f"{ranks_text(ranks)}: {state}" for state, ranks in ordered))
        mismatch = first_mismatch(by_rank)
        if mismatch:
            lines.append(prefix + mismatch)
    if silent:
        lines.append(f"{ranks_text(silent)}: no flight record (the process did not answer)")
    return "\n".join(lines)


@dataclass(frozen=True)
class NotArrived:
    """Ranks that have not reached a collective others entered: on process
    group ``group``, ``waiting`` entered ``op`` #``seq``; ``behind`` are at an
    earlier one (or none), not in it."""

    group: str
    seq: int
    op: str
    tensors: str
    waiting: Tuple[int, ...]
    behind: Tuple[int, ...]
    behind_at: Tuple[str, ...]  # where each of ``behind`` is (``rank_state``)

    @property
    def key(self) -> Tuple[str, int, Tuple[int, ...]]:
        """The same hang seen in two polls has the same key."""
        return (self.group, self.seq, self.behind)

    def line(self, seconds: float, who: Optional[str] = None) -> str:
        """``rank 2 did not reach all_reduce #6 (float32 [1]), which ranks 0-1, 3 waited in for 30.2 s (rank 2: last completed all_reduce #5, not in a collective)``;
        ``who`` instead of the ranks' names (``it``, in a killed rank's own failure)."""
        where = "; ".join(f"rank {rank}: {at}" for rank, at in zip(self.behind, self.behind_at))
        prefix = f"process group {self.group}: " if self.group != "0" else ""
        return (
            f"{prefix}{who or ranks_text(self.behind)} did not reach {self.op} #{self.seq} ({self.tensors}), which "
            f"{ranks_text(self.waiting)} waited in for {seconds:.1f} s ({where})"
        )


def not_arrived(recorders: Recorders) -> Optional[NotArrived]:
    """The ranks that have not reached the newest collective some rank entered,
    on the first process group where any have not (the default group first);
    None where every rank is at the same one, or a rank's recorder could not be
    read (nothing is known of it). Ranks entering the same collective a moment
    apart show this too: only its persistence makes a hang (the watch's timeout).
    A rank at the same sequence number in another collective is a mismatch
    (``first_mismatch``), a bug in the code, not a rank to replace: not said here."""
    if not recorders or any(entries is None for entries in recorders.values()):
        return None
    groups = _by_group(recorders)
    for name in sorted(groups, key=lambda group: (group != "0", group)):
        by_rank = groups[name]
        newest = {rank: max((entry.seq for entry in by_rank.get(rank, ())), default=0) for rank in recorders}
        top = max(newest.values())
        behind = tuple(sorted(rank for rank, seq in newest.items() if seq < top))
        if not behind:
            continue
        waiting = tuple(sorted(rank for rank, seq in newest.items() if seq == top))
        entry = next(e for e in by_rank[waiting[0]] if e.seq == top)
        at = tuple(rank_state(by_rank.get(rank, [])) for rank in behind)
        return NotArrived(name, top, entry.op, tensors_text(entry), waiting, behind, at)
    return None


def mark_failed(entries: Sequence[CollectiveEntry]) -> Tuple[CollectiveEntry, ...]:
    """A rank's entries after its call raised inside its latest collective:
    that one failed (torch retires a collective that raised as if it completed)."""
    if not entries:
        return tuple(entries)
    latest = max(entries, key=lambda entry: entry.created_ns)
    return tuple(
        CollectiveEntry(e.group, e.seq, e.op, e.shapes, e.dtypes, e.created_ns, False, True) if e is latest else e for e in entries
    )


def needs_attribution(entries: Optional[Sequence[CollectiveEntry]]) -> bool:
    """A failed rank whose error came from inside a collective (a process
    group timeout, a peer that left): worth reading every rank's recorder."""
    return bool(entries) and in_flight(entries or ()) is not None
