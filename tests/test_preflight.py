"""The model preflight runs while the first rows start (LiteLLM's import is ~3 s), but no
model call is answered and no result is recorded before it has passed; a model that fails
it stops the session with exit 4 and one line, leaving every row pending."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path

import pytest
from workspaces import calc_rows, write_workspace

from pytest_osmosis.bridge import ModelRoute
from pytest_osmosis.errors import ModelPreflightError
from pytest_osmosis.preflight import check_model

STAMPING_ROLLOUT = '''
import json
import time

import httpx

from pytest_osmosis.rollout import AgentWorkflow, Grader, get_rollout_context


class Stamping(AgentWorkflow):
    """Notes when it started and when the model answered, then answers with the model."""

    async def run(self, ctx):
        started = time.time()
        answered = None
        if ctx.metadata and ctx.metadata.get("ask"):
            rollout = get_rollout_context()
            async with httpx.AsyncClient(timeout=120) as client:
                response = await client.post(
                    rollout.chat_completions_url + "/chat/completions",
                    headers={"Authorization": f"Bearer {rollout.api_key}"},
                    json={"model": "anything", "messages": ctx.prompt},
                )
                response.raise_for_status()
            answered = time.time()
        with open("stamps.jsonl", "a") as fh:
            fh.write(json.dumps({"started": started, "answered": answered}) + "\\n")
        return [*ctx.prompt, {"role": "assistant", "content": "ok"}]


class AlwaysRight(Grader):
    async def grade(self, ctx):
        ctx.sample.reward = 1.0
'''


def _rows(count: int, *, ask: bool) -> list[dict[str, object]]:
    rows = calc_rows([(f"What is {i} + 1?", str(i + 1)) for i in range(count)])
    for row in rows:
        row["metadata"] = {"ask": ask}
    return rows


def _stamps(root: Path) -> list[dict[str, float | None]]:
    path = root / "stamps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_start_during_the_preflight_but_reach_the_model_only_after_it(
    pytester: pytest.Pytester, model_env
) -> None:  # type: ignore[no-untyped-def]
    model_server = model_env
    model_server.delays = {"hi": 6.0}  # the preflight's own prompt
    write_workspace(
        pytester.path,
        rows=_rows(4, ask=True),
        rollout_source=STAMPING_ROLLOUT,
        # Held for 6 s: the wait is not charged to the 3 s workflow budget (which the model
        # call itself stays well inside, even on a loaded machine).
        evaluation={"batch_size": 4, "agent_workflow_timeout_s": 3.0, "grader_timeout_s": 5.0},
    )
    began = time.time()
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    stamps = _stamps(pytester.path)
    assert len(stamps) == 4
    started = max(float(s["started"] or 0) for s in stamps)
    answered = min(float(s["answered"] or 0) for s in stamps)
    # Every row had started and was waiting at the bridge while the (6 s+) preflight ran:
    # had the rows started only after it, each would be answered within milliseconds...
    assert answered - started >= 1.0, stamps
    # ...and none of them got a model answer before the preflight had passed.
    assert answered >= began + 6.0, stamps
    assert model_server.requests_total == 4 + 1
    assert model_server.bodies[0]["messages"][-1]["content"] == "hi"


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("ask", [True, False], ids=["rows-call-the-model", "rows-do-not"])
def test_a_failing_preflight_stops_the_session_and_records_nothing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ask: bool
) -> None:
    url = f"http://127.0.0.1:{_dead_port()}/v1"
    for key in ("OPENAI_API_BASE", "OPENAI_BASE_URL"):
        monkeypatch.setenv(key, url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-dead-endpoint")
    write_workspace(
        pytester.path,
        rows=_rows(6, ask=ask),
        rollout_source=STAMPING_ROLLOUT,
        evaluation={"batch_size": 6},
    )
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "x", "-rA")
    result = pytester.runpytest(*args)
    output = "\n".join([*result.outlines, *result.errlines])
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    lines = [line for line in output.splitlines() if "model preflight failed for" in line]
    assert len(lines) == 1 and "openai/test-model" in lines[0], output
    assert "Traceback" not in output and "INTERNALERROR" not in output, output
    # Not one row is reported or recorded: they all stay pending for the next run.
    assert "no tests ran" in output, output
    assert not any(word in output for word in ("PASSED", "FAILED", " 1 passed", " 1 failed"))
    run_dir = pytester.path / ".osmosis" / "evals" / "x"
    events = run_dir / "events.jsonl"
    assert not events.exists() or events.read_text() == ""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["eval_run"]["status"] == "incomplete"


def _route(url: str) -> ModelRoute:
    return ModelRoute(
        model_path="openai/test-model",
        litellm_model="openai/test-model",
        kwargs={"api_base": url, "api_key": "sk-test-preflight"},
    )


def test_the_check_runs_in_a_child_and_names_a_dead_endpoint(model_server) -> None:  # type: ignore[no-untyped-def]
    assert asyncio.run(check_model(_route(model_server.url))) is None
    assert model_server.bodies[-1]["messages"] == [{"role": "user", "content": "hi"}]
    with pytest.raises(ModelPreflightError, match="model preflight failed for 'openai/test-model'"):
        asyncio.run(check_model(_route(f"http://127.0.0.1:{_dead_port()}/v1")))


def test_an_interpreter_that_cannot_import_us_checks_in_process(
    model_server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
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
