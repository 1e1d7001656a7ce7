"""The live tier's leak check (``tests/conftest.py``): it counts the files
raydist made for a process, and nothing else that happens to sit in a folder
named like raydist's."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import ModuleType

import pytest

from raydist.pool.driver.debug_relay import registry_dir
from raydist.pool.worker.evidence import scratch_dir

SHARED_CONFTEST = Path(__file__).resolve().parents[2] / "conftest.py"


@pytest.fixture
def leak_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    """The shared conftest as pytest loaded it (a plain import would find the unit tier's own), over a temp directory of its own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    plugins = request.config.pluginmanager.get_plugins()
    return next(plugin for plugin in plugins if getattr(plugin, "__file__", None) == str(SHARED_CONFTEST))


def test_a_folder_named_like_raydists_is_not_its_leftover(leak_check: ModuleType, tmp_path: Path) -> None:
    venv = tmp_path / "raydist-venv-xyz"
    (venv / "lib").mkdir(parents=True)
    for name in ("cp500.pyi", "gb2312freq.py", "lib/roboto-latin-1250.woff"):
        (venv / name).write_text("")  # a virtualenv's files, a pid's number in their names
    assert leak_check.raydist_files_of([500, 2312, 1250]) == []


def test_raydists_own_files_of_a_pid_are_found(leak_check: ModuleType) -> None:
    workers, relays = Path(scratch_dir()), Path(registry_dir())
    workers.mkdir()
    relays.mkdir()
    for path in (workers / "exit-500", workers / "diag-500.sock", workers / "stacks-5000", relays / "2312-40000.json"):
        path.write_text("")
    found = leak_check.raydist_files_of([500, 2312])
    assert sorted(found) == sorted(str(p) for p in (workers / "exit-500", workers / "diag-500.sock", relays / "2312-40000.json"))
