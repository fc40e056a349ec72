"""The Python with the official SDK (osmosis-ai, Python >= 3.12), and what its own upload
planner says about a run directory, asked in a subprocess of that Python.

Found the way ``.ci/run`` finds interpreters: ``OSMOSIS_SDK_PYTHON`` when set, else a
pyenv build (then ``python3.X`` on PATH) of 3.12 or later that imports ``osmosis_ai``;
where there is none the tests that need it skip. No machine's own path is named here.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest


def _imports(python: Path, module: str) -> bool:
    if not python.exists():
        return False
    probe = subprocess.run(
        [str(python), "-I", "-c", f"import {module}"], capture_output=True, cwd="/", check=False
    )
    return probe.returncode == 0


#: What the test modules ask of the SDK's Python while they are collected, asked in one
#: interpreter per process (five starts of the SDK's Python in each xdist worker before).
COLLECTED = ("osmosis_ai.eval.local.upload", "osmosis_ai.eval.local.runner, uvicorn, httpx",
             "osmosis_ai.eval.rubric.report")
_PROBE = """
import json, sys
found = {}
for statement in sys.argv[1:]:
    try:
        exec("import " + statement)
    except Exception:
        found[statement] = False
    else:
        found[statement] = True
print(json.dumps(found))
"""


@functools.cache
def _collected_imports(python: Path) -> dict[str, bool]:
    if not python.exists():
        return {}
    probe = subprocess.run(
        [str(python), "-I", "-c", _PROBE, *COLLECTED],
        capture_output=True, text=True, cwd="/", check=False,
    )
    if probe.returncode != 0:
        return {}
    found: dict[str, bool] = json.loads(probe.stdout.splitlines()[-1])
    return found


def _candidates() -> list[Path]:
    """pyenv builds of 3.12+ (newest minor first), then ``python3.X`` on PATH."""
    found: list[Path] = []
    for minor in range(20, 11, -1):
        versions = Path.home() / ".pyenv" / "versions"
        found += sorted(versions.glob(f"3.{minor}.*/bin/python"), reverse=True)
        on_path = shutil.which(f"python3.{minor}")
        if on_path:
            found.append(Path(on_path))
    return found


def find_sdk_python() -> Path | None:
    """``OSMOSIS_SDK_PYTHON``, else the first Python 3.12+ found that imports osmosis-ai."""
    named = os.environ.get("OSMOSIS_SDK_PYTHON")
    if named:
        return Path(named)
    return next((python for python in _candidates() if _imports(python, "osmosis_ai")), None)


#: The Python with osmosis-ai; None means the tests that need it skip (CI sets it).
SDK_PYTHON: Path | None = find_sdk_python()
SDK_MISSING = (
    "OSMOSIS_SDK_PYTHON is not set (a Python with osmosis-ai) and no Python 3.12+ found has it"
    if SDK_PYTHON is None
    else f"no Python with osmosis-ai at {SDK_PYTHON} (set OSMOSIS_SDK_PYTHON)"
)


def sdk_python_imports(module: str) -> bool:
    """Whether the SDK's Python exists and can import ``module`` (of osmosis-ai)."""
    if SDK_PYTHON is None:
        return False
    if module in COLLECTED:
        return _collected_imports(SDK_PYTHON).get(module, False)
    return _imports(SDK_PYTHON, module)


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


#: ``osmosis eval run`` as its CLI runs it, offline: osmosis-ai's own ``LocalEvalRunner``
#: (its LiteLLM bridge, its rollout server in a child process, its journal) with hooks that
#: confirm nothing. Arguments: workspace root, rollout name, entrypoint, dataset name, run
#: name (the run directory is ``<root>/sdk-evals/<name>``), and ``python`` to start the
#: server as ``python <entrypoint>`` (the SDK's own test seam, ``server_interpreter``) or
#: ``bootstrap`` to start it through the SDK's ``_server_bootstrap.py`` as ``uv run`` does
#: (the entrypoint's folder first on ``sys.path``), without uv: no network;
#: ``bootstrap=<python>`` does that on another Python (a rollout's own environment).
SDK_EVAL_RUN = r"""
import asyncio, contextlib, json, os, sys
from pathlib import Path
import osmosis_ai.eval.local.runner as local_runner
from osmosis_ai.eval.local.dataset import resolve_explicit_dataset_file, select_rows
from osmosis_ai.eval.local.runner import EvalRunSpec, LocalEvalOptions, LocalEvalRunner

root, rollout, entrypoint, dataset_name, name, start = sys.argv[1:7]
root = Path(root)
interpreter = sys.executable
if start.partition("=")[0] == "bootstrap":
    python = start.partition("=")[2] or sys.executable
    bootstrap = Path(local_runner.__file__).with_name("_server_bootstrap.py")
    interpreter = str(root / ".sdk-bootstrap")
    Path(interpreter).write_text(f'#!/bin/sh\nexec "{python}" "{bootstrap}" "$@"\n')
    os.chmod(interpreter, 0o755)


class Hooks:
    def note(self, message): print("note:", message, file=sys.stderr)
    def warning(self, message): print("warning:", message, file=sys.stderr)
    def stage(self, message): print("stage:", message, file=sys.stderr)
    def status(self, message): return contextlib.nullcontext()
    async def confirm_dispatch(self, *, pending, model_path): return None
    async def confirm_new_run(self, *, run_name, total): return False
    def resolve_secrets(self, names): return {}
    def progress(self, snapshot): pass


dataset = resolve_explicit_dataset_file(root / "data" / f"{dataset_name}.jsonl")
runner = LocalEvalRunner(
    spec=EvalRunSpec(
        rollout_name=rollout, entrypoint=entrypoint, model_path="openai/test-model",
        dataset_name=dataset_name,
    ),
    options=LocalEvalOptions(name=name, server_interpreter=interpreter),
    dataset=dataset,
    selection=select_rows(dataset.path, extension=dataset.extension),
    rollout_dir=root / "rollouts" / rollout,
    output_root=root / "sdk-evals",
    hooks=Hooks(),
)
summary = asyncio.run(runner.run())
print(json.dumps({"succeeded": summary.succeeded, "failed": summary.failed}))
"""
