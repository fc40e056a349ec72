"""What the official SDK's own upload planner (osmosis-ai, Python >= 3.12) says about a
run directory, asked in a subprocess of the Python named by ``OSMOSIS_SDK_PYTHON``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

SDK_PYTHON = Path(os.environ.get("OSMOSIS_SDK_PYTHON", "/work/venv312/bin/python"))

_PLANNER = r"""
import json, sys
from pathlib import Path
from osmosis_ai.eval.local.upload import LocalEvalUploadError, build_eval_upload_plan
try:
    plan = build_eval_upload_plan(Path(sys.argv[1]))
except LocalEvalUploadError as exc:
    print(json.dumps({"accepted": False, "refusal": str(exc)}))
else:
    print(json.dumps({"accepted": True, "files": sorted(f.path for f in plan.files)}))
"""


def sdk_judge(run_dir: Path) -> dict[str, Any]:
    """``{"accepted": bool, "files": [...]}`` or ``{"accepted": False, "refusal": ...}``;
    skips the test where no Python with osmosis-ai is available."""
    if not SDK_PYTHON.exists():
        pytest.skip(f"no Python with osmosis-ai at {SDK_PYTHON} (set OSMOSIS_SDK_PYTHON)")
    done = subprocess.run(
        [str(SDK_PYTHON), "-I", "-c", _PLANNER, str(run_dir)],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
        check=False,
    )
    if "No module named 'osmosis_ai'" in done.stderr:
        pytest.skip(f"osmosis-ai is not installed for {SDK_PYTHON}")
    assert done.returncode == 0, done.stderr
    verdict: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return verdict
