"""The documentation's generated pages, and its links to the repository.

MkDocs runs this file as a hook (``mkdocs.yml``). At build time it renders
the reference pages from the code itself, so no option or flag is written
out by hand anywhere:

* ``reference/options.md``: every ``RunConfig`` option, from its ``Option``
  record (``raydist.config``): default, ``raydist run`` flag, meaning;
* ``reference/cli.md``: every flag of ``raydist run`` and ``raydist debug``,
  from the argparse parser (``raydist.cli.build_parser``), and torchrun's
  flags honoured or refused (``raydist.cli.TORCHRUN_FLAGS``);
* ``reference/api.md``: every name in ``raydist.__all__``, from its
  docstring (mkdocstrings);
* ``reference/errors.md``: every exception the package exports, from its
  class and docstring.

A page may link to a file of the repository outside ``docs/`` by its path
from the page (``../../examples/ddp_raydist.py``), as the files read on a
code host: such a file is published with the site and the link rewritten to
that copy; a README outside ``docs/`` maps to the page that includes it. A
link to a file that does not exist is left alone, so ``mkdocs build
--strict`` fails on it.

The ``*_markdown`` functions import neither Ray nor torch
(``tests/unit/project/test_docs.py`` calls them directly).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import dataclasses
import importlib
import posixpath
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the package, when MkDocs runs outside its environment's install
    sys.path.insert(0, str(REPO))

OPTIONS_PAGE = "reference/options.md"
CLI_PAGE = "reference/cli.md"
API_PAGE = "reference/api.md"
ERRORS_PAGE = "reference/errors.md"

# The option families, by the module that holds their records (raydist.config.<module>).
FAMILIES: Dict[str, str] = {
    "placement": "Where the workers run",
    "process": "What each worker process gets",
    "lifecycle": "How a run starts, restarts and stops",
    "logs": "Where output goes",
}

# The API page's sections, by the module that defines the names.
API_SECTIONS: Dict[str, str] = {
    "raydist.api": "Running a function",
    "raydist.pool.driver.group": "Worker groups",
    "raydist.config": "Options",
    "raydist.core.initialize": "Inside a rank",
    "raydist.core.collectives": "Object collectives",
    "raydist.core.state": "Training state",
    "raydist.core.preemption": "Preemption",
    "raydist.pool.rules.datasets": "Ray Data",
    "raydist.pool.worker.datasets": "Ray Data",
    "raydist.core.environment": "Launcher environment",
    "raydist.errors": "Errors",
    "raydist.core.compat": "open_clip's helpers",
}

# READMEs outside docs/ and the page that shows each.
REPO_PAGES: Dict[str, str] = {
    "README.md": "index.md",
    "benchmarks/README.md": "benchmarks.md",
    "tests/README.md": "tests.md",
    "cluster_configs/README.md": "guides/clusters.md",
}


# -- text -------------------------------------------------------------------


def _escape(text: str) -> str:
    """Text for a markdown table cell: code spans (``x`` or `x`) kept as code,
    the rest escaped so that no character starts markup or ends the cell."""
    parts = re.split(r"(``.+?``|`[^`]+`)", text)
    out = []
    for part in parts:
        if part.startswith("`"):
            out.append("`" + part.strip("`").replace("|", "\\|") + "`")
            continue
        part = part.replace("\\", "\\\\").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        for char in "|*_[]":
            part = part.replace(char, "\\" + char)
        out.append(part)
    return " ".join("".join(out).split())


def _code(text: str) -> str:
    """A table cell's code span (backticks inside it doubled out)."""
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


# Front matter of a page whose tables need the width of the table of contents.
WIDE = ["---", "hide:", "  - toc", "---", ""]


# -- RunConfig options ------------------------------------------------------


class OptionEntry(NamedTuple):
    """One option as the reference shows it."""

    name: str
    default: Any
    doc: str
    family: str  # the module of raydist.config that holds its record
    flags: Tuple[str, ...]  # its `raydist run` spellings; () where Python only
    flag_note: str  # how the CLI sets it where no flag of its own does ("set by -n ...")
    metavar: Optional[str]


def option_fields() -> Tuple["dataclasses.Field[Any]", ...]:
    """RunConfig's fields, in their public order."""
    from raydist.config import RunConfig

    return tuple(dataclasses.fields(RunConfig))


