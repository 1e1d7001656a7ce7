"""Durable snapshots on any storage: a local path, a ``file://`` URI, and a
filesystem with no rename (fsspec's in-memory one, pyarrow's local one driven
as an object store): the same layout, and a snapshot cut short is never
loaded. A URI without the package that opens it is a clear error."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Dict, Iterator

import pytest
import torch
from pyarrow.fs import LocalFileSystem

from raydist.config import RunConfig
from raydist.core import state, state_files, state_fs
from raydist.core.state_files import SnapshotMeta

META = SnapshotMeta(0, 2, ("model",), ("rng",))


def parts(step: int) -> Dict[str, bytes]:
    return {"shared": f"model {step}".encode(), "rank_00000": f"rng 0 {step}".encode(), "rank_00001": f"rng 1 {step}".encode()}


def write(root: str, step: int, keep: int = 2) -> None:
    state_files.write_snapshot(root, SnapshotMeta(step, 2, ("model",), ("rng",)), parts(step), keep)


@pytest.fixture
def memory_uri() -> Iterator[str]:
    import fsspec

    uri = f"memory://state-{uuid.uuid4().hex[:8]}/run"
    yield uri
    fsspec.filesystem("memory").rm(uri.replace("memory://", "/").rsplit("/", 1)[0], recursive=True)


@pytest.fixture
def arrow_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A local directory through pyarrow's filesystem, written as an object store is (no rename)."""
    uri = f"objectstore://{tmp_path.name}"
    monkeypatch.setitem(state_fs._opened, uri, (state_fs.ArrowStorage(LocalFileSystem()), str(tmp_path)))
    return uri


def test_a_file_uri_and_its_path_are_the_same_directory(tmp_path: Path) -> None:
    uri = tmp_path.as_uri()
    assert RunConfig(state_dir=uri).state_dir == uri
    for step in range(3):
        write(uri if step % 2 else str(tmp_path), step)
    assert state_files.committed_steps(str(tmp_path)) == state_files.committed_steps(uri) == [1, 2]
    assert state_files.read_part(uri, 2, "rank_00001") == b"rng 1 2"
    assert sorted(p.name for p in (tmp_path / "step_000000000002").iterdir()) == [
        "COMMITTED",
        "meta.json",
        "rank_00000.pt",
        "rank_00001.pt",
        "shared.pt",
    ]


@pytest.mark.parametrize("root", ["memory_uri", "arrow_local"])
def test_a_store_without_rename_commits_by_the_marker_alone(root: str, request: pytest.FixtureRequest) -> None:
    uri = request.getfixturevalue(root)
    for step in range(4):
        write(uri, step)
    assert state_files.committed_steps(uri) == [2, 3]
    newest = state_files.newest(uri)
    assert newest is not None and newest.step == 3 and newest.world_size == 2
    assert state_files.read_part(uri, 3, "shared") == b"model 3"
    storage, base = state_fs.open_location(uri)
    assert not any(".tmp-" in name for name in storage.listdir(base))  # written in place


@pytest.mark.parametrize("root", ["memory_uri", "arrow_local"])
def test_a_rewrite_cut_short_on_a_store_without_rename_is_never_loaded(
    root: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 3 written again (a second run that resumed from 2) by a writer that dies
    half-way: the old marker went first, so step 3 is not loaded, a mix of both never."""
    uri = request.getfixturevalue(root)
    write(uri, 2)
    write(uri, 3)
    storage, _ = state_fs.open_location(uri)
    writes = []
    real_write = type(storage).write

    def dies_on_the_second_part(self: state_fs.Storage, path: str, data: bytes) -> None:
        writes.append(path)
        if len(writes) == 2:
            raise OSError("the writer's node went away")
        real_write(self, path, data)

    with monkeypatch.context() as patch, pytest.raises(OSError, match="went away"):
        patch.setattr(type(storage), "write", dies_on_the_second_part)
        write(uri, 3)
    assert state_files.committed_steps(uri) == [2]
    newest = state_files.newest(uri)
    assert newest is not None and newest.step == 2


def test_the_directory_store_saves_and_resumes_through_a_uri(memory_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside raydist (RAYDIST_STATE_DIR), each rank writes its own part to the URI."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", state.STATE_DIR_VAR: memory_uri, state.STATE_KEEP_VAR: "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(state, "_dir_stores", {})
    model = torch.nn.Linear(2, 1)
    for step in range(3):
        state.save_state(step, shared=["model"], model=model, progress={"seen": step})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    progress: dict = {}
    assert state.load_state(model=model, progress=progress) == 2
    assert progress == {"seen": 2} and all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert state_files.committed_steps(memory_uri) == [1, 2]


def test_a_uri_without_pyarrow_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for module in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now fails
    with pytest.raises(ImportError, match=r"state_dir 's3://bucket/run' is a URI.*pyarrow.*raydist\[data\]"):
        RunConfig(state_dir="s3://bucket/run")
    assert RunConfig(state_dir=tmp_path.as_uri()).state_dir == tmp_path.as_uri()  # a local one needs nothing


def test_an_fsspec_scheme_whose_package_is_missing_names_it() -> None:
    pytest.importorskip("fsspec")
    try:
        import ftplib  # noqa: F401 - the standard library's: fsspec's ftp:// always imports
    except ImportError:
        pytest.skip("no ftplib")
    assert RunConfig(state_dir="ftp://host/run").state_dir == "ftp://host/run"
    if "adlfs" not in sys.modules and not _installed("adlfs"):
        with pytest.raises(ImportError, match="state_dir 'az://c/run'.*adlfs"):
            RunConfig(state_dir="az://c/run")


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
