"""Print a pip constraints file pinning every floor pyproject.toml declares.

``pip install -c <(python .ci/floors.py) -e ".[test]"`` then installs the oldest versions we
claim to support, so a floor that does not work fails CI. The floors have one owner,
pyproject.toml: this file derives the pins and never lists a version of its own. The
``test`` extra's tools (hypothesis, ruff, mypy) are not floored: they check our code, they
are not what a user installs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

UNFLOORED_EXTRAS = {"test"}
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9._-]+)(\[[^\]]*\])?\s*([^;]*?)\s*(;.*)?$")


def floor_pin(requirement: str) -> str:
    """``name>=X,<Y; marker`` -> ``name==X; marker``; a requirement without a floor is refused."""
    match = _REQUIREMENT.match(requirement)
    if match is None:
        raise SystemExit(f"pyproject.toml: cannot read requirement {requirement!r}")
    name, _extras, specifiers, marker = match.groups()
    floors = [s.strip()[2:].strip() for s in specifiers.split(",") if s.strip().startswith(">=")]
    if len(floors) != 1:
        raise SystemExit(f"pyproject.toml: {requirement!r} declares no single '>=' floor")
    return f"{name}=={floors[0]}" + (f"; {marker[1:].strip()}" if marker else "")


def floor_pins(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    requirements = list(project["dependencies"])
    for extra, extra_requirements in project.get("optional-dependencies", {}).items():
        if extra not in UNFLOORED_EXTRAS:
            requirements += extra_requirements
    return sorted(dict.fromkeys(floor_pin(r) for r in requirements))


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print("\n".join(floor_pins(root / "pyproject.toml")))
