"""Session-start checks: our dependencies' versions, and the model preflight (contract §5.5).

The session waits for both before any row starts, so no rollout's model call is ever held
(a client with a 5 s timeout would give up on a fast model) and no row's duration counts
start-up. A route at an OpenAI-compatible endpoint (``osmosis/embedded`` included) is
checked with one direct request in this process, without LiteLLM (model/direct.py): a dead
endpoint, a missing key or an unknown model id is reported in well under a second. Any
other route needs LiteLLM, whose import costs ~3 s of CPU. A process that runs rows needs
LiteLLM anyway, so it checks in process (one import, and the check warms LiteLLM's client on
the rows' loop). An xdist controller, which never calls a model, checks in a child process
instead and imports nothing; the child answers with one marked JSON line on stdout.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Protocol

from pytest_osmosis.core.errors import ModelPreflightError
from pytest_osmosis.model.bridge import Bridge
from pytest_osmosis.model.direct import direct_base
from pytest_osmosis.model.routes import ModelRoute, not_a_model_id

_MARK = "osmosis-preflight: "


async def check_model(route: ModelRoute, *, in_process: bool = False) -> str | None:
    """Check ``route`` once; returns a non-fatal warning, raises :class:`ModelPreflightError`.

    ``in_process`` imports LiteLLM here (off the loop thread) and checks on this loop.
    An OpenAI-compatible route is checked here and directly, in every process.
    """
    refused = unknown_provider(route)
    if refused is not None:
        raise ModelPreflightError(refused)
    if direct_base(route) is not None:
        return await _check_here(route)
    if in_process:
        return await _check_in_process(route)
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
        [sys.executable, "-m", "pytest_osmosis.model.preflight"],
        input=request,
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
    )
    answer = _answer(done.stdout)
    if answer is None and "No module named 'pytest_osmosis" in done.stderr:
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


def unknown_provider(route: ModelRoute) -> str | None:
    """The preflight's line for a provider LiteLLM certainly lacks, decided from its files
    without its ~3 s import (model/providers.py); None when LiteLLM has to be asked."""
    from pytest_osmosis.model.providers import certainly_unknown

    api_base = route.kwargs.get("api_base")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # as the session calls it
    if not certainly_unknown(route.litellm_model, api_base if isinstance(api_base, str) else None):
        return None
    provider = route.litellm_model.split("/", 1)[0]
    return not_a_model_id(route.model_path, f"LiteLLM has no provider {provider!r}")


async def _check_in_process(route: ModelRoute) -> str | None:
    from pytest_osmosis.model.litellm import import_litellm

    await asyncio.to_thread(import_litellm)
    return await _check_here(route)


async def _check_here(route: ModelRoute) -> str | None:
    bridge = Bridge(route)
    try:
        await bridge.preflight()
    finally:
        await bridge.close()
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


def interrupted() -> None:
    """Ctrl-C during the preflight wait: say so, and let a second one exit at once.

    The session then stops as after any interrupt, but that waits for the check's threads
    (LiteLLM's import, the checking process, a request in flight): seconds, and a second
    Ctrl-C there would print a raw traceback. No row has started and nothing is recorded,
    so exiting on the spot loses nothing: every row stays pending for a resume.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def exit_now(signum: int, frame: Any) -> None:
        os.write(
            2,
            b"\nosmosis: interrupted again during the model preflight; exiting now "
            b"(no row ran: every row is pending, the same command resumes)\n",
        )
        os._exit(2)  # pytest.ExitCode.INTERRUPTED

    signal.signal(signal.SIGINT, exit_now)
    os.write(
        2,
        b"\nosmosis: interrupted during the model preflight; stopping "
        b"(Ctrl-C again to exit at once)\n",
    )


class _Cache(Protocol):
    """pytest's ``config.cache`` (absent with ``-p no:cacheprovider``)."""

    def get(self, key: str, default: Any) -> Any: ...

    def set(self, key: str, value: Any) -> None: ...


_DEPENDENCIES_KEY = "osmosis/dependencies"


def check_dependencies(cache: _Cache | None = None) -> str | None:
    """One line naming each runtime dependency installed outside our declared range.

    The ranges are read from our own distribution's metadata (pyproject.toml owns them).
    A rollout's ``pip install -e`` can replace one (e.g. downgrade LiteLLM), and pip only
    warns once. A passed check is remembered per interpreter and import path, keyed by the
    modification times of the path's directories (an install or removal changes them).
    """
    key = _environment_key()
    if cache is not None and cache.get(_DEPENDENCIES_KEY, None) == key:
        return None
    problems = _dependency_problems()
    if problems is None:
        return None  # not installed as a distribution (run from a source tree)
    if problems:
        # Often a rollout `pip install -e`'d here pinned it: its own environment is the cure.
        return "; ".join(problems) + (
            " (a rollout that needs other versions runs in its own environment with "
            "--osmosis-execution server, or auto when its pyproject.toml says so)"
        )
    if cache is not None:
        cache.set(_DEPENDENCIES_KEY, key)
    return None


def _environment_key() -> str:
    from pytest_osmosis import __version__

    parts = [sys.executable, sys.version, __version__]
    for entry in sys.path:
        try:
            parts.append(f"{entry}={os.stat(entry or '.').st_mtime_ns}")
        except OSError:
            parts.append(f"{entry}=-")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _dependency_problems() -> list[str] | None:
    from importlib import metadata

    # pytest depends on packaging, so it is always there when this plugin runs.
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion

    try:
        declared = metadata.requires("pytest-osmosis") or []
    except metadata.PackageNotFoundError:
        return None
    problems: list[str] = []
    for line in declared:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's dependency, or another Python's
        wanted = f"{requirement.name}{requirement.specifier}"
        try:
            found = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            problems.append(
                f"pytest-osmosis needs {wanted}, which is not installed (pip install '{wanted}')"
            )
            continue
        try:
            fits = requirement.specifier.contains(found.version, prereleases=True)
        except InvalidVersion:
            continue
        if not fits:
            problems.append(
                f"pytest-osmosis needs {wanted}, but {requirement.name} {found.version} is "
                f"installed (in {found.locate_file('')}); reinstall it: pip install '{wanted}'"
            )
    return problems


def main() -> None:
    """The child: read the route on stdin, check it, print the marked answer."""
    from pytest_osmosis.model.litellm import import_litellm

    request = json.loads(sys.stdin.read())
    route = ModelRoute(
        model_path=request["model_path"],
        litellm_model=request["litellm_model"],
        kwargs=dict(request["kwargs"]),
    )
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    bridge = Bridge(route)
    answer: dict[str, Any]
    try:
        import_litellm()
        asyncio.run(bridge.preflight())
    except ModelPreflightError as exc:
        text = str(exc)
        if not text.startswith("model preflight failed"):
            text = f"model preflight failed for {route.model_path!r}: {text}"
        answer = {"error": text}
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
