"""The model-call cache (model/cache.py): real sessions against the loopback model server,
counting the requests it receives, and the SQLite file read back directly.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from workspaces import calc_rows, only_run_dir, read_index, write_workspace

from pytest_osmosis.model.cache import CACHE_FILENAME, cache_path

pytestmark = pytest.mark.bridge_placements  # sessions with either bridge (conftest)

QUESTIONS = [("What is 2 + 2?", "4"), ("What is 3 * 5?", "15"), ("What is 7 - 2?", "5")]


def _cache_file(root: Path) -> Path:
    return cache_path(root / ".osmosis" / "evals")


def _entries(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return list(conn.execute("SELECT key, model, response, total_tokens FROM calls"))


def _results(root: Path) -> list[tuple[Any, ...]]:
    """What a run recorded per attempt, without what differs between runs (ids, time)."""
    return sorted(
        (r["row_index"], r["run_index"], r["status"], r["reward"], r["tokens"], r.get("error_type"))
        for r in read_index(only_run_dir(root))
    )


def _fresh_runs(root: Path) -> None:
    """Remove the run directories (not the cache beside them) for a second, fresh session."""
    import shutil

    output = root / ".osmosis" / "evals"
    for entry in output.iterdir():
        if entry.name != ".cache":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def test_a_second_run_with_use_calls_no_model_and_gives_the_same_results(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS), evaluation={"n": 2})
    first = pytester.runpytest("--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider")
    first.assert_outcomes(passed=6)
    assert model_env.requests_total == 7  # the preflight's call, then one per attempt
    recorded = _results(pytester.path)
    assert len(_entries(_cache_file(pytester.path))) == 6  # 3 rows x 2 attempts, one call each
    assert not list(only_run_dir(pytester.path).rglob(CACHE_FILENAME))  # never in a run dir

    _fresh_runs(pytester.path)
    model_env.reset()
    second = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    )
    second.assert_outcomes(passed=6)
    assert model_env.requests_total == 1  # the preflight's: any row may still call the model
    second.stdout.fnmatch_lines(
        [f"cache      6 of 6 model calls answered from {_cache_file(pytester.path)}"]
    )
    assert _results(pytester.path) == recorded  # rewards and tokens: the recorded usage
    metrics = json.loads((only_run_dir(pytester.path) / "metrics.json").read_text())
    assert metrics["summary"]["tokens_used"] == sum(r[4] for r in recorded)


def test_off_is_the_default_and_writes_no_cache(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:1]))
    pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert not (pytester.path / ".osmosis" / "evals" / ".cache").exists()


def test_replay_fails_exactly_the_row_whose_entry_is_gone_and_calls_no_model(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS))
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "record", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=3)
    path = _cache_file(pytester.path)
    with sqlite3.connect(path) as conn:
        keys = {
            json.loads(response)["choices"][0]["message"]["content"]: key
            for key, response in conn.execute("SELECT key, response FROM calls")
        }
        conn.execute("DELETE FROM calls WHERE key = ?", (keys["15"],))  # row 1's only call
    _fresh_runs(pytester.path)
    model_env.reset()

    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "replay", "-p", "no:cacheprovider"
    )

    result.assert_outcomes(passed=2, errors=1)
    assert model_env.requests_total == 0
    result.stdout.fnmatch_lines(
        ["*cache_miss: no recorded answer for row 1 run 0 call 1 (openai/test-model)*"]
    )
    index = {r["row_index"]: r for r in read_index(only_run_dir(pytester.path))}
    assert index[1]["status"] == "failed" and index[1]["error_type"] == "cache_miss"
    assert [index[i]["status"] for i in (0, 2)] == ["success", "success"]


def test_replay_without_a_cache_stops_before_any_row(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:1]))
    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "replay", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--osmosis-cache replay: no model-call cache at *"])
    assert model_env.requests_total == 0


def test_bad_cache_options_are_one_line(pytester: pytest.Pytester) -> None:
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:1]))
    result = pytester.runpytest("--osmosis-eval", "--osmosis-cache", "sometimes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--osmosis-cache: expected one of off, use, record, replay, got 'sometimes'"]
    )
    result = pytester.runpytest("--osmosis-eval", "--osmosis-cache-max-age", "7 days")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--osmosis-cache-max-age: expected a positive age like*"])


def test_n_attempts_hit_distinct_entries(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    """Each attempt of a row has its own entry: deleting attempt 1's fails attempt 1 alone."""
    from pytest_osmosis.model.cache import CallCache

    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:1]), evaluation={"n": 3})
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=3)
    path = _cache_file(pytester.path)
    entries = _entries(path)
    assert len({key for key, *_ in entries}) == 3
    body = {"model": "anything", "messages": [{"role": "user", "content": QUESTIONS[0][0]}]}
    keys = [
        CallCache(path, "use").attempt("calc", 0, attempt).key("openai/test-model", body)[0]
        for attempt in range(3)
    ]
    assert sorted(keys) == sorted(key for key, *_ in entries)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM calls WHERE key = ?", (keys[1],))
    _fresh_runs(pytester.path)
    model_env.reset()

    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "replay", "-p", "no:cacheprovider", "-rf"
    )

    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "cache_miss: no recorded answer for row 0 run 1 call 1 *",
            "*row 0 run 1: errored (cache_miss)*",
        ]
    )
    assert model_env.requests_total == 0


