"""The built package: what a user installs from the wheel, not the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_the_wheel_carries_the_license_and_the_typing_marker(tmp_path: Path) -> None:
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:  # the build's own requirement; an isolated build fetches it
        pytest.skip(f"license-files needs setuptools >= 77 to build here without isolation, not {setuptools.__version__}")
    source = tmp_path / "source"  # a copy: the build writes build/ and *.egg-info beside the sources
    shutil.copytree(
        REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", ".nox", "site", "build", "__pycache__", "*.egg-info", ".*_cache")
    )
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(source)]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    [wheel] = tmp_path.glob("raydist-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    [license] = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
    assert zipfile.ZipFile(wheel).read(license) == (REPO / "LICENSE").read_bytes()
    assert "Apache License" in (REPO / "LICENSE").read_text()
    assert "raydist/py.typed" in names
