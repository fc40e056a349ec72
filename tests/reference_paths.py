"""Where the official SDK's reference outputs are: a run directory and the workspace that
made it, in ``shared/`` beside the clone (as ``.ci/run`` has it), or wherever
``OSMOSIS_REFERENCE_RUN`` names the run (its workspace sits beside it)."""

from __future__ import annotations

import os
from pathlib import Path

_BESIDE_THE_CLONE = Path(__file__).resolve().parents[1].parent / "shared" / "reference-run"

REFERENCE_RUN = Path(os.environ.get("OSMOSIS_REFERENCE_RUN") or _BESIDE_THE_CLONE)
REFERENCE_WORKSPACE = REFERENCE_RUN.parent / "reference-workspace"
