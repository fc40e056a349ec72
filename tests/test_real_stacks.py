"""Rollouts on the stacks users really run, each in a fresh interpreter, row for row against
``osmosis eval run`` (issue 24, part 1).

An in-process pytester run inherits every import the test process made, and that hid a
refusal: urllib3 binds ``::1`` port 0 when first imported (its IPv6 probe), the OpenAI
Agents and Strands integrations import it, and the load guard took that for a server.
So each workspace here runs as a user runs it: ``python -m pytest --osmosis-eval`` in a new
process, and beside it osmosis-ai 0.3.8's own ``LocalEvalRunner`` with its rollout server
started through the SDK's ``_server_bootstrap.py`` (``SDK_EVAL_RUN``), against one loopback
model server. Both runs must end every row the same way (status, reward, error, tokens,
summary) and give `osmosis eval upload` the same files.

The rollouts (tests/sdk_rollouts/) are our own, in the shapes the template and the SDK
scaffold use: a package-style rollout with ``pyproject.toml`` and an OpenAI Agents tool
(``agents_package``), a Strands agent with a tool (``strands_tools``), and an entrypoint in
a subfolder importing its neighbour by bare name (``subfolder_entry``), twice in one
workspace with a same-named module of different content.

The Strands rows need a Python where ``osmosis_ai``'s Strands integration imports beside
our own floors (``OSMOSIS_STACKS_PYTHON``, else the SDK's Python); see ``.ci/run``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer, ToolRule
from sdk_planner import SDK_EVAL_RUN, SDK_MISSING, SDK_PYTHON, sdk_judge, sdk_python_imports
from workspaces import read_index, toml_text

ROLLOUTS = Path(__file__).resolve().parent / "sdk_rollouts"

pytestmark = [
    pytest.mark.skipif(
        not sdk_python_imports("osmosis_ai.eval.local.runner, uvicorn, httpx"),
        reason=f"osmosis-ai's local runner: {SDK_MISSING}",
    ),
    # Everything here runs in subprocesses of the SDK's Python, whichever Python runs
    # pytest: run it once, from that Python (CI's SDK lane), not again from every lane.
    pytest.mark.skipif(
        SDK_PYTHON is None or Path(sys.executable).parent != SDK_PYTHON.parent,
        reason="runs from the SDK's own Python (OSMOSIS_SDK_PYTHON), as CI's SDK lane does",
    ),
]


def _python_with(variable: str, module: str) -> Path | None:
    """The Python named by ``variable``, else the SDK's Python, if it imports ``module``."""
    named = os.environ.get(variable)
    candidates = [Path(named)] if named else ([SDK_PYTHON] if SDK_PYTHON else [])
    for python in candidates:
        probe = subprocess.run(
            [str(python), "-c", f"import {module}"], capture_output=True, cwd="/", check=False
        )
        if probe.returncode == 0:
            return python
    return None


def _stacks_python() -> Path | None:
    """The Python with osmosis-ai's Strands integration: ``OSMOSIS_STACKS_PYTHON``, else the
    SDK's Python when it has it."""
    return _python_with("OSMOSIS_STACKS_PYTHON", "osmosis_ai.rollout.integrations.agents.strands")


def _harbor_python() -> Path | None:
    """The Python with osmosis-ai's Harbor backend: ``OSMOSIS_HARBOR_PYTHON``, else the SDK's
    Python when it has it. ``harbor`` holds httpx at 0.28, below what the other lanes
    resolve, so .ci/run gives it an environment of its own."""
    return _python_with("OSMOSIS_HARBOR_PYTHON", "osmosis_ai.rollout.backend.harbor.backend")


Rollouts = dict[str, tuple[Path, str]]  # rollout name -> (its code, its entrypoint)


