"""The bridge served from a process of its own (model/bridge_process.py): where it runs,
that the pytest process then never imports LiteLLM, and a helper killed under rows."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from workspaces import (
    PID_ROLLOUT,
    Background,
    gone,
    only_run_dir,
    read_index,
    wait_until,
    write_workspace,
)

from pytest_osmosis.model import bridge_process
from pytest_osmosis.model.bridge_process import placement
from pytest_osmosis.model.routes import EMBEDDED_MODEL_PATH, ModelRoute

HELPER = "pytest_osmosis.model.bridge_process"
HELD = "+ 100?"  # rows 2 and 3 ask this; rows 0 and 1 add 200


def _route(base: str) -> ModelRoute:
    return ModelRoute("openai/osmosis-test", "openai/osmosis-test", {"api_base": base})


def test_placement_is_one_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(bridge_process.ENV, raising=False)
    monkeypatch.delenv("OPENAI_ORGANIZATION", raising=False)
    monkeypatch.setattr(bridge_process, "_cpus", lambda: 2)
    https, http = _route("https://127.0.0.1:9/v1"), _route("http://127.0.0.1:9/v1")
    many = bridge_process.MIN_PENDING
    assert placement(https, many, offline=False) == "process"
    assert placement(https, many - 1, offline=False) == "in-process"  # a small run
    assert placement(https, many, offline=True) == "in-process"  # a replay calls no provider
    assert placement(http, many, offline=False) == "in-process"  # rows go direct
    embedded = ModelRoute(EMBEDDED_MODEL_PATH, "openai/x", {"api_base": "https://127.0.0.1:9"})
    assert placement(embedded, many, offline=False) == "in-process"
    monkeypatch.setattr(bridge_process, "_cpus", lambda: 1)
    assert placement(https, many, offline=False) == "in-process"
    monkeypatch.setenv(bridge_process.ENV, "1")  # the override: size and cores, not safety
    assert placement(https, 1, offline=False) == "process"
    assert placement(http, many, offline=False) == "in-process"
    assert placement(https, many, offline=True) == "in-process"
    unpicklable = ModelRoute("openai/x", "openai/x", {"api_base": "https://h", "f": lambda: 1})
    assert placement(unpicklable, many, offline=False) == "in-process"
    monkeypatch.setenv(bridge_process.ENV, "0")
    monkeypatch.setattr(bridge_process, "_cpus", lambda: 2)
    assert placement(https, many, offline=False) == "in-process"


_MODULES_AT_EXIT = """
import sys
from pathlib import Path

def pytest_unconfigure(config):
    Path("modules").write_text(
        " ".join(m for m in ("litellm", "pytest_osmosis.model.bridge_process") if m in sys.modules)
    )
"""


@pytest.mark.parametrize("forced", ["1", "0"])
def test_the_pytest_process_imports_litellm_only_with_its_bridge(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch, forced: str
) -> None:
    """A fresh interpreter on the LiteLLM route: with the bridge in its own process, the
    session runs without importing LiteLLM; in process it imports it (the same results)."""
    from workspaces import calc_rows

    monkeypatch.setenv("OPENAI_ORGANIZATION", "org-osmosis-test")  # rows take LiteLLM
    monkeypatch.setenv(bridge_process.ENV, forced)
    write_workspace(pytester.path, rows=calc_rows([("What is 2 + 2?", "4"), ("What is 1 + 1?", "2")]))
    pytester.makeconftest(_MODULES_AT_EXIT)
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    modules = (pytester.path / "modules").read_text().split()
    assert "pytest_osmosis.model.bridge_process" in modules  # placement was asked
    assert ("litellm" in modules) == (forced == "0")
    assert model_env.requests_total == 3  # the preflight's call, then one a row
    assert all(r["tokens"] for r in read_index(only_run_dir(pytester.path)))


def _helpers_of(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if HELPER.encode() in cmdline and int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(int(entry.name))
    return found


def _journalled(run_dir: Path) -> list[int]:
    """The rows the run's journal holds (events.jsonl: what a resume carries forward)."""
    journal = run_dir / "events.jsonl"
    lines = journal.read_text().splitlines() if journal.exists() else []
    return sorted(json.loads(line)["row_index"] for line in lines if '"row_index"' in line)