TOOL_ROLLOUT = r"""
import json
import os

import httpx

from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowOutput, Grader, get_rollout_context,
)

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]


def _message(response, stream):
    if not stream:
        return response.json()["choices"][0]["message"]
    for line in response.text.splitlines():  # the bridge streams one whole chunk
        if line.startswith("data: {"):
            return {"role": "assistant", **json.loads(line[6:])["choices"][0]["delta"]}


class ToolAgent(AgentWorkflow):
    async def run(self, ctx):
        rollout = get_rollout_context()
        stream = bool((ctx.metadata or {}).get("stream"))
        messages = list(ctx.prompt)
        async with httpx.AsyncClient(timeout=120) as client:
            for _ in range(4):
                response = await client.post(
                    rollout.chat_completions_url + "/chat/completions",
                    headers={"Authorization": f"Bearer {rollout.api_key}"},
                    json={"model": "m", "messages": messages, "tools": TOOLS, "stream": stream},
                )
                response.raise_for_status()
                message = _message(response, stream)
                for call in message.get("tool_calls") or []:
                    call.pop("index", None)
                messages.append(message)
                if not message.get("tool_calls"):
                    break
                for call in message["tool_calls"]:
                    args = json.loads(call["function"]["arguments"])
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] + args["b"])}
                    )
        return AgentWorkflowOutput(messages=messages)


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"].strip() == ctx.label else 0.0)
"""


def test_a_two_turn_tool_calling_agent_replays_both_turns(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    from model_server import ToolRule

    model_env.tool_rules = [ToolRule("add", "add", {"a": 1, "b": 2})]
    rows = [
        {"user_prompt": "Please add 1 and 2", "ground_truth": "3"},
        {
            "user_prompt": "Now add 1 and 2, streamed",
            "ground_truth": "3",
            "metadata": {"stream": True},
        },
    ]
    write_workspace(pytester.path, rows=rows, rollout_source=TOOL_ROLLOUT)
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=2)
    # Two turns a row: the tool call, then the answer after the tool's result.
    assert [len(b["messages"]) for b in model_env.bodies].count(3) == 2
    assert len(_entries(_cache_file(pytester.path))) == 4
    recorded = _results(pytester.path)
    _fresh_runs(pytester.path)
    model_env.reset()  # no tool rules any more: a call reaching the model would answer wrong

    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "replay", "-p", "no:cacheprovider"
    )

    result.assert_outcomes(passed=2)
    assert model_env.requests_total == 0
    assert _results(pytester.path) == recorded
    result.stdout.fnmatch_lines(["cache      4 of 4 model calls answered from *"])
    for trial in (only_run_dir(pytester.path) / "rollout_trials").iterdir():
        doc = json.loads((trial / "trajectory.json").read_text())
        assert len([s for s in doc["steps"] if s["source"] == "agent"]) == 2