def workspace(root: Path, rollouts: Rollouts, rows: dict[str, list[dict[str, Any]]]) -> None:
    """One config and one dataset per rollout, in a workspace ``osmosis eval run`` accepts."""
    (root / "configs" / "training").mkdir(parents=True)  # osmosis eval run requires it
    (root / "data").mkdir()
    for name, (source, entrypoint) in rollouts.items():
        shutil.copytree(
            source, root / "rollouts" / name, ignore=shutil.ignore_patterns("__pycache__")
        )
        config = root / "configs" / "eval" / f"{name}.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(toml_text(rollout=name, entrypoint=entrypoint, dataset=name))
        lines = "".join(json.dumps(row) + "\n" for row in rows[name])
        (root / "data" / f"{name}.jsonl").write_text(lines)


def ends(run_dir: Path) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """How a run ended each row (status, reward, error type, tokens) and its metrics
    summary (durations aside: they are the only thing that may differ)."""
    rows = sorted(
        (r["row_index"], r["status"], r.get("reward"), r.get("error_type"), r.get("tokens"))
        for r in read_index(run_dir)
    )
    summary = json.loads((run_dir / "metrics.json").read_text())["summary"]
    return rows, {k: v for k, v in summary.items() if "duration" not in k}


def uploaded(run_dir: Path) -> dict[str, Any]:
    """What ``osmosis eval upload`` would take from a run (the SDK's own planner), each
    rollout id in a file name replaced by its row: ids are random in every run."""
    verdict = sdk_judge(run_dir)
    names = {r["rollout_id"]: f"row-{r['row_index']}" for r in read_index(run_dir)}
    files = verdict.get("files", [])
    verdict["files"] = sorted(
        "/".join(names.get(part, part) for part in name.split("/")) for name in files
    )
    return verdict


#: Each workspace runs in both of our execution modes: imported into the session, and on
#: its own server as ``osmosis eval run`` runs it (issue 24, part 2).
MODES = pytest.mark.parametrize("mode", ["in-process", "server"])