def _summary(run_dir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((run_dir / "metrics.json").read_text())["summary"]
    return {k: v for k, v in summary.items() if "duration" not in k and "time" not in k}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_bridge_process_stops_the_session_and_a_resume_finishes_it(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL of the helper while two rows wait on the model (the server holds them until
    the kill): one line naming the helper and its exit, exit 4, the journal holds the two
    rows that finished, and a resume finishes the run with the summary of a run never
    interrupted."""
    monkeypatch.setenv("OPENAI_ORGANIZATION", "org-osmosis-test")
    monkeypatch.setenv(bridge_process.ENV, "1")
    root = pytester.path
    pids = root / "pids"
    pids.mkdir()
    rows = [
        {
            "user_prompt": f"What is {i} {HELD if i >= 2 else '+ 200?'}",
            "ground_truth": str(i + (100 if i >= 2 else 200)),
            "metadata": {"pids": str(pids), "calls": 1},
        }
        for i in range(4)
    ]
    write_workspace(root, rows=rows, rollout_source=PID_ROLLOUT, evaluation={"batch_size": 4})
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "-q")

    reference = pytester.runpytest_subprocess(*args, "--osmosis-name", "whole")
    reference.assert_outcomes(passed=4)

    for pid in pids.iterdir():
        pid.unlink()
    model_env.hold = HELD
    session = Background(pytester, *args, "--osmosis-name", "cut")
    run_dir = root / ".osmosis" / "evals" / "cut"
    wait_until(lambda: model_env.holding == 2, "rows 2 and 3 wait on the model")
    wait_until(lambda: _journalled(run_dir) == [0, 1], "rows 0 and 1 journalled")
    (parent,) = {int(p.name) for p in pids.iterdir()}
    (helper,) = _helpers_of(parent)
    os.kill(helper, signal.SIGKILL)
    result = session.join()
    model_env.hold = ""
    wait_until(lambda: model_env.holding == 0, "the held requests are let go")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    line = f"the osmosis bridge process (pid {helper}) exited with code -9 (SIGKILL)"
    said = [text for text in out.splitlines() if line in text]
    assert len(said) == 1, out
    assert "Traceback" not in out
    assert _journalled(run_dir) == [0, 1]
    assert gone(helper)

    resumed = pytester.runpytest_subprocess(*args, "--osmosis-name", "cut")
    assert resumed.ret == 0, resumed.stdout.str()
    assert sorted(r["row_index"] for r in read_index(run_dir)) == [0, 1, 2, 3]
    assert _summary(run_dir) == _summary(root / ".osmosis" / "evals" / "whole")


def test_a_remote_bridge_answers_a_row_as_the_bridge_does(
    model_loop: Any, model_server: ModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The same row against `Bridge` here and `RemoteBridge` (the same code in the helper):
    the same answers, refusals, per-row snapshot, totals and log line, on the LiteLLM route."""
    import aiohttp

    from pytest_osmosis.model.bridge import Bridge
    from pytest_osmosis.model.bridge_process import RemoteBridge

    async def post(url: str, key: str, text: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                url + "/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": text}]},
                headers={"Authorization": f"Bearer {key}"},
            ) as response:
                return response.status, await response.json()

    route = ModelRoute(
        "openai/osmosis-test",
        "openai/osmosis-test",
        {"api_base": model_server.url, "api_key": "sk-remote-test", "organization": "org-x"},
    )  # an organization: only LiteLLM sends it, so the rows go through LiteLLM
    seen: dict[str, Any] = {}
    for name, bridge in (("here", Bridge(route)), ("helper", RemoteBridge(route))):
        model_loop.run(bridge.start())
        try:
            caplog.clear()
            url, key = bridge.open_rollout("row")
            model_server.fail_next(429, count=2, retry_after=0)  # retried by the back-off
            first = model_loop.run(post(url, key, "What is 2 + 2?"))
            usage = bridge.call_usage("row")
            model_server.fail_next(400, message="bad request from the provider")
            second = model_loop.run(post(url, key, "What is 3 + 3?"))
            wrong = model_loop.run(post(url, "wrong", "What is 1 + 1?"))[0]
            tokens = bridge.close_rollout("row")
            closed = model_loop.run(post(url, key, "What is 1 + 1?"))[0]
            seen[name] = (
                first,
                usage,
                second[0],
                second[1]["error"]["type"],
                wrong,
                closed,
                tokens,
                bridge.pop_cost("row"),
                bridge.pop_rate_limited("row"),
                bridge.pop_provider_errors("row"),
                (bridge.calls, bridge.errors, bridge.tokens_total, bridge.exhaustions),
                [r.getMessage() for r in caplog.records if r.name == "pytest_osmosis.model.bridge"],
            )
        finally:
            model_loop.run(bridge.close())
    for name in seen:  # ids and timings aside
        seen[name][0][1].pop("id", None)
        seen[name][0][1].pop("created", None)
    assert seen["helper"] == seen["here"]
    here = seen["here"]
    assert here[0][0] == 200 and here[2:6] == (400, "invalid_request_error", 401, 404)
    assert here[6] and here[8] == 2 and len(here[1]) == 1
    assert len(here[11]) == 1 and "bad request from the provider" in here[11][0]