def option_entries(fields: Optional[Sequence["dataclasses.Field[Any]"]] = None) -> List[OptionEntry]:
    """One entry per field, read from its ``Option`` record."""
    from raydist.config import option_default
    from raydist.config.option import option_of

    families = {name: importlib.import_module(f"raydist.config.{name}") for name in FAMILIES}
    entries = []
    for field in option_fields() if fields is None else fields:
        option = option_of(field)
        family = next((name for name, module in families.items() if any(v is option for v in vars(module).values())), "other")
        flag = option.flag
        generated = flag is not None and flag.generated
        entries.append(
            OptionEntry(
                name=field.name,
                default=option_default(field),
                doc=option.doc,
                family=family,
                flags=flag.flags if generated and flag is not None else (),
                flag_note=flag.help if flag is not None and not flag.generated else "",
                metavar=flag.metavar if flag is not None else None,
            )
        )
    return entries


def _flag_cell(entry: OptionEntry) -> str:
    if entry.flags:
        first, *others = entry.flags
        text = _code(f"{first} {entry.metavar}" if entry.metavar else first)
        link = f"[{text}]({posixpath.relpath(CLI_PAGE, posixpath.dirname(OPTIONS_PAGE))}#{_flag_anchor(first)})"
        return link + ("" if not others else " (" + ", ".join(_code(o) for o in others) + ")")
    if entry.flag_note:  # "set by -n/--nproc-per-node with --nnodes": the flags as code
        return re.sub(r"(?<![\w`])(--?[a-z][\w-]*(?:/--?[a-z][\w-]*)*)", lambda m: _code(m.group(1)), entry.flag_note)
    return "Python only"


def options_markdown(fields: Optional[Sequence["dataclasses.Field[Any]"]] = None) -> str:
    """The options page: a table per family, one row per option."""
    entries = option_entries(fields)
    lines = [
        *WIDE,
        "# RunConfig options",
        "",
        "Every option of `raydist.run`, `raydist.WorkerGroup` and `raydist.RunConfig`, "
        "and the `raydist run` flag that sets it. Give them as keywords "
        "(`raydist.run(fn, num_workers=4, max_restarts=2)`), or build a `RunConfig` once and pass "
        "`config=` (`config.replace(...)` makes a checked variant). Every option is checked when the "
        "configuration is built, before Ray is touched: a bad value raises `TypeError` or `ValueError` "
        "naming the option, and a bad flag makes `raydist run` exit 2.",
        "",
        "*This page is generated from the options' records in `raydist.config`.*",
    ]
    for family, title in [*FAMILIES.items(), ("other", "Other options")]:
        rows = [
            (f'<a id="{e.name}"></a>`{e.name}`', _code(repr(e.default)), _flag_cell(e), _escape(e.doc))
            for e in entries
            if e.family == family
        ]
        if rows:
            lines += ["", f"## {title}", "", *_table(("option", "default", "`raydist run`", "meaning"), rows)]
    return "\n".join(lines) + "\n"


# -- raydist run ------------------------------------------------------------


def _flag_anchor(flag: str) -> str:
    return "flag" + re.sub(r"[^a-z0-9]+", "-", flag.lower()).rstrip("-")


