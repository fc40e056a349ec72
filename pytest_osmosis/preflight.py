"""The model preflight (contract §5.5), run in a child process.

Checking the model needs LiteLLM, whose import costs ~3 s of CPU. In the session's own
process that import would hold the GIL while the first rows run ahead (and an xdist
controller, which never calls a model, would pay it for nothing). A child process checks
the model on the other core instead; the session imports LiteLLM only when a row first
calls the model. The child answers with one marked JSON line on stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

from pytest_osmosis.bridge import Bridge, ModelRoute
from pytest_osmosis.errors import ModelPreflightError

_MARK = "osmosis-preflight: "


async def check_model(route: ModelRoute) -> str | None:
    """Check ``route`` once; returns a non-fatal warning, raises :class:`ModelPreflightError`."""
    try:
        request = json.dumps(
            {
                "model_path": route.model_path,
                "litellm_model": route.litellm_model,
                "kwargs": route.kwargs,
            }
        )
    except (TypeError, ValueError):
        # A route whose settings do not travel as JSON is checked here, in process.
        return await _check_in_process(route)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "pytest_osmosis.preflight"],
        input=request,
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
    )
    answer = _answer(done.stdout)
    if answer is None and "No module named" in done.stderr:
        # This interpreter cannot import us by name (a frozen or path-hacked install).
        return await _check_in_process(route)
    if answer is None:
        tail = " ".join(done.stderr.split()[-40:]) or "no output"
        raise ModelPreflightError(
            f"model preflight failed for {route.model_path!r}: the checking process exited "
            f"with status {done.returncode} ({tail})"
        )
    if answer.get("error"):
        raise ModelPreflightError(str(answer["error"]))
    warning = answer.get("warning")
    return str(warning) if warning else None


async def _check_in_process(route: ModelRoute) -> str | None:
    from pytest_osmosis.bridge import import_litellm

    await asyncio.to_thread(import_litellm)
    bridge = Bridge(route)
    await bridge.preflight()
    return bridge.preflight_warning


def _answer(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(_MARK):
            try:
                value = json.loads(line[len(_MARK) :])
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def main() -> None:
    """The child: read the route on stdin, check it, print the marked answer."""
    from pytest_osmosis.bridge import import_litellm

    request = json.loads(sys.stdin.read())
    route = ModelRoute(
        model_path=request["model_path"],
        litellm_model=request["litellm_model"],
        kwargs=dict(request["kwargs"]),
    )
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import_litellm()
    bridge = Bridge(route)
    answer: dict[str, Any]
    try:
        asyncio.run(bridge.preflight())
    except ModelPreflightError as exc:
        answer = {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - anything here means the model is unusable
        answer = {
            "error": f"model preflight failed for {route.model_path!r}: "
            f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        }
    else:
        answer = {"warning": bridge.preflight_warning}
    sys.stdout.write(_MARK + json.dumps(answer) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip tearing down LiteLLM's heap: the answer is all that was wanted


if __name__ == "__main__":
    main()
