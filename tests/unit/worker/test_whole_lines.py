"""A worker's printed line reaches its file in one write.

A Ray worker's ``sys.stdout`` flushes after every write: ``print("pid", x)``
then writes "pid", " ", x and the newline one by one, and Ray's log monitor,
which forwards what the file holds whenever it looks, printed such a line
as two at the driver. The streams here are built as Ray builds them.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Tuple

import pytest

from raydist.pool.worker.markers import write_whole_lines


class FlushedEachWrite:
    """A Ray worker's stream: a line-buffered file, flushed after every write."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, data: str) -> int:
        written = self.stream.write(data)
        self.stream.flush()
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@pytest.fixture
def ray_like_streams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Tuple[Path, Path]]]:
    """Makes sys.stdout and sys.stderr what a Ray worker has, over files of their
    own (in the test: pytest sets its own streams between set-up and the test); the files."""
    paths = tmp_path / "out", tmp_path / "err"
    fds = [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for path in paths]

    def install() -> Tuple[Path, Path]:
        for name, fd in zip(("stdout", "stderr"), fds):
            monkeypatch.setattr(sys, name, FlushedEachWrite(open(fd, "a", buffering=1, encoding="utf-8", closefd=False)))
        return paths

    yield install
    monkeypatch.undo()  # (before the descriptors close)
    for fd in fds:
        os.close(fd)


def test_a_line_reaches_the_file_whole_at_its_newline(ray_like_streams: Callable[[], Tuple[Path, Path]]) -> None:
    out, err = ray_like_streams()
    print("progress", end="")
    assert out.read_text() == "progress"  # each piece is in the file at once: a reader may take it as a line

    write_whole_lines()
    print(" pid", end="")
    print("", '{"rank": 0}', end="", file=sys.stderr)
    assert out.read_text() == "progress" and err.read_text() == ""  # a line not ended waits, as on a terminal
    print("", '{"rank": 0}')
    print(" loss", 0.5, file=sys.stderr)
    assert out.read_text() == 'progress pid {"rank": 0}\n'
    assert err.read_text() == ' {"rank": 0} loss 0.5\n'

    print("half", end="", flush=True)
    assert out.read_text().endswith("\nhalf")  # and goes at a flush


def test_a_stream_the_code_replaced_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    replaced = io.StringIO()
    monkeypatch.setattr(sys, "stdout", replaced)
    write_whole_lines()
    assert sys.stdout is replaced
