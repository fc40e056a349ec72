"""Find the eval configs a session will collect, before collection (the xdist controller
never collects, yet must open run directories before workers start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_osmosis.plugin import is_eval_config

_SKIP_DIRS = {".git", ".osmosis", ".venv", "venv", "node_modules", "__pycache__", ".tox"}


def find_eval_configs(config: pytest.Config, named: list[Path]) -> list[Path]:
    """Every ``configs/eval/*.toml`` under the named paths, sorted, as collection will see them."""
    found: set[Path] = set()
    for path in named:
        if path.is_file():
            if is_eval_config(path):
                found.add(path.resolve())
        elif path.is_dir():
            for candidate in path.rglob("*.toml"):
                parts = candidate.relative_to(path).parts[:-1]
                if any(p in _SKIP_DIRS or p.startswith(".") for p in parts):
                    continue
                if is_eval_config(candidate) and not _ignored(config, candidate):
                    found.add(candidate.resolve())
    return sorted(found)


def _ignored(config: pytest.Config, path: Path) -> bool:
    ignore = config.getoption("ignore", None) or []
    return any(path.resolve().is_relative_to(Path(p).resolve()) for p in ignore)
