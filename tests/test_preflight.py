"""Session start: our dependencies' versions and the model preflight are checked before any
row starts, so no rollout's model call is ever held (a client's own timeout would expire on
a fast model) and no row's duration counts the start-up. A failure is one line, exit 4,
with nothing recorded."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from model_server import ModelServer
from workspaces import calc_rows, free_port, write_workspace

from pytest_osmosis.core.errors import ModelPreflightError
from pytest_osmosis.model.direct import direct_base
from pytest_osmosis.model.preflight import check_model
from pytest_osmosis.model.routes import ModelRoute

STAMPING_ROLLOUT = '''
import json
import sys
import time

import httpx

from pytest_osmosis.rollout import AgentWorkflow, Grader, get_rollout_context


class Stamping(AgentWorkflow):
    """Notes when it started (and whether LiteLLM was loaded), then asks the model with a
    stock client: httpx's default 5 s timeout."""

    async def run(self, ctx):
        stamp = {"started": time.monotonic(), "litellm": "litellm" in sys.modules}
        with open("stamps.jsonl", "a") as fh:
            fh.write(json.dumps(stamp) + "\\n")
        if ctx.metadata and ctx.metadata.get("ask"):
            rollout = get_rollout_context()
            async with httpx.AsyncClient() as client:
                response = await client.post(
                    rollout.chat_completions_url + "/chat/completions",
                    headers={"Authorization": f"Bearer {rollout.api_key}"},
                    json={"model": "anything", "messages": ctx.prompt},
                )
                response.raise_for_status()
        return [*ctx.prompt, {"role": "assistant", "content": "ok"}]


class AlwaysRight(Grader):
    async def grade(self, ctx):
        ctx.sample.reward = 1.0
