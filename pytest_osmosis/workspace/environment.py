"""A rollout's own environment: whether ours satisfies it, and how to make its own.

``osmosis eval run`` never imports a rollout into its own process: it runs
``uv sync --project rollouts/<name>`` (honouring ``uv.lock``) and starts the entrypoint in
that environment (contract §1). Server mode does the same; this module owns the
decisions around it (which ``uv``, which interpreter, what our environment lacks), so that
``auto`` and the server agree on them.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from pytest_osmosis.core.errors import RolloutLoadError

PYPROJECT = "pyproject.toml"


def _read_pyproject(rollout_dir: Path) -> dict[str, object] | None:
    path = rollout_dir / PYPROJECT
    if not path.is_file():
        return None
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - 3.10
        import tomli as tomllib
    try:
        data: dict[str, object] = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RolloutLoadError(f"{path}: cannot read it: {exc}") from None
    return data


def unmet_requirements(rollout_dir: Path) -> list[str]:
    """What the rollout's ``pyproject.toml`` asks for that this environment does not have.

    Each entry is one requirement as written, with what we have (``litellm<1.100 (have
    1.108.0)``). Empty when there is no pyproject or every applicable requirement is met.
    """
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    data = _read_pyproject(rollout_dir)
    project = data.get("project") if data else None
    if not isinstance(project, dict):
        return []
    unmet: list[str] = []
    python = project.get("requires-python")
    if isinstance(python, str):
        try:
            here = ".".join(str(part) for part in sys.version_info[:3])
            if here not in SpecifierSet(python):
                unmet.append(f"python{python} (have {here})")
        except InvalidSpecifier:
            pass
    for raw in project.get("dependencies") or []:
        try:
            requirement = Requirement(str(raw))
        except InvalidRequirement:
            unmet.append(f"{raw} (not a requirement pip reads)")
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            have = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{raw} (not installed)")
            continue
        if requirement.specifier and not requirement.specifier.contains(have, prereleases=True):
            unmet.append(f"{raw} (have {have})")
    return unmet


def has_own_environment(rollout_dir: Path) -> bool:
    """A rollout with a ``pyproject.toml`` gets its own environment (``uv sync``)."""
    return (rollout_dir / PYPROJECT).is_file()


def find_uv() -> str:
    """``uv`` installed beside this interpreter (``pytest-osmosis[server]``), else on PATH."""
    for folder in dict.fromkeys((sysconfig.get_path("scripts"), str(Path(sys.executable).parent))):
        candidate = Path(folder) / "uv"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("uv")
    if found is None:
        raise RolloutLoadError(
            "uv is needed to build a rollout's own environment from its pyproject.toml "
            "(as `osmosis eval run` does): pip install 'pytest-osmosis[server]', name an "
            "interpreter that has osmosis-ai with --osmosis-server-python PYTHON, or run the "
            "rollout in this environment with --osmosis-execution in-process"
        )
    return found


def pick_interpreter(rollout_dir: Path) -> str | None:
    """The interpreter ``uv sync`` builds the rollout's environment on, never a download.

    This session's, when the rollout's ``requires-python`` (and ``.python-version``) allow
    it; else the pyenv build of an allowed minor version, else ``python3.X`` on PATH (as
    ``.ci/run`` picks one). None: let uv look (with downloads off it says what is missing).
    """
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    data = _read_pyproject(rollout_dir) or {}
    project = data.get("project")
    wanted = project.get("requires-python") if isinstance(project, dict) else None
    try:
        allowed = SpecifierSet(wanted) if isinstance(wanted, str) else SpecifierSet()
    except InvalidSpecifier:
        allowed = SpecifierSet()
    pinned = rollout_dir / ".python-version"
    prefix = pinned.read_text().strip() if pinned.is_file() else ""

    def fits(version: str) -> bool:
        return version in allowed and (not prefix or (version + ".").startswith(prefix + "."))

    here = ".".join(str(part) for part in sys.version_info[:3])
    if fits(here):
        return sys.executable
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    for minor in range(15, 8, -1):
        for candidate in sorted(glob.glob(f"{root}/versions/3.{minor}.*/bin/python"), reverse=True):
            version = Path(candidate).parent.parent.name
            if fits(version) and os.access(candidate, os.X_OK):
                return candidate
        on_path = shutil.which(f"python3.{minor}")
        if on_path is not None and fits(f"3.{minor}.0"):
            return on_path
    return None


def sdk_bootstrap() -> str | None:
    """The SDK's ``_server_bootstrap.py`` in this environment, found without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("osmosis_ai")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "eval" / "local" / "_server_bootstrap.py"
        if candidate.is_file():
            return str(candidate)
    return None
