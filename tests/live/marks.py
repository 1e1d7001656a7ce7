"""Marks a rank leaves for the test that waits on it (a rank at a given point,
with its pid and node). Written under another name and renamed, so a test
that sees the file never reads it half-written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List


def write_mark(directory: str, name: str, data: Dict[str, Any]) -> None:
    final = Path(directory, name)
    partial = final.with_name(f".{final.name}.partial")  # not matched by the tests' globs
    partial.write_text(json.dumps(data))
    os.replace(partial, final)


def read_marks(directory: Path, pattern: str = "rank-*.json") -> List[Dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(directory.glob(pattern))]