'''


pytestmark = pytest.mark.bridge_placements  # sessions with either bridge (conftest)

def _rows(count: int, *, ask: bool) -> list[dict[str, object]]:
    rows = calc_rows([(f"What is {i} + 1?", str(i + 1)) for i in range(count)])
    for row in rows:
        row["metadata"] = {"ask": ask}
    return rows


def _stamps(root: Path) -> list[dict[str, object]]:
    path = root / "stamps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _events(run_dir: Path) -> list[dict[str, object]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


PROBE_DELAY_S = 6.0  # the preflight's answer: longer than httpx's default 5 s timeout


def test_no_workflow_starts_before_the_preflight_has_answered(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    model_server = model_env
    model_server.delays = {"hi": PROBE_DELAY_S}  # the preflight's own prompt
    model_server.delay = 0.05  # each row's call: ~50 ms of work
    write_workspace(
        pytester.path,
        rows=_rows(4, ask=True),
        rollout_source=STAMPING_ROLLOUT,
        evaluation={"batch_size": 4, "agent_workflow_timeout_s": 30.0, "grader_timeout_s": 5.0},
    )
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "x")
    result = pytester.runpytest(*args)
    ended = time.monotonic()  # system-wide, like the server's and the rollout's stamps
    # A call held while the preflight ran would have met httpx's ReadTimeout (8 of 8 did).
    result.assert_outcomes(passed=4)
    probe = [at for text, at in model_server.answered if text == "hi"]
    assert len(probe) == 1, model_server.answered
    stamps = _stamps(pytester.path)
    assert len(stamps) == 4
    # Causal order, not a race: each workflow began after the probe had been answered.
    assert all(float(s["started"]) > probe[0] for s in stamps), (probe, stamps)  # type: ignore[arg-type]
    # A row's duration is its own work, not the session's start-up: it fits between the
    # probe's answer and the session's end (causal order again, no bound on a loaded
    # machine's speed; counted from the session's start it would not fit, by ~6 s).
    durations = [float(e["duration_ms"]) for e in _events(pytester.path / ".osmosis/evals/x")]  # type: ignore[arg-type]
    assert len(durations) == 4, durations
    assert all(d / 1000 <= ended - probe[0] for d in durations), (durations, ended - probe[0])


def _rows_through_litellm(monkeypatch: pytest.MonkeyPatch) -> None:
    """An organization header only LiteLLM's client sends: rows at the loopback stub then go
    through LiteLLM (otherwise they skip it, model/direct.py::rows_go_direct)."""
    monkeypatch.setenv("OPENAI_ORGANIZATION", "org-test")


@pytest.mark.parametrize("through_litellm", [True, False], ids=["litellm", "direct"])
def test_an_xdist_worker_imports_litellm_before_its_first_workflow(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch, through_litellm: bool
) -> None:
    if through_litellm:
        _rows_through_litellm(monkeypatch)
    write_workspace(
        pytester.path,
        rows=_rows(4, ask=True),
        rollout_source=STAMPING_ROLLOUT,
        evaluation={"batch_size": 4},
    )
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=4)
    # A fresh worker process: LiteLLM is there only if the worker imported it up front, and
    # never where the rows' calls skip it.
    stamps = _stamps(pytester.path)
    assert len(stamps) == 4 and all(s["litellm"] is through_litellm for s in stamps), stamps



def _point_at_a_dead_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    for key in ("OPENAI_API_BASE", "OPENAI_BASE_URL"):
        monkeypatch.setenv(key, url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-dead-endpoint")


def _assert_one_line_and_nothing_recorded(
    pytester: pytest.Pytester,
    capsys: pytest.CaptureFixture[str],
    result: pytest.RunResult,
    *needles: str,
) -> None:
    """Exit 4 with one line (naming *needles*), no results table, no run `list` shows."""
    from pytest_osmosis.cli import main as cli_main

    output = "\n".join([*result.outlines, *result.errlines])
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    said = [line for line in output.splitlines() if line.strip()]
    assert len(said) == 1, output
    assert said[0].startswith("ERROR: ") and all(n in said[0] for n in needles), output
    for noise in ("_pytest.outcomes", "Exit:", "Traceback", "osmosis:", "rows done"):
        assert noise not in output, output
    assert not _stamps(pytester.path)  # not one workflow started
    assert not list(pytester.path.glob(".osmosis/evals/*/manifest.json"))
    root = pytester.path / ".osmosis" / "evals"
    capsys.readouterr()
    assert cli_main(["list", "--output", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"] == []


@pytest.mark.parametrize("ask", [True, False], ids=["rows-call-the-model", "rows-do-not"])
def test_a_failing_preflight_is_one_line_and_records_nothing(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    ask: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _point_at_a_dead_endpoint(monkeypatch)
    write_workspace(
        pytester.path,
        rows=_rows(6, ask=ask),
        rollout_source=STAMPING_ROLLOUT,
        evaluation={"batch_size": 6},
    )
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "x", "-rA")
    result = pytester.runpytest(*args)
    _assert_one_line_and_nothing_recorded(
        pytester, capsys, result, "model preflight failed for 'openai/test-model'", "cannot reach"
    )


def test_a_failing_preflight_under_xdist_is_one_line_and_records_nothing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _point_at_a_dead_endpoint(monkeypatch)
    write_workspace(pytester.path, rows=_rows(4, ask=True), rollout_source=STAMPING_ROLLOUT)
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", "-n", "2")
    _assert_one_line_and_nothing_recorded(
        pytester, capsys, result, "model preflight failed for 'openai/test-model'", "cannot reach"
    )


def test_a_failing_preflight_leaves_a_resumed_run_as_it_was(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_workspace(pytester.path, rows=_rows(2, ask=True), rollout_source=STAMPING_ROLLOUT)
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "x")
    pytester.runpytest(*args, "--osmosis-rows", "0").assert_outcomes(passed=1)
    run_dir = pytester.path / ".osmosis" / "evals" / "x"
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    _point_at_a_dead_endpoint(monkeypatch)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    assert after == before  # row 1 stays pending; row 0's record and the metrics untouched


def _declared(name: str) -> str:
    """Our declared range for *name*, as our own distribution's metadata states it."""
    for line in metadata.requires("pytest-osmosis") or []:
        head = line.split(";")[0].strip()
        if head.lower().startswith(name):
            return head[len(name) :].strip()
    raise AssertionError(f"pytest-osmosis declares no {name}")


def _shadow_path(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Put *directory* first on the import path of subprocess runs."""
    import os

    rest = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(directory), *filter(None, [rest])]))


def test_a_dependency_outside_our_range_stops_the_session_in_one_line(
    pytester: pytest.Pytester,
    model_env: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # What `pip install -e rollouts/<name>` leaves when the rollout pins an old LiteLLM.
    shadow = pytester.path / "shadow"
    info = shadow / "litellm-1.50.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: litellm\nVersion: 1.50.0\n")
    _shadow_path(monkeypatch, shadow)
    write_workspace(pytester.path, rows=_rows(2, ask=True), rollout_source=STAMPING_ROLLOUT)
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider")
    _assert_one_line_and_nothing_recorded(
        pytester, capsys, result, f"litellm{_declared('litellm')}", "litellm 1.50.0 is installed"
    )


def test_litellm_that_cannot_be_imported_is_one_session_failure(
    pytester: pytest.Pytester,
    model_env: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shadow = pytester.path / "shadow"
    (shadow / "litellm").mkdir(parents=True)
    (shadow / "litellm" / "__init__.py").write_text(
        "raise ImportError(\"cannot import name 'Router' from 'litellm.router' (fake)\")\n"
    )
    _shadow_path(monkeypatch, shadow)
    _rows_through_litellm(monkeypatch)
    write_workspace(pytester.path, rows=_rows(3, ask=True), rollout_source=STAMPING_ROLLOUT)
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider")
    _assert_one_line_and_nothing_recorded(
        pytester,
        capsys,
        result,
        "model preflight failed for 'openai/test-model'",
        "LiteLLM cannot be imported (ImportError: cannot import name 'Router'",
    )


def _route(url: str) -> ModelRoute:
    """A route only LiteLLM may call (a setting the direct request does not reproduce), so
    the check needs LiteLLM: an xdist controller makes it in a child process."""
    return ModelRoute(
        model_path="openai/test-model",
        litellm_model="openai/test-model",
        kwargs={"api_base": url, "api_key": "sk-test-preflight", "timeout": 30.0},
    )


def test_the_check_runs_in_a_child_and_names_a_dead_endpoint(model_server: ModelServer) -> None:
    assert direct_base(_route(model_server.url)) is None
    assert asyncio.run(check_model(_route(model_server.url))) is None
    assert model_server.bodies[-1]["messages"] == [{"role": "user", "content": "hi"}]
    with pytest.raises(ModelPreflightError, match="model preflight failed for 'openai/test-model'"):
        asyncio.run(check_model(_route(f"http://127.0.0.1:{free_port()}/v1")))


def test_an_interpreter_that_cannot_import_us_checks_in_process(
    model_server: ModelServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"No module named 'pytest_osmosis'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    before = model_server.requests_total
    assert asyncio.run(check_model(_route(model_server.url))) is None
    assert model_server.requests_total == before + 1  # checked here, in process
    # A child that dies for another reason is a preflight failure naming its status.
    fake.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    with pytest.raises(ModelPreflightError, match="exited with status 3 \\(boom\\)"):
        asyncio.run(check_model(_route(model_server.url)))
