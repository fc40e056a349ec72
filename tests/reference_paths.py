"""Where the official SDK's reference outputs are: a run directory and the workspace that
made it, in ``shared/`` beside the clone (as ``.ci/run`` has it), or wherever
``OSMOSIS_REFERENCE_RUN`` names the run (its workspace sits beside it)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

_BESIDE_THE_CLONE = Path(__file__).resolve().parents[1].parent / "shared" / "reference-run"

REFERENCE_RUN = Path(os.environ.get("OSMOSIS_REFERENCE_RUN") or _BESIDE_THE_CLONE)
REFERENCE_WORKSPACE = REFERENCE_RUN.parent / "reference-workspace"

#: Tests that read the reference files skip where they are absent (a clone on its own, as
#: the README's test command may run); ``.ci/run`` checks they are there, so CI never skips.
needs_reference = pytest.mark.skipif(
    not REFERENCE_RUN.is_dir() or not REFERENCE_WORKSPACE.is_dir(),
    reason=f"the SDK's reference run and workspace are not at {REFERENCE_RUN.parent} "
    "(set OSMOSIS_REFERENCE_RUN to the reference run)",
)


def writable_copy(source: Path, destination: Path) -> Path:
    """A copy of *source* the test may change (the shared reference files are read-only)."""
    shutil.copytree(source, destination)
    for path in [destination, *destination.rglob("*")]:
        mode = os.lstat(path).st_mode
        os.chmod(path, mode | stat.S_IWUSR | stat.S_IRUSR | (stat.S_IXUSR if path.is_dir() else 0))
    return destination
