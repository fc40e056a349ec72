"""What the official SDK's own upload planner (osmosis-ai, Python >= 3.12) says about a
run directory, asked in a subprocess of the Python named by ``OSMOSIS_SDK_PYTHON``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

#: The Python with osmosis-ai; unset means the tests that need it skip (CI sets it).
SDK_PYTHON: Path | None = (
    Path(os.environ["OSMOSIS_SDK_PYTHON"]) if os.environ.get("OSMOSIS_SDK_PYTHON") else None
)
SDK_MISSING = (
    "OSMOSIS_SDK_PYTHON is not set (a Python with osmosis-ai)"
    if SDK_PYTHON is None
    else f"no Python with osmosis-ai at {SDK_PYTHON} (set OSMOSIS_SDK_PYTHON)"
)


def sdk_python_imports(module: str) -> bool:
    """Whether ``OSMOSIS_SDK_PYTHON`` is set and can import ``module`` (of osmosis-ai)."""
    if SDK_PYTHON is None or not SDK_PYTHON.exists():
        return False
    probe = subprocess.run(
        [str(SDK_PYTHON), "-I", "-c", f"import {module}"], capture_output=True, cwd="/", check=False
    )
    return probe.returncode == 0


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
    if SDK_PYTHON is None or not SDK_PYTHON.exists():
        pytest.skip(SDK_MISSING)
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