def _subparsers(parser: argparse.ArgumentParser) -> Dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_text(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if "%" in text:
        params = dict(vars(action), prog=parser.prog)
        text = text % params
    return text


def _action_row(action: argparse.Action, parser: argparse.ArgumentParser, option_names: Sequence[str]) -> Tuple[str, ...]:
    if action.option_strings:
        first, *others = action.option_strings
        metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        spelled = f'<a id="{_flag_anchor(first)}"></a>{_code(first + metavar)}'
        if others:
            spelled += " (" + ", ".join(_code(o) for o in others) + ")"
    else:
        spelled = _code(str(action.metavar or action.dest))
    help_text = _escape(_help_text(action, parser))
    if action.choices is not None and not isinstance(action.choices, dict):
        help_text += " Choices: " + ", ".join(_code(str(c)) for c in action.choices) + "."
    dest = action.dest
    option = f"[`{dest}`]({posixpath.relpath(OPTIONS_PAGE, posixpath.dirname(CLI_PAGE))}#{dest})" if dest in option_names else ""
    return spelled, help_text, option


def cli_markdown(parser: Optional[argparse.ArgumentParser] = None) -> str:
    """The command-line page: each sub-command's flags, by argparse group."""
    from raydist.cli import HONOURED, TORCHRUN_FLAGS, build_parser
    from raydist.config import OPTION_NAMES

    if parser is None:
        parser = build_parser()[0]
    lines = [
        *WIDE,
        "# The raydist command",
        "",
        "`raydist run` is torchrun on a Ray cluster; `raydist debug` attaches a terminal to a rank waiting in pdb. "
        "`python -m raydist` is the same command. A flag that sets a [RunConfig option](options.md) says which.",
        "",
        "*This page is generated from the command's argparse parser (`raydist.cli.build_parser`).*",
    ]
    for name, sub in _subparsers(parser).items():
        lines += ["", f"## raydist {name}", ""]
        if sub.description:
            lines += [_escape(sub.description), ""]
        for group in sub._action_groups:
            actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
            if not actions:
                continue
            title = {"positional arguments": "arguments", "options": "flags", "optional arguments": "flags"}.get(
                group.title or "", group.title
            )
            rows = [_action_row(a, sub, OPTION_NAMES) for a in actions]
            lines += [f"### {name}: {title}", "", *_table(("flag", "what it does", "option"), rows), ""]
        if sub.epilog:
            lines += ["```text", sub.epilog.rstrip(), "```", ""]
    rows = [(_code(flag), kind, _escape(how)) for flag, (kind, how) in TORCHRUN_FLAGS.items()]
    lines += [
        "## torchrun's flags",
        "",
        f"Every flag of `torchrun --help` is either {HONOURED} or refused with its reason "
        "(`raydist.cli.TORCHRUN_FLAGS`; a test reads `torchrun --help` and fails on a flag that is neither). "
        "A refused flag makes `raydist run` exit 2 with the reason.",
        "",
        *_table(("torchrun flag", "raydist", "how, or why not"), rows),
    ]
    return "\n".join(lines) + "\n"


# -- the Python API ---------------------------------------------------------


def exported_names() -> Dict[str, str]:
    """``raydist.__all__``: each public name and the module that defines it."""
    import raydist

    names: Dict[str, str] = dict(raydist._EXPORTS)
    names.update(raydist._SUBMODULES)
    assert set(names) == set(raydist.__all__), "raydist.__all__ and its modules disagree"
    return names


def _api_anchor(name: str, module: str) -> str:
    return module if module.endswith(f".{name}") or module == name else f"{module}.{name}"


def api_markdown(exports: Optional[Mapping[str, str]] = None) -> str:
    """The API page: one mkdocstrings entry per public name, by section."""
    exports = exported_names() if exports is None else exports
    sections: Dict[str, List[Tuple[str, str]]] = {}
    for name, module in exports.items():
        sections.setdefault(API_SECTIONS.get(module, "Other names"), []).append((name, module))
    lines = [
        "# Python API",
        "",
        "Every name `import raydist` exports (`raydist.__all__`), from its docstring. "
        "Options are on [RunConfig options](options.md); what each error means, on [Errors](errors.md).",
        "",
        "*This page is generated from `raydist.__all__` and the docstrings.*",
    ]
    order = list(dict.fromkeys(API_SECTIONS.values()))
    for title, members in sorted(sections.items(), key=lambda item: order.index(item[0]) if item[0] in order else len(order)):
        lines += ["", f"## {title}", ""]
        for name, module in members:
            target = _api_anchor(name, module)
            public = "raydist.compat" if module == target else f"raydist.{name}"
            lines += [f"::: {target}", "    options:", f"      heading: {public}", "      show_root_full_path: false"]
            if name == "RunConfig":  # its fields are the options page; the class text lists them too
                lines += ["      show_signature: false", "      members: [replace]"]
            if name == "compat":
                lines += ["      show_submodules: false"]
            lines.append("")
    return "\n".join(lines) + "\n"


# -- errors -----------------------------------------------------------------


class ExceptionEntry(NamedTuple):
    name: str
    module: str
    bases: Tuple[str, ...]
    doc: str


def module_path(module: str) -> Path:
    """A module's source file, found without importing it (or its packages)."""
    base = REPO.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _classes(module: str) -> Dict[str, ast.ClassDef]:
    tree = ast.parse(module_path(module).read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _builtin_exception(name: str) -> bool:
    value = getattr(builtins, name, None)
    return name == "CancelledError" or (isinstance(value, type) and issubclass(value, BaseException))


def exception_entries(exports: Optional[Mapping[str, str]] = None) -> List[ExceptionEntry]:
    """The exported exceptions, read from their source (nothing is imported)."""
    exports = exported_names() if exports is None else exports
    entries: List[ExceptionEntry] = []
    known: Dict[str, bool] = {}
    for name, module in exports.items():
        classes = _classes(module) if module.startswith("raydist.") and name[:1].isupper() else {}
        node = classes.get(name)
        if node is None:
            continue
        bases = tuple(ast.unparse(base).split(".")[-1] for base in node.bases)
        if any(_builtin_exception(b) or known.get(b, False) for b in bases):
            known[name] = True
            entries.append(ExceptionEntry(name, module, bases, " ".join((ast.get_docstring(node) or "").split("\n\n")[0].split())))
    return entries


def errors_markdown(exports: Optional[Mapping[str, str]] = None) -> str:
    entries = sorted(exception_entries(exports), key=lambda e: e.module != "raydist.errors")  # the base first
    api = posixpath.relpath(API_PAGE, posixpath.dirname(ERRORS_PAGE))
    rows = [
        (f"[`raydist.{e.name}`]({api}#{_api_anchor(e.name, e.module)})", ", ".join(_code(b) for b in e.bases), _escape(e.doc))
        for e in entries
    ]
    lines = [
        "# Errors",
        "",
        "What raydist raises about a run. Each error of `raydist.errors` derives from `raydist.RaydistError` "
        "and also keeps the built-in base it always had, so an existing `except TimeoutError` or "
        "`except RuntimeError` still catches it. A call on a group whose Ray was shut down raises `RuntimeError`.",
        "",
        "*This table is generated from the exported exception classes and their docstrings.*",
        "",
        *_table(("exception", "is a", "meaning"), rows),
        "",
        "Before any worker starts, bad input fails with Python's own exceptions: a bad option or call raises "
        "`TypeError` or `ValueError` naming the option; a backend whose library is missing raises `ImportError` "
        "saying what to install; a Ray address that cannot be reached (or that rejects this driver's token) "
        "raises `ConnectionError` naming the address. What a failure report says, rank by rank: "
        "[Failures and the report](../guides/failures.md).",
    ]
    return "\n".join(lines) + "\n"


GENERATED = {OPTIONS_PAGE: options_markdown, CLI_PAGE: cli_markdown, API_PAGE: api_markdown, ERRORS_PAGE: errors_markdown}


# -- runnable examples ----------------------------------------------------

# Put on the line before a fenced block that runs as written (CPU, 2 workers);
# tests/live/test_docs_examples.py runs every such block.
RUNNABLE = "<!-- runnable -->"


class Block(NamedTuple):
    """A fenced block marked runnable."""

    path: str  # the file, from the repository's root
    line: int  # the fence's line, from 1
    language: str  # "python" or "bash"
    code: str


def markdown_files() -> List[Path]:
    """The README and every page under docs/."""
    docs = REPO / "docs"
    return [REPO / "README.md", *sorted(_page_files(docs))]


def runnable_blocks(paths: Optional[Sequence[Path]] = None) -> List[Block]:
    blocks = []
    for path in markdown_files() if paths is None else paths:
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.strip() != RUNNABLE:
                continue
            fence = number + 1
            if fence >= len(lines) or not lines[fence].startswith("```"):
                raise ValueError(f"{path}:{number + 1}: {RUNNABLE} must stand right before a fenced block")
            end = next((i for i in range(fence + 1, len(lines)) if lines[i].startswith("```")), None)
            if end is None:
                raise ValueError(f"{path}:{fence + 1}: the fenced block never ends")
            code = "\n".join(lines[fence + 1 : end]) + "\n"
            name = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
            blocks.append(Block(name, fence + 1, lines[fence][3:].strip(), code))
    return blocks


# -- links to the repository ------------------------------------------------

_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\s+\"[^\"]*\")?\)")


def repo_target(page_src: Path, target: str, docs_dir: Path) -> Optional[str]:
    """The repository path a page's relative link names when it leaves
    ``docs/`` and the file exists; None otherwise."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
        return None
    path = (page_src.parent / target).resolve()
    try:
        path.relative_to(docs_dir)
        return None
    except ValueError:
        pass
    try:
        relative = path.relative_to(REPO).as_posix()
    except ValueError:
        return None
    return relative if path.is_file() else None


def _page_files(docs_dir: Path) -> Iterable[Path]:
    return (p for p in docs_dir.rglob("*.md") if "hooks" not in p.relative_to(docs_dir).parts)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for src_uri, render in GENERATED.items():
        files.append(File.generated(config, src_uri, content=render()))
    docs_dir = Path(config["docs_dir"]).resolve()
    published = set()
    # A README that a page includes links from its own place (include-markdown rewrites those links to the page's).
    for page in [*_page_files(docs_dir), *(REPO / readme for readme in REPO_PAGES)]:
        for match in _LINK.finditer(page.read_text()):
            relative = repo_target(page, match.group(2), docs_dir)
            if relative is not None and relative not in REPO_PAGES and relative not in published:
                published.add(relative)
                files.append(File.generated(config, relative, abs_src_path=str(REPO / relative)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.abs_src_path is None:
        return markdown
    docs_dir = Path(config["docs_dir"]).resolve()
    page_src = Path(page.file.abs_src_path).resolve()

    def rewrite(match: "re.Match[str]") -> str:
        relative = repo_target(page_src, match.group(2), docs_dir)
        if relative is None:
            return match.group(0)
        site_path = REPO_PAGES.get(relative, relative)
        new = posixpath.relpath(site_path, posixpath.dirname(page.file.src_uri))
        return f"{match.group(1)}{new}{match.group(3) or ''}{match.group(4) or ''})"

    return _LINK.sub(rewrite, markdown)