JUDGE_ROLLOUT = r"""
import httpx

from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowOutput, Grader, get_rollout_context,
)


async def ask(messages, judge=None):
    rollout = get_rollout_context()
    headers = {"Authorization": f"Bearer {rollout.api_key}"}
    if judge:
        headers["X-Osmosis-Judge-Model"] = judge
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(
            rollout.chat_completions_url + "/chat/completions",
            headers=headers, json={"model": "m", "messages": messages},
        )
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


class Ask(AgentWorkflow):
    async def run(self, ctx):
        answer = await ask(ctx.prompt)
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": answer}])


class Judged(Grader):
    async def grade(self, ctx):
        final = ctx.sample.messages[-1]["content"]
        verdict = await ask([{"role": "user", "content": f"grade {final} against {ctx.label}"}],
                            judge="openai/judge-model")
        ctx.set_reward(1.0 if "PASS" in verdict else 0.0)
"""


def test_judge_calls_are_cached_and_replay_needs_no_key(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_env.replies = {"grade": "PASS"}
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:2]), rollout_source=JUDGE_ROLLOUT)
    pytester.makeini("[pytest]\nosmosis_judge_models = openai/judge-model\n")
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=2)
    models = sorted(model for _, model, *_ in _entries(_cache_file(pytester.path)))
    assert models == ["openai/judge-model"] * 2 + ["openai/test-model"] * 2
    _fresh_runs(pytester.path)
    model_env.reset()
    for name in ("OPENAI_API_KEY", "OPENAI_API_BASE", "OPENAI_BASE_URL"):  # offline CI
        monkeypatch.delenv(name)

    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "replay", "-p", "no:cacheprovider"
    )

    result.assert_outcomes(passed=2)
    assert model_env.requests_total == 0


SECRET = "tool-token-0123456789"

SECRET_ROLLOUT = r"""
import os

import httpx

from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowOutput, Grader, get_rollout_context,
)


class Ask(AgentWorkflow):
    async def run(self, ctx):
        rollout = get_rollout_context()
        messages = list(ctx.prompt)
        if (ctx.metadata or {}).get("do") == "send_secret":
            messages.insert(0, {"role": "system", "content": "token " + os.environ["TOOL_TOKEN"]})
        async with httpx.AsyncClient(timeout=120) as client:
            response = await client.post(
                rollout.chat_completions_url + "/chat/completions",
                headers={"Authorization": f"Bearer {rollout.api_key}"},
                json={"model": "m", "messages": messages},
            )
        response.raise_for_status()
        answer = response.json()["choices"][0]["message"]["content"]
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": answer}])


class Any(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)
"""


def test_secrets_never_enter_the_cache(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOL_TOKEN", SECRET)
    model_env.replies = {"leak": f"the token is {SECRET}"}
    rows = calc_rows(
        [("What is 2 + 2?", "4"), ("What is 1 + 1?", "2", "send_secret"), ("please leak", "x")]
    )
    write_workspace(pytester.path, rows=rows, rollout_source=SECRET_ROLLOUT, secrets=["TOOL_TOKEN"])
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=3)
    path = _cache_file(pytester.path)
    entries = _entries(path)
    assert [json.loads(e[2])["choices"][0]["message"]["content"] for e in entries] == ["4"]
    stored = b"".join(p.read_bytes() for p in path.parent.iterdir())
    for value in (SECRET, "sk-test-model-server", "Bearer"):  # nor the bridge's bearer
        assert value.encode() not in stored
    _fresh_runs(pytester.path)

    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "replay", "-p", "no:cacheprovider", "-rf"
    )

    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "cache_miss: no recorded answer for row 1 run 0 call 1 *(a call whose request holds a secret*"
        ]
    )


def test_entries_older_than_the_max_age_are_called_again(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:2]))
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=2)
    path = _cache_file(pytester.path)
    with sqlite3.connect(path) as conn:  # row 0's answer is 8 days old, row 1's 6 days
        conn.execute("UPDATE calls SET created = created - 6 * 86400")
        old = """created - 2 * 86400 WHERE response LIKE '%"content": "4"%'"""
        assert conn.execute(f"UPDATE calls SET created = {old}").rowcount == 1
    _fresh_runs(pytester.path)
    model_env.reset()

    pytester.runpytest(
        "--osmosis-eval",
        "--osmosis-cache",
        "use",
        "--osmosis-cache-max-age",
        "7d",
        "-p",
        "no:cacheprovider",
    ).assert_outcomes(passed=2)

    assert [m[-1]["content"] for m in (b["messages"] for b in model_env.bodies)] == [
        "hi",  # the preflight's
        "What is 2 + 2?",
    ]
    assert len(_entries(path)) == 2  # the old entry was replaced, not duplicated


