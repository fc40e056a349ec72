"""The maintainer docs cannot rot silently.

Code cites the contract as ``contract §x.y`` (docs/contract.md keeps the research spec's
section numbers), and docs/how-it-works.md names the module of every step. These tests
read files only: every cited section must be a heading of docs/contract.md, every module
the docs name must exist, every ``module.py::name`` (or ``module.py::Class.method``) they
name must be defined there, and the docs' relative links must resolve. The README's and docs/sdk-call-routes.md's
``module.py::name`` citations count too, and so do the ones into the official SDK's
source (checked against the SDK that ``OSMOSIS_SDK_PYTHON`` names).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pytest_osmosis"
DOCS = ROOT / "docs"
CONTRACT = DOCS / "contract.md"
HOW_IT_WORKS = DOCS / "how-it-works.md"

#: ``contract §3``, ``contract §6–§7``, ``contract §3, §7.1``: every § of the run counts.
_CITATION = re.compile(
    r"contract\s+§\d+(?:\.\d+)*(?:\s*(?:,|–|-|and)\s*§\d+(?:\.\d+)*)*", re.IGNORECASE
)
_SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
#: A bare ``(§3.2)`` in the package or the tests cites the contract too, unless it follows
#: another document's name (``issue 4 §7``, ``design.md §3``).
_BARE = re.compile(r"(?<!§)(?<![\d.])§(\d+(?:\.\d+)*)")
_OTHER_DOCUMENT = re.compile(r"(?:issue\s+\d+|\.md`*|spec)\s*$", re.IGNORECASE)
_HEADING = re.compile(r"^#{2,4}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
_APPENDIX = re.compile(r"\bAppendix ([A-Z])\b")
_APPENDIX_HEADING = re.compile(r"^#{2,4}\s+Appendix ([A-Z])\b", re.MULTILINE)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_PY_PATH = re.compile(r"(?<![\w./])((?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py)\b")
_DOTTED = re.compile(r"\bpytest_osmosis(?:\.[A-Za-z_]\w*)+")
#: ``plugin.py::pytest_configure``, ``session.py::EvalSession.open_runs``: a module and a
#: name defined in it (a call's arguments after the name are allowed, ``f(x=1)``).
_QUALIFIED = re.compile(
    r"(?<![\w./])((?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py)::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)"
)
#: Paths into the official SDK's source (``osmosis_ai/eval/local/upload.py``), not ours.
_SDK_PATH = "osmosis_ai/"
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _sources() -> list[Path]:
    """Every Python file of the package and the tests (this one included)."""
    return sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")])


def _citations() -> dict[str, list[str]]:
    """Cited section number -> the files citing it."""
    cited: dict[str, list[str]] = {}
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for run in _CITATION.findall(text):
            for number in _SECTION.findall(run):
                cited.setdefault(number, []).append(str(path.relative_to(ROOT)))
    return cited


def test_every_contract_citation_is_a_section_of_docs_contract_md() -> None:
    headings = set(_HEADING.findall(CONTRACT.read_text(encoding="utf-8")))
    cited = _citations()
    assert len(cited) >= 10, f"the citation pattern found too little: {sorted(cited)}"
    missing = {number: files for number, files in cited.items() if number not in headings}
    assert not missing, f"cited but not a heading of docs/contract.md: {missing}"


def test_every_bare_section_sign_is_a_section_of_docs_contract_md() -> None:
    headings = set(_HEADING.findall(CONTRACT.read_text(encoding="utf-8")))
    missing: dict[str, list[str]] = {}
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for match in _BARE.finditer(text):
            before = text[max(0, match.start() - 16) : match.start()]
            if _OTHER_DOCUMENT.search(before) or match.group(1) in headings:
                continue
            missing.setdefault(match.group(1), []).append(str(path.relative_to(ROOT)))
    assert not missing, f"§ cited but not a heading of docs/contract.md: {missing}"


def test_every_appendix_the_code_cites_exists() -> None:
    appendices = set(_APPENDIX_HEADING.findall(CONTRACT.read_text(encoding="utf-8")))
    cited = {
        letter
        for path in _sources()
        for letter in _APPENDIX.findall(path.read_text(encoding="utf-8"))
    }
    assert cited <= appendices, f"cited but absent from docs/contract.md: {cited - appendices}"


def test_contract_md_keeps_the_spec_numbering() -> None:
    """The top-level sections 0-14 are all there, in order, each once."""
    numbers = _HEADING.findall(CONTRACT.read_text(encoding="utf-8"))
    top = [n for n in numbers if "." not in n]
    assert top == [str(i) for i in range(15)], top
    assert len(numbers) == len(set(numbers)), f"a section number is used twice: {numbers}"


def _named_modules(text: str) -> set[str]:
    """Module paths in code spans: ``plugin.py::X``, ``results/rundir.py``, ``pytest_osmosis.x``."""
    named: set[str] = set()
    for span in _CODE_SPAN.findall(text):
        named.update(p for p in _PY_PATH.findall(span) if not p.startswith(_SDK_PATH))
        named.update(_DOTTED.findall(span))
    return named


def _module_file(name: str) -> Path:
    """``results/rundir.py`` is ``pytest_osmosis/results/rundir.py``; rooted paths stay."""
    rooted = name.startswith(("tests/", "pytest_osmosis/", "docs/", "bench/"))
    return ROOT / name if rooted else PACKAGE / name


def _exists(name: str) -> bool:
    if name.endswith(".py"):
        return _module_file(name).is_file()
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _bound_names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """Names a module or class body defines: def, class, assignment (also under if/try)."""
    names: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names[leaf.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.If):
            names.update(_bound_names(node.body))
            names.update(_bound_names(node.orelse))
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                names.update(_bound_names(block))
            for handler in node.handlers:
                names.update(_bound_names(handler.body))
    return names


def _defines(module: Path, qualified: str) -> bool:
    """Whether ``module`` defines ``name`` at top level, or ``Class.member`` in its class."""
    names = _bound_names(ast.parse(module.read_text(encoding="utf-8")).body)
    first, _, member = qualified.partition(".")
    node = names.get(first)
    if node is None:
        return False
    if not member:
        return True
    return isinstance(node, ast.ClassDef) and member in _bound_names(node.body)


def _qualified_names(text: str) -> set[tuple[str, str]]:
    """``(module path, name)`` for every ``path.py::name`` in a code span."""
    return {
        (path, name)
        for span in _CODE_SPAN.findall(text)
        for path, name in _QUALIFIED.findall(span)
        if not path.startswith(_SDK_PATH)
    }


@pytest.mark.parametrize("doc", ["how-it-works.md", "contract.md"])
def test_every_module_the_docs_name_exists(doc: str) -> None:
    named = _named_modules((DOCS / doc).read_text(encoding="utf-8"))
    assert len(named) >= 20, f"the module pattern found too little: {sorted(named)}"
    missing = sorted(name for name in named if not _exists(name))
    assert not missing, f"docs/{doc} names modules that do not exist: {missing}"


@pytest.mark.parametrize(
    ("doc", "at_least"),
    [
        ("docs/how-it-works.md", 20),
        ("docs/contract.md", 20),
        ("docs/sdk-call-routes.md", 1),
        ("README.md", 1),
    ],
)
def test_every_name_the_docs_give_a_module_is_defined_there(doc: str, at_least: int) -> None:
    qualified = _qualified_names((ROOT / doc).read_text(encoding="utf-8"))
    assert len(qualified) >= at_least, f"the name pattern found too little: {sorted(qualified)}"
    undefined = sorted(
        f"{path}::{name}"
        for path, name in qualified
        if not _module_file(path).is_file() or not _defines(_module_file(path), name)
    )
    assert not undefined, f"{doc} names what its module does not define: {undefined}"


def _sdk_source() -> Path:
    """The official SDK's installed package directory (``osmosis_ai/``), found without
    importing it, in the interpreter ``OSMOSIS_SDK_PYTHON`` names; a skip without one."""
    python = os.environ.get("OSMOSIS_SDK_PYTHON")
    if not python:
        pytest.skip("the SDK's source is cited: set OSMOSIS_SDK_PYTHON to check it")
    found = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('osmosis_ai').origin)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(found.stdout.strip()).parent.parent


def test_every_name_the_docs_cite_from_the_sdk_is_defined_there() -> None:
    """``osmosis_ai/eval/local/runner.py::_classify_outcome``: the SDK version we pin
    (0.3.8) still defines what the docs say we follow."""
    cited = {
        (path, name)
        for doc in ("docs/how-it-works.md", "docs/contract.md", "README.md")
        for span in _CODE_SPAN.findall((ROOT / doc).read_text(encoding="utf-8"))
        for path, name in _QUALIFIED.findall(span)
        if path.startswith(_SDK_PATH)
    }
    assert cited, "the docs cite no SDK source any more: drop this test"
    root = _sdk_source()
    undefined = sorted(
        f"{path}::{name}"
        for path, name in cited
        if not (root / path).is_file() or not _defines(root / path, name)
    )
    assert not undefined, f"the docs cite what the SDK does not define: {undefined}"


def test_the_name_check_reads_definitions_not_mentions() -> None:
    """The checker itself: a def, a method, an assignment count; a mere mention does not."""
    here = "tests/test_docs.py"
    assert _defines(_module_file(here), "_defines")
    assert _defines(_module_file(here), "_QUALIFIED")
    assert not _defines(_module_file(here), "ast")  # imported, not defined
    assert _defines(_module_file("plugin/session.py"), "EvalSession.open_runs")
    assert not _defines(_module_file("plugin/session.py"), "EvalSession.no_such_method")
    assert _qualified_names("`a/b.py::C.d(x=1)` and `osmosis_ai/x.py::y`") == {("a/b.py", "C.d")}


@pytest.mark.parametrize("doc", ["how-it-works.md", "contract.md", "sdk-call-routes.md"])
def test_relative_links_of_the_docs_resolve(doc: str) -> None:
    path = DOCS / doc
    links = [
        link
        for link in _LINK.findall(path.read_text(encoding="utf-8"))
        if "://" not in link and not link.startswith("mailto:")
    ]
    missing = [link for link in links if not (path.parent / link).exists()]
    assert not missing, f"{doc}: links to nothing: {missing}"


def test_no_markdown_file_holds_a_merge_conflict_marker() -> None:
    """A stray ``=======`` line turns the paragraph above it into a heading (README, once)."""
    marker = re.compile(r"^(<{7}|={7}|>{7})( |$)", re.MULTILINE)
    markdown = [ROOT / "README.md", *DOCS.glob("*.md"), ROOT / "bench" / "README.md"]
    found = [
        f"{path.name}: {m.group(0)!r}" for path in markdown for m in marker.finditer(path.read_text())
    ]
    assert not found, found
