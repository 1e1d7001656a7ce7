"""The documentation against the code, without Ray and without building it.

* The reference pages are generated (``docs/hooks/reference.py``): every
  RunConfig option, every ``raydist run`` / ``raydist debug`` flag and every
  name in ``raydist.__all__`` has its entry, and an option, flag or name
  taken away takes its entry with it (the generators are run on modified
  inputs).
* ``docs/architecture.md`` names only what exists: every name or path it
  puts in backticks (``restart.WarmRestart``, ``pool/driver/controller.py``,
  ``--virtual-local-rank``, ``GroupPhase`` members, ...) resolves to a module,
  attribute, file or flag of the repository; plain words are allowed.
* The blocks marked runnable are well formed and compile
  (``tests/live/test_docs_examples.py`` runs them).

``mkdocs build --strict`` in ``make test`` checks the rest: links, anchors,
pages left out of the navigation.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import dataclasses
import importlib.util
import re
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

import raydist
from raydist.cli import args as cli_args
from raydist.cli import build_parser
from raydist.config import RunConfig, cli_options

REPO = Path(__file__).resolve().parents[3]


def _stdlib() -> "frozenset[str]":
    """The standard library's top-level modules (``sys.stdlib_module_names`` from Python 3.10; before, read from its folder)."""
    names = getattr(sys, "stdlib_module_names", None)
    if names is not None:
        return frozenset(names)
    folder = Path(sysconfig.get_paths()["stdlib"])
    return frozenset(sys.builtin_module_names) | {path.name.split(".")[0] for path in folder.iterdir() if path.suffix in ("", ".py")}


STDLIB = _stdlib()
ARCHITECTURE = REPO / "docs" / "architecture.md"


def _load_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


reference = _load_reference()


def _flags(parser: argparse.ArgumentParser) -> Dict[str, List[str]]:
    """Each sub-command's option strings (and positional names)."""
    commands = {}
    for name, sub in reference._subparsers(parser).items():
        spellings = []
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            spellings += action.option_strings or [str(action.metavar or action.dest)]
        commands[name] = spellings
    return commands


# -- the generated reference ---------------------------------------------------


def test_every_option_has_an_entry() -> None:
    page = reference.options_markdown()
    for field in dataclasses.fields(RunConfig):
        assert f'<a id="{field.name}"></a>`{field.name}`' in page, field.name


def test_every_flag_of_every_command_has_an_entry() -> None:
    page = reference.cli_markdown()
    commands = _flags(build_parser()[0])
    assert set(commands) == {"run", "debug"}
    for name, spellings in commands.items():
        assert f"## raydist {name}" in page
        for spelling in spellings:
            assert f"`{spelling}" in page, f"raydist {name} {spelling}"


def test_every_flag_that_sets_an_option_links_to_it_and_back() -> None:
    options = reference.options_markdown()
    cli = reference.cli_markdown()
    for field, flag in cli_options():
        if flag.generated:
            assert f"cli.md#{reference._flag_anchor(flag.flags[0])})" in options, field.name
            assert f'<a id="{reference._flag_anchor(flag.flags[0])}"></a>' in cli, field.name
            assert f"(options.md#{field.name})" in cli, field.name


def test_every_torchrun_flag_is_listed() -> None:
    page = reference.cli_markdown()
    for flag, (kind, _) in cli_args.TORCHRUN_FLAGS.items():
        assert f"| `{flag}` | {kind} |" in page


def test_every_public_name_has_an_entry() -> None:
    page = reference.api_markdown()
    exports = reference.exported_names()
    assert set(exports) == set(raydist.__all__)
    for name in raydist.__all__:
        heading = "raydist.compat" if name == "compat" else f"raydist.{name}"
        assert f"      heading: {heading}\n" in page, name
        assert f"::: {reference._api_anchor(name, exports[name])}\n" in page, name


def test_every_exported_exception_is_on_the_errors_page() -> None:
    page = reference.errors_markdown()
    import raydist.errors as errors

    exceptions = {name for name in raydist.__all__ if name in vars(errors) and isinstance(getattr(errors, name), type)}
    exceptions = {name for name in exceptions if issubclass(getattr(errors, name), BaseException)}
    assert exceptions, "raydist.errors exports no exception"
    for name in exceptions | {"StateSizeError"}:
        assert f"[`raydist.{name}`]" in page, name
    assert "WorkerFailure`]" not in page  # a record, not an exception