KILL_ROLLOUT = r"""
import os
import signal
from pathlib import Path

import httpx

from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowOutput, Grader, get_rollout_context,
)


class Ask(AgentWorkflow):
    async def run(self, ctx):
        rollout = get_rollout_context()
        async with httpx.AsyncClient(timeout=120) as client:
            response = await client.post(
                rollout.chat_completions_url + "/chat/completions",
                headers={"Authorization": f"Bearer {rollout.api_key}"},
                json={"model": "m", "messages": ctx.prompt},
            )
        response.raise_for_status()
        answer = response.json()["choices"][0]["message"]["content"]
        marker = (ctx.metadata or {}).get("kill")
        if marker and Path(marker).exists():
            # The answer was just handed to the cache's writer: die with it queued or
            # being written, as kill -9 from outside would.
            os.kill(os.getpid(), signal.SIGKILL)
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": answer}])


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"].strip() == ctx.label else 0.0)
"""


def _integrity(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def test_xdist_workers_share_the_cache_and_a_killed_worker_tears_nothing(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    marker = pytester.path / "kill-marker"
    marker.touch()
    rows = [{"user_prompt": f"What is {i} + 10?", "ground_truth": str(i + 10)} for i in range(8)]
    rows[3]["metadata"] = {"kill": str(marker)}
    write_workspace(pytester.path, rows=rows, rollout_source=KILL_ROLLOUT)
    path = _cache_file(pytester.path)
    common = ("--osmosis-eval", "-n", "2", "-p", "no:cacheprovider", "--osmosis-cache")

    first = pytester.runpytest_subprocess(*common, "use", "--osmosis-name", "first")
    first.assert_outcomes(passed=7, errors=1)  # the killed worker's row: worker_crashed
    assert _integrity(path) == "ok"
    answers = [json.loads(e[2])["choices"][0]["message"]["content"] for e in _entries(path)]
    assert len(answers) == len(set(answers)) >= 7  # no call stored twice, none torn

    marker.unlink()
    model_env.reset()
    second = pytester.runpytest_subprocess(*common, "use", "--osmosis-name", "second")
    second.assert_outcomes(passed=8)
    # The preflight, and only what the kill lost.
    assert model_env.requests_total == 1 + 8 - len(answers)
    model_env.reset()
    third = pytester.runpytest_subprocess(*common, "replay", "--osmosis-name", "third")
    third.assert_outcomes(passed=8)
    third.stdout.fnmatch_lines(["cache      8 of 8 model calls answered from *"])  # both workers'
    assert model_env.requests_total == 0
    assert len(_entries(path)) == 8 and _integrity(path) == "ok"


MID_WRITE = r'''
import json, os, sqlite3, sys, time
from pathlib import Path

import pytest_osmosis.model.cache as cache_module
from pytest_osmosis.model.cache import CallCache, _Entry

path, fd = Path(sys.argv[1]), int(sys.argv[2])


def entry(i):
    response = {"choices": [{"message": {"content": str(i) + "x" * 20000}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    return _Entry(i.to_bytes(32, "big"), "m", "d#0:0", response, 1.0, (), ())


first = CallCache(path, "use").open()
for i in range(10):
    first.store(entry(i))
first.close()  # ten entries written and committed

connect = cache_module._connect


def stalling(path):
    """The writer's connection: it stops inside its first statement and says so."""
    conn = connect(path)
    said = []

    def progress():
        if not said:
            said.append(1)
            os.write(fd, b"writing\n")
        time.sleep(0.05)
        return 0

    conn.set_progress_handler(progress, 50)
    return conn


second = CallCache(path, "use").open()
cache_module._connect = stalling  # the writer thread connects at its first batch
for i in range(10, 200):
    second.store(entry(i))
time.sleep(600)
'''


def test_a_writer_killed_mid_write_leaves_every_committed_entry_whole(tmp_path: Path) -> None:
    path = tmp_path / ".cache" / CACHE_FILENAME
    script = tmp_path / "writer.py"
    script.write_text(MID_WRITE)
    read, write = os.pipe()
    child = subprocess.Popen(
        [sys.executable, str(script), str(path), str(write)], pass_fds=(write,)
    )
    os.close(write)
    try:
        with os.fdopen(read, "rb") as said:
            assert said.readline() == b"writing\n"  # inside the second transaction
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(60)
    assert child.returncode == -signal.SIGKILL
    assert _integrity(path) == "ok"
    entries = _entries(path)
    contents = [json.loads(r)["choices"][0]["message"]["content"] for _, _, r, _ in entries]
    assert sorted(int(text[:-20000]) for text in contents) == list(range(10))


def test_a_second_session_replays_while_another_writes(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """Session A records (its answers held by the model server, its writer busy); session B
    replays other rows from the same file meanwhile, without waiting for A and without
    calling the model."""
    from workspaces import Background, wait_until

    rows_b = [{"user_prompt": f"What is {i} * 2?", "ground_truth": str(i * 2)} for i in range(4)]
    write_workspace(pytester.path, name="b", dataset="b", rows=rows_b)
    rows_a = [
        {"user_prompt": f"What is {i} + 100?", "ground_truth": str(i + 100)} for i in range(12)
    ]
    for row in rows_a[6:]:
        row["user_prompt"] += " (held)"
    write_workspace(pytester.path, name="a", dataset="a", rows=rows_a)
    common = ("-p", "no:cacheprovider", "--osmosis-cache")
    pytester.runpytest_subprocess("configs/eval/b.toml", *common, "use").assert_outcomes(passed=4)
    path = _cache_file(pytester.path)
    model_env.reset()
    model_env.hold = "(held)"

    writing = Background(
        pytester, "configs/eval/a.toml", "--osmosis-concurrency", "12", *common, "record"
    )
    # A has written its first six answers and holds six more calls open, with the file open.
    wait_until(lambda: model_env.holding == 6, "session A holds six calls")
    wait_until(lambda: len(_entries(path)) == 4 + 6, "session A wrote six entries")
    replaying = pytester.runpytest_subprocess(
        "configs/eval/b.toml", *common, "replay", "--osmosis-name", "b-replay"
    )
    replaying.assert_outcomes(passed=4)
    assert not [b for b in model_env.bodies if "* 2" in b["messages"][-1]["content"]]
    model_env.hold = ""
    writing.join().assert_outcomes(passed=12)
    assert len(_entries(path)) == 16 and _integrity(path) == "ok"


def test_the_cache_command_lists_prunes_clears_and_finds_it(
    pytester: pytest.Pytester, model_env: ModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_osmosis.cli import main

    write_workspace(pytester.path, rows=calc_rows(QUESTIONS), rollout_source=JUDGE_ROLLOUT)
    pytester.makeini("[pytest]\nosmosis_judge_models = openai/judge-model\n")
    model_env.replies = {"grade": "PASS"}
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=3)
    output = str(pytester.path / ".osmosis" / "evals")
    path = _cache_file(pytester.path)
    capsys.readouterr()

    assert main(["cache", "path", "--output", output]) == 0
    assert capsys.readouterr().out == f"{path}\n"
    assert main(["cache", "list", "--output", output]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{path}: 6 entries, ")
    assert lines[2].split()[:2] == ["model", "entries"]
    assert [line.split()[:2] for line in lines[4:]] == [
        ["openai/judge-model", "3"],
        ["openai/test-model", "3"],
    ]
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE calls SET created = created - 3 * 86400 WHERE model LIKE '%judge%'")
    assert main(["cache", "prune", "--max-age", "2d", "--output", output, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 3
    assert main(["cache", "list", "--output", output, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["models"]
    assert [(m["model"], m["entries"]) for m in listed] == [("openai/test-model", 3)]
    assert main(["cache", "prune", "--max-age", "soon", "--output", output]) == 2
    assert "--max-age: expected a positive age" in capsys.readouterr().err
    assert main(["cache", "clear", "--output", output]) == 0
    assert capsys.readouterr().out == f"removed 3 entries from {path}\n"
    assert _entries(path) == []


REPEAT_ROLLOUT = r'''
import httpx

from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowOutput, Grader, get_rollout_context,
)


class AskTwice(AgentWorkflow):
    """The same request twice in one attempt (self-consistency sampling, a retry)."""

    async def run(self, ctx):
        rollout = get_rollout_context()
        ids = []
        async with httpx.AsyncClient(timeout=120) as client:
            for _ in range(2):
                response = await client.post(
                    rollout.chat_completions_url + "/chat/completions",
                    headers={"Authorization": f"Bearer {rollout.api_key}"},
                    json={"model": "m", "messages": ctx.prompt, "temperature": 1.0},
                )
                response.raise_for_status()
                ids.append(response.json()["id"])
        (ctx.artifacts_dir / "ids.txt").write_text(" ".join(ids))
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": "ok"}])


class Any(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)
'''


def test_the_same_request_twice_in_an_attempt_replays_both_answers_in_order(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:1]), rollout_source=REPEAT_ROLLOUT)

    def ids() -> list[str]:
        (found,) = (only_run_dir(pytester.path) / "artifacts").rglob("ids.txt")
        return found.read_text().split()

    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=1)
    recorded = ids()
    assert len(set(recorded)) == 2 and len(_entries(_cache_file(pytester.path))) == 2
    _fresh_runs(pytester.path)
    model_env.reset()

    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "replay", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=1)

    assert ids() == recorded and model_env.requests_total == 0


def test_the_plan_counts_the_work_items_the_cache_will_answer(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """--osmosis-plan with a cache mode says how many work items have recorded answers."""
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS), evaluation={"n": 2})
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=6)
    path = _cache_file(pytester.path)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM calls WHERE attempt = ?", ("calc#1:0",))
    _fresh_runs(pytester.path)
    model_env.reset()

    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-plan", "--osmosis-cache", "replay", "-p", "no:cacheprovider"
    )
    result.stdout.fnmatch_lines(
        ["  cache * replay, expected hits: answers recorded for 5 of 6 work items"]
    )
    assert model_env.requests_total == 0
    record = pytester.runpytest(
        "--osmosis-eval", "--osmosis-plan", "--osmosis-cache", "record", "-p", "no:cacheprovider"
    )
    record.stdout.fnmatch_lines(["  cache * record"])
    # The plan shows the mode the session runs with (checked), not the value as typed.
    typed = pytester.runpytest(
        "--osmosis-eval", "--osmosis-plan", "--osmosis-cache= Replay ", "-p", "no:cacheprovider"
    )
    typed.stdout.fnmatch_lines(
        ["  cache * replay, expected hits: answers recorded for 5 of 6 work items"]
    )
    assert " Replay " not in typed.stdout.str()


RETRY_ROLLOUT = r'''
import httpx

from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowOutput, Grader, get_rollout_context,
)


class AskUntilAnswered(AgentWorkflow):
    """Retries a call the provider failed (as the openai client does on a 5xx)."""

    async def run(self, ctx):
        rollout = get_rollout_context()
        async with httpx.AsyncClient(timeout=120) as client:
            for _ in range(3):
                response = await client.post(
                    rollout.chat_completions_url + "/chat/completions",
                    headers={"Authorization": f"Bearer {rollout.api_key}"},
                    json={"model": "m", "messages": ctx.prompt},
                )
                if response.status_code < 500:
                    break
            response.raise_for_status()
            answer = response.json()["choices"][0]["message"]["content"]
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": answer}])


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(float(ctx.sample.messages[-1]["content"].strip() == ctx.label))
'''


def test_a_call_retried_after_a_provider_failure_replays(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """The failed call got no answer, so it holds no repeat number: the retry's answer is
    stored as the call's first, and replay finds it there (it was stored as the second)."""
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:2]), rollout_source=RETRY_ROLLOUT)
    # Three 500s: the bridge's own two retries fail too, so the rollout sees the failure.
    model_env.fail_on = {QUESTIONS[0][0]: (500, 3)}
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=2)
    assert model_env.requests_total == 1 + 3 + 2  # the preflight, the failed call, its retry
    _fresh_runs(pytester.path)
    model_env.reset()

    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "replay", "-p", "no:cacheprovider"
    )

    result.assert_outcomes(passed=2)
    assert model_env.requests_total == 0


