"""The package's layout shows its architecture: only the plugin and a few top-level modules know pytest.

Subpackages (core/, workspace/, dataset/, execution/, model/, rubric/, results/, report/,
commands/) are plain libraries that a command, a benchmark or another runner can use without
pytest; plugin/ (session, controller, collect, xdist, ...) and a few top-level modules adapt
them to pytest. A library subpackage importing pytest, its internals, xdist or pluggy fails
here: in its source, and in a fresh interpreter that imports every one of its modules (an
import of the pytest side from a library would bring pytest in).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_osmosis

PACKAGE = Path(pytest_osmosis.__file__).resolve().parent
PYTEST_WORLD = ("pytest", "_pytest", "xdist", "pluggy", "pytest_timeout")
PYTEST_ADAPTER = "plugin"  # the one subpackage that is the pytest side
SUBPACKAGES = [
    "commands", "core", "dataset", "execution", "model", "report", "results", "rubric", "workspace"
]


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_only_top_level_modules_import_pytest() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(_imported_roots(path) & set(PYTEST_WORLD))
        for path in sorted(PACKAGE.glob("*/**/*.py"))
        if path.relative_to(PACKAGE).parts[0] != PYTEST_ADAPTER
        and _imported_roots(path) & set(PYTEST_WORLD)
    }
    assert offenders == {}


def test_the_subpackages_exist_and_say_what_they_are() -> None:
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert packages == [
        "commands",
        "core",
        "dataset",
        "execution",
        "model",
        "plugin",
        "report",
        "results",
        "rubric",
        "workspace",
    ]
    for name in packages:
        assert ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text())), name


def test_the_public_import_paths_stay() -> None:
    import importlib

    for name in ("pytest_osmosis.plugin", "pytest_osmosis.rollout", "pytest_osmosis.hookspecs"):
        importlib.import_module(name)
    from pytest_osmosis.cli import main

    assert callable(main)


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_importing_a_subpackage_loads_no_pytest(package: str) -> None:
    modules = sorted(
        f"pytest_osmosis.{package}" + ("" if path.stem == "__init__" else f".{path.stem}")
        for path in (PACKAGE / package).glob("*.py")
    )
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in {PYTEST_WORLD!r} if m in sys.modules))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=PACKAGE.parent
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"importing pytest_osmosis.{package} loads {out.stdout}"


def test_the_fast_lane_mirrors_the_libraries_and_starts_no_session() -> None:
    """``tests/unit/<package>/`` holds the tests of the pytest-free subpackages, and none of
    them starts a pytest session (pytester), so a change to a library answers in seconds."""
    unit = Path(__file__).resolve().parent / "unit"
    mirrored = {p.name for p in unit.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert mirrored and mirrored <= set(SUBPACKAGES), mirrored - set(SUBPACKAGES)
    sessions = sorted(
        str(path.relative_to(unit)) for path in unit.rglob("*.py") if "pytester" in path.read_text()
    )
    assert sessions == []