def run_both(
    tmp_path: Path,
    model_server: ModelServer,
    python: Path,
    rollouts: Rollouts,
    rows: dict[str, list[dict[str, Any]]],
    mode: str,
    extra_env: dict[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, int], str]:
    """Each rollout's rows and summary as ``osmosis eval run`` ends them and as one fresh
    ``pytest --osmosis-eval --osmosis-execution <mode>`` session ends them, with that
    session's outcomes and output; ``extra_env`` on top of the environment of both."""
    env = {
        **os.environ,
        **model_server.env(),
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
        **(extra_env or {}),
    }
    env.pop("PYTEST_ADDOPTS", None)
    sdk_root = tmp_path / "sdk"
    workspace(sdk_root, rollouts, rows)

    def sdk_runs() -> dict[str, Any]:
        ended = {}
        for name, (_, entrypoint) in rollouts.items():
            args = [str(sdk_root), name, entrypoint, name, name, "bootstrap"]
            done = subprocess.run(
                [str(python), "-c", SDK_EVAL_RUN, *args],
                cwd=sdk_root,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert done.returncode == 0, (
                f"osmosis eval run:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
            ended[name] = ends(sdk_root / "sdk-evals" / name)
        return ended

    # The SDK's runs and ours share nothing but the model server: run them side by side.
    pool = ThreadPoolExecutor(max_workers=1)
    theirs = pool.submit(sdk_runs)
    ours_root = tmp_path / "ours"
    workspace(ours_root, rollouts, rows)
    execution = ["--osmosis-execution", mode]
    if mode == "server" and any(
        (source / "pyproject.toml").is_file() for source, _ in rollouts.values()
    ):
        # The SDK's runs serve on this Python (server_interpreter), not a uv-synced
        # environment (that would reach PyPI): so does ours. Rollouts without a
        # pyproject.toml run on the session's Python through the SDK's bootstrap.
        execution += ["--osmosis-server-python", str(python)]
    try:
        done = subprocess.run(
            [str(python), "-m", "pytest", "--osmosis-eval", *execution, "-p", "no:cacheprovider"],
            cwd=ours_root,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        sdk = theirs.result()
    finally:
        pool.shutdown(wait=True)
    output = done.stdout + done.stderr
    ours: dict[str, Any] = {}
    for name in rollouts:
        run_dirs = [p for p in (ours_root / ".osmosis" / "evals").glob(f"{name}*") if p.is_dir()]
        assert len(run_dirs) == 1, output[-4000:]
        ours[name] = ends(run_dirs[0])
        assert uploaded(run_dirs[0]) == uploaded(sdk_root / "sdk-evals" / name), name
        served = "[rollout-server]" in (run_dirs[0] / "logs.txt").read_text()
        if mode != "auto":
            assert served == (mode == "server"), f"{name} did not run {mode}"
    outcomes = pytest.RunResult(done.returncode, output.splitlines(), [], 0).parseoutcomes()
    return sdk, ours, outcomes, output


TIMES_ROWS = [
    {"user_prompt": "Multiply 6 by 7, please.", "ground_truth": "42"},
    {"user_prompt": "What is 2 + 2?", "ground_truth": "5"},  # answered without the tool
]


#: Both modes: the row the model answers right passes, the wrong one fails.
OUTCOMES = {"passed": 1, "failed": 1}


def _tools(model_server: ModelServer) -> None:
    model_server.tool_rules = [ToolRule("Multiply 6 by 7", "multiply", {"a": 6, "b": 7})]
    model_server.tool_answer = "{result}"


def statuses(ended: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
    """Row index, status and reward of each rollout's rows."""
    return {name: [row[:3] for row in rows] for name, (rows, _) in ended.items()}


@MODES
def test_openai_agents_package_rollout_runs_as_osmosis_eval_run_runs_it(
    tmp_path: Path, model_server: ModelServer, mode: str
) -> None:
    """Refused at every row before: "it starts a server (binds ::1:0)" (urllib3's probe)."""
    if not sdk_python_imports("osmosis_ai.rollout.integrations.agents.openai_agents"):
        pytest.skip("needs osmosis-ai's OpenAI Agents integration (openai-agents)")
    _tools(model_server)
    assert SDK_PYTHON is not None
    sdk, ours, outcomes, output = run_both(
        tmp_path,
        model_server,
        SDK_PYTHON,
        {"agents_package": (ROLLOUTS / "agents_package", "main.py")},
        {"agents_package": TIMES_ROWS},
        mode,
    )
    expected = [(0, "success", 1.0), (1, "success", 0.0)]
    assert statuses(sdk) == {"agents_package": expected}
    assert ours == sdk, output[-4000:]
    assert outcomes == OUTCOMES, output[-4000:]
    assert (
        "osmosis: warning" not in output
    )  # it serves on _OSMOSIS_ROLLOUT_PORT, in a full workspace


@MODES
def test_strands_rollout_runs_as_osmosis_eval_run_runs_it(
    tmp_path: Path, model_server: ModelServer, mode: str
) -> None:
    """Refused before, as the OpenAI Agents rollout was; its tool call really runs."""
    python = _stacks_python()
    if python is None:
        pytest.skip("needs osmosis-ai's Strands integration (OSMOSIS_STACKS_PYTHON)")
    _tools(model_server)
    sdk, ours, outcomes, output = run_both(
        tmp_path,
        model_server,
        python,
        {"strands_tools": (ROLLOUTS / "strands_tools", "main.py")},
        {"strands_tools": TIMES_ROWS},
        mode,
    )
    expected = [(0, "success", 1.0), (1, "success", 0.0)]
    assert statuses(sdk) == {"strands_tools": expected}
    assert ours == sdk, output[-4000:]
    assert outcomes == OUTCOMES, output[-4000:]


@MODES
def test_subfolder_entrypoints_import_their_own_neighbours(
    tmp_path: Path, model_server: ModelServer, mode: str
) -> None:
    """``entrypoint = "agent/main.py"`` imports ``agent/helpers.py`` as ``helpers`` (it failed
    with ModuleNotFoundError before), and two such rollouts in one session each get their
    own ``helpers``: the labels name whose code must have answered."""
    assert SDK_PYTHON is not None
    rows = {
        "plain": [
            {"user_prompt": "What is 2 + 3?", "ground_truth": "plain:5"},
            {"user_prompt": "What is 3 * 3?", "ground_truth": "plain:10"},
        ],
        "twin": [
            {"user_prompt": "What is 4 + 4?", "ground_truth": "twin:8"},
            {"user_prompt": "What is 1 + 1?", "ground_truth": "plain:2"},
        ],
    }
    twin = tmp_path / "twin-source"
    shutil.copytree(ROLLOUTS / "subfolder_entry", twin)
    helpers = twin / "agent" / "helpers.py"
    helpers.write_text(helpers.read_text().replace('FLAVOUR = "plain"', 'FLAVOUR = "twin"'))
    sdk, ours, outcomes, output = run_both(
        tmp_path,
        model_server,
        SDK_PYTHON,
        {
            "plain": (ROLLOUTS / "subfolder_entry", "agent/main.py"),
            "twin": (twin, "agent/main.py"),
        },
        rows,
        mode,
    )
    assert statuses(sdk) == {
        "plain": [(0, "success", 1.0), (1, "success", 0.0)],
        "twin": [(0, "success", 1.0), (1, "success", 0.0)],
    }
    assert ours == sdk, output[-4000:]
    assert outcomes == {"passed": 2, "failed": 2}, output[-4000:]


def test_harbor_without_docker_fails_as_osmosis_eval_run_fails(
    tmp_path: Path, model_server: ModelServer
) -> None:
    """A Harbor rollout with no Docker daemon (``DOCKER_HOST`` names a socket that does not
    exist): ``auto`` runs it on its own server, as the SDK does, and every row ends as the
    SDK ends it: ``agent_error`` with Harbor's own message on one line, the run finished,
    and the SDK's upload planner takes the same files (no trajectory) from both runs.
    Before: never run (harbor was not installed anywhere the suite ran)."""
    python = _harbor_python()
    if python is None:
        # .ci/run names one: there, a Python without Harbor is a broken lane, not a skip.
        assert not os.environ.get("OSMOSIS_HARBOR_PYTHON"), "OSMOSIS_HARBOR_PYTHON lacks harbor"
        pytest.skip("needs osmosis-ai's Harbor backend (harbor): set OSMOSIS_HARBOR_PYTHON")
    no_docker = {"DOCKER_HOST": f"unix://{tmp_path / 'no-docker.sock'}"}
    rows = {"harbor_task": [{"user_prompt": "Write 42 to /app/answer.txt.", "ground_truth": "42"}]}
    sdk, ours, outcomes, output = run_both(
        tmp_path,
        model_server,
        python,
        {"harbor_task": (ROLLOUTS / "harbor_task", "main.py")},
        rows,
        "auto",
        no_docker,
    )
    assert sdk["harbor_task"][0] == [(0, "failed", None, "agent_error", None)]
    assert ours == sdk, output[-4000:]
    assert outcomes == {"errors": 1}, output[-4000:]
    # auto chose the server: the loader saw a backend that is not a LocalBackend.
    assert "execution  server (" in output and "it builds HarborBackend" in output, output
    # Harbor's own message, on one line, as the SDK's rollout server logged it.
    said = [line for line in output.splitlines() if line.startswith("agent_error: ")]
    assert len(said) == 1, output[-4000:]
    message = said[0].removeprefix("agent_error: ")
    sdk_dir = tmp_path / "sdk" / "sdk-evals" / "harbor_task"
    assert message[:30] in (sdk_dir / "logs.txt").read_text(), message
    # What `osmosis eval upload` would take is the SDK's (run_both): no trajectory.
    assert uploaded(sdk_dir)["files"] == ["index.jsonl", "logs.txt", "progress.json"]
