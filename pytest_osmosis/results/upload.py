"""``--osmosis-upload`` and ``pytest-osmosis upload RUN``: the SDK's own upload of a finished run.

We do not talk to the platform ourselves: the run is handed to ``osmosis eval upload`` (the
SDK's command: its planner, its retries, its lock on the run), found as this interpreter's
``osmosis_ai`` or an ``osmosis`` on PATH. A run that is not finished is never handed over,
and what the command said comes back as one line, with the platform token never in it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MODES = ("on-pass", "always")
INSTALL = (
    "the Osmosis SDK is not installed: pip install 'osmosis-ai[eval]' (Python >= 3.12) in "
    "this environment, or put its `osmosis` command on PATH"
)


@dataclass(frozen=True)
class UploadResult:
    uploaded: bool
    line: str


def parse_mode(value: str, source: str) -> str:
    mode = str(value).strip().lower()
    if mode not in MODES:
        raise ValueError(f"{source}: must be on-pass or always, got {value!r}")
    return mode


def sdk_command() -> list[str] | None:
    """How to run ``osmosis``: this interpreter's SDK, else the command on PATH."""
    if importlib.util.find_spec("osmosis_ai") is not None:
        return [
            sys.executable,
            "-c",
            "import sys; from osmosis_ai.cli.main import main; sys.exit(main())",
        ]
    found = shutil.which("osmosis")
    return [found] if found else None


def _finished(run_dir: Path) -> str | None:
    """Why the run cannot be uploaded (None: it is finished)."""
    try:
        metrics = json.loads((run_dir / "metrics.json").read_bytes())
        status = metrics["eval_run"]["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{run_dir} has no readable metrics.json"
    return None if status == "finished" else f"run {run_dir.name} is {status}, not finished"


def _hidden(text: str) -> str:
    token = os.environ.get("OSMOSIS_TOKEN")
    return text.replace(token, "***") if token else text


def upload_run(run_dir: Path, workspace: Path) -> UploadResult:
    """Run ``osmosis eval upload RUN_DIR`` in *workspace* (the SDK resolves it by Git)."""
    problem = _finished(run_dir)
    if problem is not None:
        return UploadResult(False, f"not uploaded: {problem}")
    command = sdk_command()
    if command is None:
        return UploadResult(False, f"not uploaded: {INSTALL}")
    done = subprocess.run(
        [*command, "eval", "upload", str(run_dir)],
        cwd=workspace,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "1000"},
    )
    said = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    if done.returncode == 0:
        shown = [line for line in said if line.startswith(("Uploaded", "View:"))]
        return UploadResult(True, _hidden(" ".join(shown) or f"uploaded {run_dir.name}"))
    error = next((line for line in said if line.startswith("Error")), said[-1] if said else "")
    return UploadResult(
        False, _hidden(f"upload of run {run_dir.name} failed (exit {done.returncode}): {error}")
    )