def test_an_option_taken_away_leaves_the_options_page() -> None:
    fields = dataclasses.fields(RunConfig)
    for gone in ("num_workers", "spare_workers", "retry_on_exception"):  # set by a CLI-only flag, by its own, by none
        page = reference.options_markdown([f for f in fields if f.name != gone])
        assert f'<a id="{gone}"></a>' not in page
        assert all(f'<a id="{f.name}"></a>' in page for f in fields if f.name != gone)


def test_an_option_taken_away_leaves_the_command_page(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = tuple((field, flag) for field, flag in cli_options() if field.name != "spare_workers")
    monkeypatch.setattr(cli_args, "cli_options", lambda: kept)
    page = reference.cli_markdown(build_parser()[0])
    assert "--spare-workers" not in page
    assert "`--survivor-timeout SECONDS`" in page


def test_a_name_taken_away_leaves_the_api_and_errors_pages() -> None:
    exports = {name: module for name, module in reference.exported_names().items() if name not in ("split_dataset", "WorkerGroupTimeout")}
    api = reference.api_markdown(exports)
    assert "split_dataset" not in api and "WorkerGroupTimeout" not in api
    assert "raydist.get_dataset_shard" in api
    errors = reference.errors_markdown(exports)
    assert "WorkerGroupTimeout" not in errors and "raydist.WorkerGroupError" in errors


def test_the_generated_pages_are_in_the_navigation() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    for page in reference.GENERATED:
        assert f": {page}\n" in nav, page


def _tables(page: str) -> Iterator[List[str]]:
    table: List[str] = []
    for line in [*page.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            yield table
            table = []


def test_table_cells_cannot_break_the_tables() -> None:
    assert reference._escape("a | b, g*P, __main__, `x|y`, <tag>") == r"a \| b, g\*P, \_\_main\_\_, `x\|y`, &lt;tag&gt;"
    for page in (reference.options_markdown(), reference.cli_markdown(), reference.errors_markdown()):
        for table in _tables(page):
            widths = {len(re.findall(r"(?<!\\)\|", row)) for row in table}
            assert len(widths) == 1, "\n".join(table)


# -- architecture.md names only what exists ------------------------------------


@dataclasses.dataclass
class ModuleIndex:
    names: Set[str]  # top-level definitions
    classes: Dict[str, Set[str]]  # class -> its members (methods, fields, self.x, enum members)
    bases: Dict[str, List[str]]


def _members(node: ast.ClassDef) -> Set[str]:
    members: Set[str] = set()
    for item in ast.walk(node):
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and item is not node:
            members.add(item.name)
        elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store) and isinstance(item.value, ast.Name):
            members.add(item.attr)  # self.x = ...
    for item in node.body:
        targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
        members |= {t.id for t in targets if isinstance(t, ast.Name)}
    return members


def _index(path: Path) -> ModuleIndex:
    tree = ast.parse(path.read_text())
    names: Set[str] = set()
    classes: Dict[str, Set[str]] = {}
    bases: Dict[str, List[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            classes[node.name] = _members(node)
            bases[node.name] = [ast.unparse(b).split(".")[-1] for b in node.bases]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {t.id for t in ast.walk(target) if isinstance(t, ast.Name)}
    return ModuleIndex(names, classes, bases)


@lru_cache(maxsize=None)
def _code_index() -> Tuple[Dict[str, ModuleIndex], Set[str], Set[str]]:
    """Every module of raydist and the tests by dotted name; every name defined
    anywhere (top level or a class member); every string literal of raydist."""
    modules: Dict[str, ModuleIndex] = {}
    defined: Set[str] = set()
    strings: Set[str] = set()
    for path in [*sorted((REPO / "raydist").rglob("*.py")), *sorted((REPO / "tests").rglob("*.py"))]:
        parts = path.relative_to(REPO).with_suffix("").parts
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        index = _index(path)
        modules[dotted] = index
        defined |= index.names | {m for members in index.classes.values() for m in members}
        defined.add(dotted.rsplit(".", 1)[-1])
        if parts[0] == "raydist":  # names such as RAYDIST_STATE_DIR or COMMITTED live in strings
            tree = ast.parse(path.read_text())
            strings |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return modules, defined, strings


EXTERNAL_ROOTS = {"torch", "ray", "pytest", "pyarrow", "fsspec", "numpy", "horovod"}


def _class_members(name: str) -> Optional[Set[str]]:
    """A class's members, its raydist bases' included; None if no class has that name."""
    modules, _, _ = _code_index()
    found: Optional[Set[str]] = None
    for index in modules.values():
        if name in index.classes:
            found = (found or set()) | index.classes[name]
            for base in index.bases[name]:
                if base != name:
                    found |= _class_members(base) or set()
    return found


def _resolve_in_module(index: ModuleIndex, attrs: List[str]) -> bool:
    head, rest = attrs[0], attrs[1:]
    if head in index.names:
        return not rest or (head in index.classes and all(a in (_class_members(head) or set()) for a in rest[:1]))
    # an instance's attribute: a member of one of the module's classes (group.attach)
    return not rest and any(head in members for members in index.classes.values())


def _resolve_dotted(name: str) -> bool:
    modules = _code_index()[0]
    parts = name.split(".")
    if parts[0] == "raydist" and len(parts) == 2 and (parts[1] in raydist.__all__ or hasattr(raydist, parts[1])):
        return True
    if parts[0] in EXTERNAL_ROOTS or parts[0] in STDLIB:
        return True
    for k in range(len(parts), 0, -1):  # the longest module path the name starts with
        prefix = ".".join(parts[:k])
        candidates = [index for dotted, index in modules.items() if dotted == prefix or dotted.endswith("." + prefix)]
        if candidates:
            return k == len(parts) or any(_resolve_in_module(index, parts[k:]) for index in candidates)
    members = _class_members(parts[0])  # Class.member
    return members is not None and len(parts) == 2 and parts[1] in members


def _resolve_path(text: str) -> bool:
    pattern = re.sub(r"<[^>]+>", "*", text.rstrip("/"))
    roots = [REPO, REPO / "raydist", REPO / "raydist" / "pool"]
    if "/" not in pattern:  # a bare file name, anywhere in the package or at the root
        return bool(list(REPO.glob(pattern))) or bool(list((REPO / "raydist").rglob(pattern)))
    if any(list(root.glob(pattern)) or list(root.glob(pattern + ".py")) for root in roots):
        return True
    head, _, tail = pattern.rpartition("/")
    return "." in tail and not re.search(r"\.(py|md|yaml|yml|toml|sh)$", tail) and _resolve_dotted(f"{head}/{tail}".replace("/", "."))


def _strip_calls(text: str) -> str:
    while True:
        stripped = re.sub(r"\([^()]*\)", "", text)
        if stripped == text:
            return text
        text = stripped


def unresolved(span: str) -> Optional[str]:
    """Why ``span`` (a code span's text) names nothing that exists; None when it
    does, or when it is a plain word, a signature or literal markup."""
    text = span.strip()
    if not text or text.startswith("<!--") or re.fullmatch(r"[a-z][a-z0-9+.-]*://", text):
        return None
    for separator in ("→", "->", " = ", " / "):
        if separator in text:
            reasons = [unresolved(part) for part in text.split(separator)]
            return next((r for r in reasons if r), None)
    if text.startswith("make "):
        target = text.split()[1]
        return None if re.search(rf"^{re.escape(target)}:", (REPO / "Makefile").read_text(), re.M) else f"no make target {target!r}"
    if text.startswith("raydist "):
        command = text.split()[1]
        return None if command in reference._subparsers(build_parser()[0]) else f"no command 'raydist {command}'"
    if text.startswith("-"):
        flags = {f for spellings in _flags(build_parser()[0]).values() for f in spellings}
        return None if text.split()[0] in flags else f"no raydist flag {text!r}"
    text = _strip_calls(text.lstrip("@")).rstrip("=").strip()
    if not text:
        return None  # a signature: "(backend, dist_url, timeout)"
    if "/" in text or re.search(r"\.(py|md|yaml|yml|toml|sh)$", text):
        return None if _resolve_path(text) else f"no file {text!r}"
    _, defined, strings = _code_index()
    if text.startswith("."):
        return None if text[1:] in defined else f"no attribute {text!r}"
    if "." in text:
        return None if _resolve_dotted(text) else f"{text!r} resolves to nothing"
    if re.fullmatch(r"[a-z]+|__\w+__", text) or hasattr(builtins, text):
        return None  # a plain word, a dunder, a builtin
    if text in defined or (re.fullmatch(r"[A-Z][A-Z0-9_]*", text) and text in strings):
        return None
    return f"{text!r} is defined nowhere in raydist or the tests"


def _code_spans(markdown: str) -> Iterator[str]:
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    yield from re.findall(r"`([^`]+)`", prose)


def test_architecture_names_only_what_exists() -> None:
    problems = sorted({f"`{span}`: {reason}" for span in _code_spans(ARCHITECTURE.read_text()) if (reason := unresolved(span))})
    assert not problems, "docs/architecture.md names what does not exist:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "span",
    [
        "restart.WarmRestart",
        "rules.policy.decide",
        "rules/policy.decide",
        "records.PHASE_TRANSITIONS",
        "Lifecycle.move",
        "GroupBuilder.attempt",
        "group.attach(name, thing)",
        "pool/driver/controller.py",
        "pool/records",
        "backends/<name>/",
        "tests/unit/<area>/test_<module>.py",
        "fake.py",
        "--virtual-local-rank",
        "-n",
        "raydist debug",
        "make test",
        "RUNNING → STARTING → RUNNING",
        "ENTRY = BackendEntry(...)",
        "decide(error, Facts) -> Decision",
        ".restarted_in_place",
        "raydist.run",
        "raydist.backends",
        "concurrent.futures",
        "RAYDIST_STATE_DIR",
        "assert_nothing_left",
        "layout",
        "datasets=",
        "file://",
        "(backend, dist_url, timeout)",
    ],
)
def test_the_resolver_finds_what_exists(span: str) -> None:
    assert unresolved(span) is None


@pytest.mark.parametrize(
    "span",
    [
        "restart.WarmRestarts",
        "rules.policy.decides",
        "Lifecycle.moves",
        "pool/driver/controllers.py",
        "tests/unit/test_bad_inputs.py",
        "backends/<name>/nothing.py",
        "--no-such-flag",
        "raydist walk",
        "make nothing",
        "RunControllers",
        "SHUTTING_DOWNN",
        "ENTRY = BackendEntries(...)",
        "no_such_function()",
        ".no_such_attribute",
        "raydist.no_such_name",
    ],
)
def test_the_resolver_flags_what_does_not(span: str) -> None:
    assert unresolved(span) is not None


# -- runnable blocks -------------------------------------------------------------


def test_the_runnable_blocks_are_well_formed() -> None:
    blocks = reference.runnable_blocks()
    assert {b.path for b in blocks} >= {"README.md", "docs/getting-started.md"}
    readme = [b.language for b in blocks if b.path == "README.md"]
    assert readme == ["python", "bash"], "the README's quickstart: one Python and one CLI block"
    for block in blocks:
        assert block.language in ("python", "bash"), block
        if block.language == "python":
            compile(block.code, f"{block.path}:{block.line}", "exec")
            assert 'accelerator="cpu"' in block.code, f"{block.path}:{block.line} must run on CPU"
        else:
            assert all(line.startswith(("raydist ", "python ", "    ", "#")) for line in block.code.splitlines() if line), block


def test_a_marker_without_its_block_is_an_error(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable -->\nsome text\n")
    with pytest.raises(ValueError, match="must stand right before"):
        reference.runnable_blocks([page])


# -- the docs build itself ----------------------------------------------------


def test_a_broken_link_fails_the_docs_build_of_make_docs_and_make_test(tmp_path: Path) -> None:
    """``make docs`` and ``make test`` run the one ``docs-build`` recipe; a
    page that links to a missing page must fail it (``--quiet`` once hid
    such warnings from ``--strict``), and the clean pages must pass it."""
    import shutil
    import subprocess

    copy = tmp_path / "repo"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", ".venv", ".nox", "site", "__pycache__", "*.egg-info", ".*_cache"))

    def build() -> "subprocess.CompletedProcess[str]":
        command = ["make", "--no-print-directory", "-C", str(copy), "docs-build", f"PY={sys.executable}", f"SITE={tmp_path / 'site'}"]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    clean = build()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    with open(copy / "docs" / "guides" / "failures.md", "a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    broken = build()
    assert broken.returncode != 0
    assert "no-such-page.md" in broken.stdout + broken.stderr
