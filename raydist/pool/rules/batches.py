"""Exact batch sizes over a stream of uneven batches (pure: no Ray, no torch).

Ray Data's ``iter_batches(batch_size=B)`` gives short batches mid-stream
(uneven blocks, a local shuffle buffer), so two ranks holding the same
number of rows can still run different numbers of steps and hang in their
last collective. Re-cut into batches of exactly ``B`` rows, a shard of N
rows always gives ``N // B`` full batches and, without ``drop_last``, one
last batch of ``N % B`` rows: the count depends on N alone.

A batch is a dict of numpy arrays (or of anything with ``len`` and
slicing, concatenated by numpy), a pandas DataFrame or a pyarrow Table.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, List, Optional

__all__ = ["batch_count", "batch_rows", "rechunk", "row_drop_bound"]


def batch_rows(batch: Any) -> int:
    """The number of rows in ``batch``."""
    if isinstance(batch, dict):
        return len(next(iter(batch.values()))) if batch else 0
    num_rows = getattr(batch, "num_rows", None)  # pyarrow.Table
    return int(num_rows) if num_rows is not None else len(batch)


def _slice(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, dict):
        return {key: column[start:stop] for key, column in batch.items()}
    if hasattr(batch, "iloc"):  # pandas
        return batch.iloc[start:stop]
    if hasattr(batch, "num_rows"):  # pyarrow.Table.slice(offset, length)
        return batch.slice(start, stop - start)
    return batch[start:stop]


def _concat(parts: List[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, dict):
        import numpy

        return {key: numpy.concatenate([part[key] for part in parts]) for key in first}
    if hasattr(first, "iloc"):
        import pandas

        return pandas.concat(parts, ignore_index=True)
    if hasattr(first, "num_rows"):
        import pyarrow

        return pyarrow.concat_tables(parts)
    import numpy

    return numpy.concatenate(parts)


def rechunk(batches: Iterable[Any], batch_size: int, drop_last: bool = False) -> Iterator[Any]:
    """``batches`` re-cut into batches of exactly ``batch_size`` rows; the
    rest (fewer rows) last, unless ``drop_last``. A batch already of the
    right size, with nothing held back, passes through uncopied."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive number of rows, got {batch_size}")
    held: List[Any] = []
    rows = 0
    for batch in batches:
        size = batch_rows(batch)
        if size == 0:
            continue
        if not held and size == batch_size:
            yield batch
            continue
        held.append(batch)
        rows += size
        if rows < batch_size:
            continue
        joined = _concat(held)
        start = 0
        while rows - start >= batch_size:
            yield _slice(joined, start, start + batch_size)
            start += batch_size
        held = [_slice(joined, start, rows)] if start < rows else []
        rows -= start
    if held and not drop_last:
        yield _concat(held)


def batch_count(rows: int, batch_size: int, drop_last: bool) -> int:
    """Batches ``rechunk`` gives for a shard of ``rows`` rows."""
    return rows // batch_size if drop_last else -(-rows // batch_size)


def row_drop_bound(world_size: int, batch_size: Optional[int], drop_last: bool, equal: bool) -> int:
    """At most how many rows of an epoch no rank reads: up to ``world_size - 1``
    at a row-equal split, and with ``drop_last`` fewer than ``batch_size`` per rank."""
    dropped = world_size - 1 if equal else 0
    if drop_last and batch_size:
        dropped += world_size * (batch_size - 1)
    return dropped
