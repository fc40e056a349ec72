"""The maintainer docs cannot rot silently.

Code cites the contract as ``contract §x.y`` (docs/contract.md keeps the research spec's
section numbers), and docs/how-it-works.md names the module of every step. These tests
read files only: every cited section must be a heading of docs/contract.md, every module
how-it-works.md names must exist, and the docs' relative links must resolve.
"""

from __future__ import annotations

import re
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
        named.update(_PY_PATH.findall(span))
        named.update(_DOTTED.findall(span))
    return named


def _exists(name: str) -> bool:
    if name.endswith(".py"):
        rooted = name.startswith(("tests/", "pytest_osmosis/", "docs/", "bench/"))
        return (ROOT / name).is_file() if rooted else (PACKAGE / name).is_file()
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_module_how_it_works_names_exists() -> None:
    named = _named_modules(HOW_IT_WORKS.read_text(encoding="utf-8"))
    assert len(named) >= 20, f"the module pattern found too little: {sorted(named)}"
    missing = sorted(name for name in named if not _exists(name))
    assert not missing, f"docs/how-it-works.md names modules that do not exist: {missing}"


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