def test_concurrent_repeats_keep_their_numbers_and_a_failed_one_gives_its_back(
    tmp_path: Path,
) -> None:
    """Two identical calls in flight hold repeats 0 and 1; the first fails, so its retry is
    repeat 0 again, and a replay of the attempt answers both calls."""
    import asyncio

    from pytest_osmosis.model.cache import CacheMiss, CallCache

    path = tmp_path / CACHE_FILENAME
    body = {"model": "m", "messages": [{"role": "user", "content": "same"}]}

    def answer(text: str) -> dict[str, Any]:
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}

    async def record() -> list[str]:
        cache = CallCache(path, "use").open()
        attempt = cache.attempt("d", 0, 0)
        first_may_fail = asyncio.Event()
        served: list[str] = []

        async def failing() -> Any:
            await first_may_fail.wait()
            raise RuntimeError("provider failed")

        async def second() -> Any:
            first_may_fail.set()
            return answer("second")

        async def first_then_retry() -> None:
            try:
                await attempt.serve("m", body, failing)
            except RuntimeError:
                response, _ = await attempt.serve("m", body, lambda: _ready(answer("retry")))
                served.append(response["choices"][0]["message"]["content"])

        first = asyncio.ensure_future(first_then_retry())
        await asyncio.sleep(0)  # the first call holds repeat 0 before the second asks
        response, _ = await attempt.serve("m", body, second)
        served.append(response["choices"][0]["message"]["content"])
        await first
        cache.close()
        return served

    async def _ready(value: Any) -> Any:
        return value

    async def replay() -> list[str]:
        cache = CallCache(path, "replay").open()
        attempt = cache.attempt("d", 0, 0)

        async def never() -> Any:
            raise AssertionError("replay called the model")

        try:
            answers = [await attempt.serve("m", body, never) for _ in range(2)]
        except CacheMiss as miss:
            raise AssertionError(str(miss)) from None
        finally:
            cache.close()
        return [response["choices"][0]["message"]["content"] for response, hit in answers if hit]

    assert asyncio.run(record()) == ["second", "retry"]
    assert asyncio.run(replay()) == ["retry", "second"]  # repeat 0, then repeat 1


