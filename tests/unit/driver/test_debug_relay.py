"""The pdb relay's registry: what ``raydist debug`` reads to find the runs on this machine."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from raydist.pool.driver.debug_relay import DebugRelay, registry_dir


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return Path(registry_dir())


NEVER_A_PID = 2**22 + 1  # above Linux's largest pid_max: no process has it


def test_a_relay_registers_while_it_runs_and_removes_its_entry_when_stopped(registry: Path) -> None:
    relay = DebugRelay("127.0.0.1", terminal=False)
    (entry,) = registry.iterdir()
    assert json.loads(entry.read_text()) == {"address": relay.address, "token": relay.token, "pid": os.getpid()}
    relay.stop()
    assert list(registry.iterdir()) == []


def test_a_killed_drivers_entry_goes_when_the_next_relay_registers(registry: Path) -> None:
    registry.mkdir(parents=True)
    killed = registry / f"{NEVER_A_PID}-40000.json"  # its driver was SIGKILLed: stop() never ran
    killed.write_text("{}")
    running = registry / f"{os.getpid()}-40001.json"  # another relay of a driver that still runs
    running.write_text("{}")
    relay = DebugRelay("127.0.0.1", terminal=False)
    try:
        assert sorted(p.name for p in registry.iterdir()) == sorted([running.name, os.path.basename(relay._registry)])
    finally:
        relay.stop()
