"""Which paths are eval configs, and finding those a session will collect before collection
(the xdist controller never collects, yet must open run directories before workers start)."""

from __future__ import annotations

from pathlib import Path

import pytest


def is_eval_config(path: Path) -> bool:
    """``<workspace>/configs/eval/<name>.toml``: the layout every Osmosis workspace has.

    Lives here, not in plan.py, so that deciding whether to enable imports nothing heavy.
    """
    return (
        path.suffix == ".toml"
        and path.parent.name == "eval"
        and path.parent.parent.name == "configs"
    )


def unused_eval_configs(config: pytest.Config) -> str | None:
    """The first ``configs/eval/*.toml`` in (or one level below) a directory pytest was given."""
    base = config.invocation_params.dir
    for directory in named_paths(config):
        if not directory.is_dir():
            continue
        for pattern in ("configs/eval/*.toml", "*/configs/eval/*.toml"):
            for path in sorted(directory.glob(pattern)):
                return str(path.relative_to(base)) if path.is_relative_to(base) else str(path)
    return None


def no_eval_configs_here(config: pytest.Config) -> str | None:
    """The plugin on but no ``configs/eval/*.toml`` under the paths pytest was given (run from
    a rollout's own directory, say): the line that says so, naming the workspace above them
    that has some. None when there are configs (a ``-k`` that deselected every item)."""
    named = named_paths(config)
    if find_eval_configs(config, named):
        return None
    base = config.invocation_params.dir
    shown = ", ".join(_shown(path, base) for path in named)
    for path in named:
        start = path if path.is_dir() else path.parent
        for parent in (start, *start.parents):
            configs = sorted(parent.glob("configs/eval/*.toml"))
            if configs:
                some = f"{len(configs)} eval config{'s' if len(configs) != 1 else ''}"
                return (
                    f"osmosis: no configs/eval/*.toml under {shown}; the workspace at "
                    f"{_shown(parent, base)} has {some}: run pytest --osmosis-eval there, or "
                    f"name one: pytest {_shown(configs[0], base)}"
                )
    return f"osmosis: no configs/eval/*.toml under {shown}, nor in a directory above it"


def _shown(path: Path, base: Path) -> str:
    """``path`` as typed from ``base``: relative below it or within a workspace above it."""
    import os

    relative = os.path.relpath(path, base)
    return relative if Path(relative).parts[:4].count("..") < 4 else str(path)


def named_paths(config: pytest.Config) -> list[Path]:
    """The paths given on the command line (node ids cut to their file), resolved."""
    base = config.invocation_params.dir
    return [(base / arg.split("::", 1)[0]).resolve() for arg in config.args]


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
