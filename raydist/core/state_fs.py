"""Where durable snapshots live: a local directory or a filesystem URI.

A value with ``://`` is a URI. ``file://`` names a local directory. Any
other scheme goes through ``pyarrow.fs`` (s3, gs, hdfs, abfs: resolved with
``FileSystem.from_uri``) or, for schemes pyarrow does not know, an fsspec
implementation (``memory://``, ...) behind pyarrow's ``FSSpecHandler``; both
come with ``raydist[data]`` and are imported only when a URI is used.
Object stores have no rename: a file is written in place (an object appears
whole, or not at all, when its upload completes), so what keeps a cut-short
snapshot from being loaded is the marker written last (``state_files``).
Ray-free, like the rest of the core.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import threading
import uuid
from typing import Any, Dict, List, Tuple
from urllib.parse import unquote, urlparse

PYARROW_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
INSTALL = "pip install 'raydist[data]' (or pyarrow, plus fsspec and the scheme's fsspec package for schemes pyarrow lacks)"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)

__all__ = ["Storage", "check_location", "is_local", "is_uri", "local_path", "open_location"]


def is_uri(location: str) -> bool:
    return "://" in location


def is_local(location: str) -> bool:
    """A plain path or a ``file://`` URI: a directory on this machine's disk."""
    return not is_uri(location) or location.lower().startswith("file://")


def check_location(location: str) -> str:
    """The location as the run keeps it: a local path made absolute, a URI as given.
    Raises ValueError (malformed, unknown scheme) or ImportError (what to install)
    without touching the storage: no network, no credentials needed here."""
    if not is_uri(location):
        return os.path.abspath(location)
    match = _SCHEME.match(location)
    if match is None:
        raise ValueError(f"{location!r} is not a URI of the form SCHEME://PATH")
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        local_path(location)
        return location
    if not rest.strip("/"):
        raise ValueError(f"{location!r} names no bucket or path after {scheme}://")
    _pyarrow_fs(location)
    if scheme not in PYARROW_SCHEMES:
        _fsspec_class(scheme, location)
    return location


def local_path(location: str) -> str:
    """The directory a ``file://`` URI (or a plain path) names."""
    if not is_uri(location):
        return location
    parsed = urlparse(location)
    if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
        raise ValueError(f"{location!r}: a file:// URI names an absolute local path, as file:///dir")
    return unquote(parsed.path)


class Storage:
    """The few operations snapshots need, on a local disk (this class) or a pyarrow filesystem."""

    renames = True  # a finished folder can be renamed into place at once

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def write(self, path: str, data: bytes) -> None:
        """``data`` at ``path``, never seen half-written: a temporary name, then a rename."""
        temporary = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)

    def read(self, path: str) -> bytes:
        with open(path, "rb") as file:
            return file.read()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> List[str]:
        """The names in ``path``; none when it does not exist."""
        return os.listdir(path) if os.path.isdir(path) else []

    def remove(self, path: str) -> None:
        """A file or a folder with everything in it; nothing when absent."""
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)

    def rename(self, source: str, target: str) -> None:
        os.rename(source, target)


class ArrowStorage(Storage):
    """A pyarrow filesystem (object stores, HDFS, fsspec's through FSSpecHandler)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self.renames = False  # object stores copy to "rename": the marker is what commits
        # HDFS shows a file while it is written: a temporary name, then a move there
        self._move_files = fs.type_name == "hdfs"

    def join(self, *parts: str) -> str:
        return posixpath.join(*parts)

    def makedirs(self, path: str) -> None:
        self.fs.create_dir(path, recursive=True)

    def write(self, path: str, data: bytes) -> None:
        target = f"{path}.tmp-{uuid.uuid4().hex[:8]}" if self._move_files else path
        with self.fs.open_output_stream(target) as stream:
            stream.write(data)
        if target != path:
            self.fs.move(target, path)

    def read(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as stream:
            return bytes(stream.read())

    def exists(self, path: str) -> bool:
        from pyarrow.fs import FileType

        return bool(self.fs.get_file_info(path).type != FileType.NotFound)

    def listdir(self, path: str) -> List[str]:
        from pyarrow.fs import FileSelector

        return [posixpath.basename(info.path.rstrip("/")) for info in self.fs.get_file_info(FileSelector(path, allow_not_found=True))]

    def remove(self, path: str) -> None:
        from pyarrow.fs import FileType

        kind = self.fs.get_file_info(path).type
        if kind == FileType.Directory:
            self.fs.delete_dir(path)
        elif kind == FileType.File:
            self.fs.delete_file(path)

    def rename(self, source: str, target: str) -> None:
        raise OSError(f"{self.fs.type_name} has no rename")


LOCAL = Storage()
_opened: Dict[str, Tuple[Storage, str]] = {}
_lock = threading.Lock()


def open_location(location: str) -> Tuple[Storage, str]:
    """The storage and the path in it that ``location`` names (resolved once per
    process: resolving an S3 URI may ask the bucket's region)."""
    if is_local(location):
        return LOCAL, local_path(location)
    with _lock:
        if location not in _opened:
            _opened[location] = _resolve(location)
        return _opened[location]


def _resolve(location: str) -> Tuple[Storage, str]:
    check_location(location)
    fs_module = _pyarrow_fs(location)
    scheme = location.split("://", 1)[0].lower()
    if scheme in PYARROW_SCHEMES:
        fs, path = fs_module.FileSystem.from_uri(location)
    else:
        import fsspec.core

        spec_fs, path = fsspec.core.url_to_fs(location)
        fs = fs_module.PyFileSystem(fs_module.FSSpecHandler(spec_fs))
    if isinstance(fs, fs_module.LocalFileSystem):
        return LOCAL, path
    return ArrowStorage(fs), path.rstrip("/") or "/"


def _pyarrow_fs(location: str) -> Any:
    try:
        import pyarrow.fs
    except ImportError:
        raise ImportError(f"{location!r} is a URI: reading and writing it needs pyarrow: {INSTALL}") from None
    return pyarrow.fs


def _fsspec_class(scheme: str, location: str) -> None:
    """fsspec knows the scheme and its implementation imports (no filesystem is made)."""
    try:
        import fsspec
    except ImportError:
        raise ImportError(
            f"{location!r}: pyarrow has no {scheme}:// filesystem ({', '.join(PYARROW_SCHEMES)}); other schemes need fsspec: {INSTALL}"
        ) from None
    try:
        fsspec.get_filesystem_class(scheme)
    except ValueError:
        raise ValueError(
            f"{location!r}: unknown scheme {scheme}:// (neither pyarrow ({', '.join(PYARROW_SCHEMES)}, file) nor fsspec knows it)"
        ) from None
    except ImportError as error:
        raise ImportError(f"{location!r}: fsspec's {scheme}:// filesystem is not installed: {error}") from None