def _damage(root: Path, response: str) -> str:
    """Replace the cache's only entry's answer; returns its key (hex)."""
    with sqlite3.connect(_cache_file(root)) as conn:
        ((key,),) = conn.execute("SELECT key FROM calls").fetchall()
        conn.execute("UPDATE calls SET response = ? WHERE key = ?", (response, key))
    return bytes(key).hex()


def test_use_calls_the_model_again_for_a_damaged_entry_and_records_it_over(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:1]))
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=1)
    recorded = _results(pytester.path)
    key = _damage(pytester.path, "[]")
    _fresh_runs(pytester.path)
    model_env.reset()

    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    )

    result.assert_outcomes(passed=1)
    assert model_env.requests_total == 2  # the preflight, and the damaged entry's call
    assert _results(pytester.path) == recorded
    ((stored_key, _, response, _),) = _entries(_cache_file(pytester.path))
    assert bytes(stored_key).hex() == key
    assert json.loads(response)["choices"][0]["message"]["content"] == "4"


def test_use_checks_the_model_before_any_row_even_when_the_cache_knows_it(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row the cache cannot answer would call a dead endpoint: one line, exit 4, nothing
    recorded (not the row's agent_error)."""
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:1]))
    pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    ).assert_outcomes(passed=1)
    write_workspace(pytester.path, rows=calc_rows(QUESTIONS[:2]))  # row 1: no answer recorded
    _fresh_runs(pytester.path)
    for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.setenv(name, "http://127.0.0.1:9/v1")  # nothing listens there

    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "use", "-p", "no:cacheprovider"
    )

    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["ERROR: model preflight failed for 'openai/test-model': *"])
    runs = (pytester.path / ".osmosis" / "evals").iterdir()
    assert not [run for run in runs if not run.name.startswith(".")]  # only .cache, .locks
