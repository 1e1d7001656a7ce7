"""Every figure the README and the guides quote has one home,
``benchmarks/figures.json`` (the benchmarks' latest run of it, dated, with
its machine and command), and the text quotes it exactly.

A quote is marked where it stands: ``<!--figure:KEY-->`` right before the
figure's text (a link's ``[`` may come between), invisible once rendered.
``benchmarks/README.md``, where each figure is measured, marks every one."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Dict, List, Mapping, Tuple

import pytest

REPO = Path(__file__).resolve().parents[3]
FIGURES = REPO / "benchmarks" / "figures.json"
SOURCE = REPO / "benchmarks" / "README.md"
MARK = re.compile(r"<!--figure:([\w.-]+)-->\[?")


def quoting_files() -> List[Path]:
    """The README, every page under docs/ and the READMEs the docs include."""
    docs = [p for p in (REPO / "docs").rglob("*.md") if "hooks" not in p.parts]
    return [REPO / "README.md", SOURCE, REPO / "tests" / "README.md", REPO / "cluster_configs" / "README.md", *sorted(docs)]


def load() -> Dict[str, Mapping[str, str]]:
    return json.loads(FIGURES.read_text())


def misquotes(text: str, figures: Mapping[str, Mapping[str, str]]) -> List[Tuple[str, str]]:
    """(key, what follows the mark) for each quote in ``text`` that is not its figure's text."""
    wrong = []
    for match in MARK.finditer(text):
        key = match.group(1)
        figure = figures.get(key)
        quoted = text[match.end() :].split("\n", 1)[0]
        if figure is None or not quoted.startswith(figure["text"]):
            wrong.append((key, quoted[:40]))
    return wrong


def test_every_figure_is_dated_with_its_machine_and_command() -> None:
    home = load()
    assert home["figures"], "no figures"
    for key, figure in home["figures"].items():
        assert set(figure) == {"text", "what", "command", "measured", "machine"}, key
        datetime.date.fromisoformat(figure["measured"])
        assert figure["machine"] in home["machines"], key
        assert figure["command"].startswith("python benchmarks/"), key
        assert (REPO / figure["command"].split()[1]).is_file(), key


@pytest.mark.parametrize("path", quoting_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_quote_matches_its_figure(path: Path) -> None:
    assert misquotes(path.read_text(), load()["figures"]) == []


def test_the_benchmarks_readme_marks_every_figure_where_it_is_measured() -> None:
    marked = set(MARK.findall(SOURCE.read_text()))
    assert set(load()["figures"]) <= marked


def test_the_readme_and_the_recovery_guide_quote_the_recovery_figures() -> None:
    for path in (REPO / "README.md", REPO / "docs" / "guides" / "warm-restarts.md"):
        assert {"recovery.spare", "recovery.torchrun"} <= set(MARK.findall(path.read_text())), path


def test_a_changed_quote_or_an_unknown_figure_is_found() -> None:
    figures = {"start.raydist": {"text": "1.3 s"}}
    assert misquotes("starts in <!--figure:start.raydist-->[1.3 s](x.md) here", figures) == []
    assert misquotes("starts in <!--figure:start.raydist-->1.4 s", figures) == [("start.raydist", "1.4 s")]
    assert misquotes("<!--figure:nothing-->2 s", figures) == [("nothing", "2 s")]
