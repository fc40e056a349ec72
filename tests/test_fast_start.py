"""Fast where users wait (issue 15): start-up milestones, a preflight without LiteLLM for
OpenAI-compatible routes, ``osmosis/embedded`` without LiteLLM, and the proof that a direct
request is byte-for-byte the one LiteLLM sends (same usage and tokens back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from workspaces import calc_rows, free_port, write_workspace

from pytest_osmosis.model import direct
from pytest_osmosis.model.bridge import Bridge
from pytest_osmosis.model.routes import EMBEDDED_MODEL_PATH, ModelRoute
from pytest_osmosis.model.wire import _call_metrics, _chat_call, _control_names, _payload, _usage
from pytest_osmosis.plugin.milestones import Milestones

REPO = Path(__file__).resolve().parent.parent
BASE = ("--osmosis-eval", "-p", "no:cacheprovider")
MILESTONES = [
    "osmosis [[]*s[]] starting the eval session ... * s",
    "osmosis [[]*s[]] importing rollout calc ... * s",
    "osmosis [[]*s[]] checking model openai/test-model ... * s",
]


# ----------------------------------------------------------------------------- milestones


def test_start_up_milestones_appear_once_start_up_succeeds(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    write_workspace(pytester.path, rows=calc_rows([("What is 1 + 1?", "2")]))
    result = pytester.runpytest(*BASE)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(MILESTONES)
    # Written before pytest's own header (nothing else has been said yet).
    lines = result.stdout.lines
    first = next(i for i, line in enumerate(lines) if line.startswith("osmosis ["))
    header = next(i for i, line in enumerate(lines) if "test session starts" in line)
    assert first < header, lines


def test_start_up_milestones_appear_under_xdist(pytester: pytest.Pytester, model_env: Any) -> None:
    write_workspace(
        pytester.path, rows=calc_rows([("What is 1 + 1?", "2"), ("What is 2 + 2?", "4")])
    )
    result = pytester.runpytest_subprocess(*BASE, "-n", "2")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(MILESTONES)


def test_the_first_line_is_written_before_the_session_modules_are_imported(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    """Importing the session (aiohttp, pydantic) is the longest silence after pytest starts:
    on a terminal, the first milestone is on screen before it begins."""
    write_workspace(pytester.path, rows=calc_rows([("What is 1 + 1?", "2")]))
    pytester.makeconftest(
        """
        import sys
        from _pytest.terminal import TerminalReporter

        first = []
        init, write = TerminalReporter.__init__, TerminalReporter.write

        class Yes:  # what pytest's reporter.isatty is on a terminal: true, and callable
            def __bool__(self):
                return True

            def __call__(self):
                return True

        def on_a_terminal(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.isatty = Yes()  # milestones are written as each phase starts

        def noting_write(self, content, **kwargs):
            if content.startswith("osmosis [") and not first:
                first.append((content, "pytest_osmosis.plugin.session" in sys.modules))
            return write(self, content, **kwargs)

        TerminalReporter.__init__ = on_a_terminal
        TerminalReporter.write = noting_write

        def pytest_unconfigure(config):
            print("FIRST MILESTONE", first)
        """
    )
    result = pytester.runpytest_subprocess(*BASE)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["FIRST MILESTONE [[]('osmosis [[]*s[]] starting the eval session ...', False)[]]"]
    )


def test_quiet_runs_show_no_milestones(pytester: pytest.Pytester, model_env: Any) -> None:
    write_workspace(pytester.path, rows=calc_rows([("What is 1 + 1?", "2")]))
    result = pytester.runpytest(*BASE, "-q")
    result.assert_outcomes(passed=1)
    assert not [line for line in result.outlines if line.startswith("osmosis [")]


class _Terminal:
    """What pytest's terminal reporter is to `Milestones`: a writer, a tty or not."""

    def __init__(self, isatty: bool) -> None:
        self.isatty = isatty
        self.text = ""

    def write(self, content: str, *, flush: bool = False) -> None:
        self.text += content

    def write_line(self, line: str) -> None:
        self.text += line + "\n"


def _screen(text: str) -> list[str]:
    """What a terminal shows: a carriage return goes back to the start of the line."""
    shown = []
    for line in text.split("\n"):
        shown.append(line.split("\r")[-1] if "\r" in line else line)
    return [line for line in shown if line.strip()]


def test_on_a_terminal_a_phase_shows_as_it_starts_and_a_failure_wipes_it() -> None:
    terminal = _Terminal(isatty=True)
    milestones = Milestones(terminal)
    with milestones.phase("importing rollout calc"):
        assert terminal.text.startswith("osmosis [")
        assert terminal.text.endswith("] importing rollout calc ...")  # before the phase ends
    with pytest.raises(RuntimeError), milestones.phase("checking model openai/x"):
        assert _screen(terminal.text)[-1].endswith("checking model openai/x ...")
        raise RuntimeError("dead endpoint")
    milestones.finish()
    [line] = _screen(terminal.text)  # the failed phase left nothing on screen
    assert line.startswith("osmosis [") and "importing rollout calc ... " in line
    assert line.endswith(" s")


def test_in_a_log_a_failed_start_up_writes_no_milestone() -> None:
    terminal = _Terminal(isatty=False)
    milestones = Milestones(terminal)
    with milestones.phase("importing rollout calc"):
        pass
    assert terminal.text == ""  # not yet: a failure later must stay one line
    with pytest.raises(RuntimeError), milestones.phase("checking model openai/x"):
        raise RuntimeError("dead endpoint")
    milestones.finish()
    assert terminal.text == ""


# ----------------------------------------------------------------------------- failing model


def _one_error_line(result: pytest.RunResult, *needles: str) -> str:
    output = [line for line in [*result.outlines, *result.errlines] if line.strip()]
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    assert len(output) == 1, output
    assert output[0].startswith("ERROR: model preflight failed for 'openai/test-model': ")
    assert all(needle in output[0] for needle in needles), output
    return output[0]


def test_an_unknown_model_id_is_one_line(pytester: pytest.Pytester, model_env: Any) -> None:
    model_env.fail_next(404, message="The model `test-model` does not exist", count=5)
    write_workspace(pytester.path, rows=calc_rows([("What is 1 + 1?", "2")]))
    result = pytester.runpytest(*BASE)
    _one_error_line(result, "NotFoundError", "The model `test-model` does not exist")
    assert model_env.requests_total == 1  # one direct request, no retries


def test_a_missing_key_is_one_line_and_sends_nothing(
    pytester: pytest.Pytester, model_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    write_workspace(pytester.path, rows=calc_rows([("What is 1 + 1?", "2")]))
    result = pytester.runpytest(*BASE)
    _one_error_line(result, "no API key, set OPENAI_API_KEY")
    assert model_env.requests_total == 0


# ----------------------------------------------------------------------------- no LiteLLM

PROBE = """
import sys


def pytest_unconfigure(config):
    with open("litellm-imported.txt", "w") as fh:
        fh.write(str("litellm" in sys.modules))
"""


def test_a_failing_check_of_an_openai_compatible_route_never_needs_litellm(
    pytester: pytest.Pytester, model_env: Any
) -> None:
    model_env.fail_next(404, message="no such model", count=5)
    write_workspace(pytester.path, rows=calc_rows([("What is 1 + 1?", "2")]))
    pytester.makeconftest(PROBE)
    # The xdist controller runs no rows: it checks directly, with no child and no LiteLLM.
    result = pytester.runpytest_subprocess(*BASE, "-n", "2")
    _one_error_line(result, "NotFoundError", "no such model")
    assert (pytester.path / "litellm-imported.txt").read_text() == "False"


def _embedded_installed() -> bool:
    from pytest_osmosis.model import embedded

    return embedded.find_gguf() is not None and _has("xllamacpp")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.skipif(not _embedded_installed(), reason="embedded model not installed")
def test_an_embedded_session_never_imports_litellm(tmp_path: Path) -> None:
    import shutil

    workspace = tmp_path / "example"
    shutil.copytree(REPO / "example_workspace", workspace)
    (workspace / "conftest.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PYTEST_"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "8 passed" in done.stdout
    assert "loading osmosis/embedded ... " in done.stdout
    assert (workspace / "litellm-imported.txt").read_text() == "False"


# ----------------------------------------------------------------------------- byte for byte


TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
}


class _Stub:
    """An OpenAI-compatible endpoint that keeps every request as it arrived, bytes and all."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _chat(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.requests.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": raw,
            }
        )
        body = json.loads(raw)
        message: dict[str, Any] = {"role": "assistant", "content": f"seen {len(raw)} bytes"}
        asked = str(body["messages"][-1].get("content"))
        if asked in REASONING_ANSWERS:  # the shapes local reasoning models answer in
            message = {"role": "assistant", **REASONING_ANSWERS[asked]}
        finish = "stop"
        if body.get("tools"):
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [TOOL_CALL],
            }
            finish = "tool_calls"
        answer = {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": 1700000000,
            "model": body.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": 11 + len(body["messages"]),
                "completion_tokens": 7,
                "total_tokens": 18 + len(body["messages"]),
                "prompt_tokens_details": {"cached_tokens": 3},
            },
        }
        return web.json_response(answer)


@pytest.fixture
def stub(model_loop: Any) -> Iterator[_Stub]:
    server = _Stub()
    model_loop.run(server.start())
    yield server
    model_loop.run(server.stop())


_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]
#: Answers with reasoning, by the question that asks for them: in think tags (Qwen3 or
#: DeepSeek-R1 on llama.cpp/Ollama), as vLLM's ``reasoning`` field, as ``reasoning_content``.
REASONING_ANSWERS: dict[str, dict[str, Any]] = {
    "think-tags": {"content": "<think>2 and 3 make 5</think>\n\nThe answer is 5."},
    "thinking-tags": {"content": "<thinking>a\nb</thinking>5 <think>x</think>"},
    "tags-not-first": {"content": "So: <think>not reasoning</think> 5"},
    "reasoning-field": {"content": "5", "reasoning": "2 + 3 = 5"},
    "reasoning-content": {"content": "5", "reasoning_content": "<think>kept</think>"},
    "both-fields": {"content": "<think>t</think>5", "reasoning_content": "r", "reasoning": "x"},
}
#: Bodies a rollout sends (the example's, an agent's multi-turn tool loop, every plain field,
#: and questions whose answers carry reasoning).
PLAIN_BODIES: list[dict[str, Any]] = [
    {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 256},
    # A null field of a message is left out (LiteLLM leaves it out), wherever it is.
    {
        "messages": [
            {"role": "system", "content": None},
            {"role": "user", "content": "x", "name": None},
            {"role": "assistant", "content": "", "tool_calls": None},
            {"role": "user", "content": "again"},
        ]
    },
    {
        "model": "osmosis-rollout",
        "messages": [
            {"role": "system", "content": 'Answer with one word. Ünïcode ✓ \u2028 "quotes"'},
            {"role": "user", "content": "What is the capital of Japan?"},
        ],
        "max_tokens": 24,
        "stream": False,
    },
    {
        "model": "agent",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Use the calculator: 2 + 3"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [TOOL_CALL],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "5"},
            {"role": "user", "name": "checker", "content": "And now?"},
        ],
        "tools": _TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 7,
        "stop": ["\n\n"],
        "n": 1,
        "user": "row-user",
        "metadata": {"suite": "direct"},
        "response_format": {"type": "text"},
        "max_completion_tokens": 64,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "logprobs": False,
    },
    *({"messages": [{"role": "user", "content": asked}]} for asked in REASONING_ANSWERS),
]


def _routes(stub: _Stub) -> list[ModelRoute]:
    return [
        # osmosis/embedded's route: its base, its key, greedy decoding.
        ModelRoute(
            EMBEDDED_MODEL_PATH,
            "openai/smollm2-135m-instruct",
            {"api_base": stub.url, "api_key": "sk-embedded", "temperature": 0.0},
        ),
        # The usual OpenAI-compatible route: base and key from the environment.
        ModelRoute("openai/test-model", "openai/test-model", {}),
    ]


def test_a_direct_request_is_the_one_litellm_sends(
    model_loop: Any, stub: _Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    import litellm

    monkeypatch.setenv("OPENAI_BASE_URL", stub.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    compared = 0
    for route in _routes(stub):
        assert direct.direct_base(route) == stub.url
        client = direct.DirectClient(route, stub.url)
        try:
            for body in PLAIN_BODIES:
                assert direct.is_plain(body), body
                stub.requests.clear()
                via_litellm = model_loop.run(
                    litellm.acompletion(
                        model=route.litellm_model, **_chat_call(litellm, body, route)
                    )
                )
                via_direct = model_loop.run(client.complete(body))
                theirs, ours = stub.requests
                assert ours["body"] == theirs["body"]  # byte for byte
                for key in ("method", "path"):
                    assert ours[key] == theirs[key]
                for header in ("Authorization", "Content-Type", "Accept"):
                    assert ours["headers"][header] == theirs["headers"][header], header
                # The same usage, tokens and answer reach the row.
                usage = _usage(via_direct)
                assert usage == _usage(via_litellm) and usage is not None
                assert _call_metrics(via_direct, usage) == _call_metrics(via_litellm, usage)
                for stream in (False, True):
                    assert _payload(via_direct, "m", usage, stream=stream) == _payload(
                        via_litellm, "m", usage, stream=stream
                    )
                compared += 1
        finally:
            model_loop.run(client.close())
    assert compared == len(PLAIN_BODIES) * 2


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "developer", "content": "be brief"}]},
        {"messages": [{"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": "http://127.0.0.1/x.png"}],
                }
            ]
        },
        {
            "messages": [
                {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "5"}]}
            ]
        },
        {"messages": [{"role": "user", "content": "hi"}], "extra_body": {"top_k": 3}},
        {"messages": [{"role": "user", "content": "hi"}], "top_k": 3},
        {"messages": [{"role": "user", "content": "hi"}], "n": 2},
        {"messages": []},
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": None, "type": "function", "function": {"name": "f"}}],
                }
            ]
        },
    ],
    ids=[
        "developer-role",
        "cache-control",
        "image",
        "tool-parts",
        "extra-body",
        "non-openai-field",
        "n",
        "no-messages",
        "null-inside-a-tool-call",
    ],
)
def test_what_litellm_rewrites_or_interprets_is_not_sent_directly(body: dict[str, Any]) -> None:
    assert not direct.is_plain(body)


def test_no_plain_field_is_a_litellm_setting() -> None:
    # The bridge refuses LiteLLM's own settings in a body; the direct path never sees one.
    assert not direct.PLAIN_FIELDS & _control_names()


def test_which_routes_may_be_called_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE", *direct._HEADER_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    local = {"api_base": "http://127.0.0.1:9/v1", "api_key": "k"}
    assert direct.direct_base(ModelRoute("openai/m", "openai/m", local)) is not None
    # OpenAI itself (the Responses API), another provider, a setting we do not reproduce.
    assert direct.direct_base(ModelRoute("openai/m", "openai/m", {})) is None
    official = {"api_base": "https://api.openai.com/v1/"}
    assert direct.direct_base(ModelRoute("openai/m", "openai/m", official)) is None
    assert direct.direct_base(ModelRoute("anthropic/m", "anthropic/m", local)) is None
    timed = {**local, "timeout": 5}
    assert direct.direct_base(ModelRoute("openai/m", "openai/m", timed)) is None
    monkeypatch.setenv("OPENAI_API_BASE", "http://127.0.0.1:9/v1")
    assert direct.direct_base(ModelRoute("openai/m", "openai/m", {})) == "http://127.0.0.1:9/v1"
    for variable in ("OPENAI_ORGANIZATION", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        with monkeypatch.context() as headed:  # LiteLLM's client would send a header
            headed.setenv(variable, "org-1")
            assert direct.direct_base(ModelRoute("openai/m", "openai/m", {})) is None, variable
    # A proxy LiteLLM's client would go through, by the base's scheme.
    remote = {"api_base": "https://models.example.invalid/v1", "api_key": "k"}
    for variable, base, expected in [
        ("HTTP_PROXY", local["api_base"], False),
        ("all_proxy", local["api_base"], False),
        ("HTTPS_PROXY", local["api_base"], True),
        ("https_proxy", remote["api_base"], False),
        ("http_proxy", remote["api_base"], True),
    ]:
        with monkeypatch.context() as proxied:
            proxied.setenv(variable, "http://127.0.0.1:9")
            route = ModelRoute("openai/m", "openai/m", {**local, "api_base": base})
            assert (direct.direct_base(route) is not None) is expected, variable
    # osmosis/embedded is our own loopback server: a proxy variable never sends it to LiteLLM.
    with monkeypatch.context() as proxied:
        proxied.setenv("HTTP_PROXY", "http://127.0.0.1:9")
        embedded = ModelRoute(EMBEDDED_MODEL_PATH, "openai/smollm2-135m-instruct", local)
        assert direct.direct_base(embedded) == local["api_base"]
        assert direct.rows_go_direct(embedded)
    # Rows go direct over plain HTTP only (HTTPS: LiteLLM's certificate settings decide).
    for base, rows in [
        ("http://127.0.0.1:9/v1", True),
        ("http://gpu-box.internal:8000/v1", True),
        (remote["api_base"], False),
    ]:
        route = ModelRoute("openai/m", "openai/m", {**local, "api_base": base})
        assert direct.direct_base(route) == base and direct.rows_go_direct(route) is rows


def _user_agents(stub: _Stub) -> list[str]:
    """Who made each request: LiteLLM's OpenAI client, or the direct one (aiohttp)."""
    agents = [str(r["headers"].get("User-Agent", "")) for r in stub.requests]
    return ["litellm" if agent.startswith("AsyncOpenAI") else "direct" for agent in agents]


def _row_call(loop: Any, bridge: Bridge, body: dict[str, Any]) -> dict[str, Any]:
    import httpx

    url, key = bridge.open_rollout("r1")

    async def post() -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
            response = await client.post(
                url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            response.raise_for_status()
            answer: dict[str, Any] = response.json()
            return answer

    try:
        return dict(loop.run(post()))
    finally:
        bridge.close_rollout("r1")


def test_the_bridge_takes_the_direct_path_only_where_it_may(
    model_loop: Any, stub: _Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    import litellm

    embedded = _routes(stub)[0]
    other = ModelRoute(
        "openai/test-model", "openai/test-model", {"api_base": stub.url, "api_key": "k"}
    )
    plain = {"messages": [{"role": "user", "content": "What is 2 + 3?"}]}
    rewritten = {"messages": [{"role": "developer", "content": "What is 2 + 3?"}]}
    for route, configured, expected in [
        (embedded, False, ["direct", "direct", "litellm"]),
        # Another endpoint over plain HTTP: its rows' plain bodies skip LiteLLM too.
        (other, False, ["direct", "direct", "litellm"]),
        # ... unless a rollout configured LiteLLM in code meanwhile (a callback to tell).
        (other, True, ["direct", "litellm", "litellm"]),
    ]:
        stub.requests.clear()
        bridge = Bridge(route)
        model_loop.run(bridge.start())
        try:
            model_loop.run(bridge.preflight())
            with monkeypatch.context() as patched:
                if configured:
                    patched.setattr(litellm, "success_callback", [lambda *args: None])
                first = _row_call(model_loop, bridge, plain)
                _row_call(model_loop, bridge, rewritten)
        finally:
            model_loop.run(bridge.close())
        assert _user_agents(stub) == expected, route
        assert first["usage"]["total_tokens"] == 19
        assert bridge.tokens_total == 19 * 2


class _Flaky(_Stub):
    """Fails its first requests the ways a provider does (a 503, a dropped connection)."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__()
        self.failures = failures

    async def _chat(self, request: web.Request) -> web.Response:
        if self.failures:
            failure = self.failures.pop(0)
            raw = await request.read()
            self.requests.append({"headers": dict(request.headers), "body": raw})
            if failure == "drop":
                assert request.transport is not None
                request.transport.close()
                raise ConnectionResetError("dropped by the test")
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        return await super()._chat(request)


@pytest.mark.parametrize("failures", [["503"], ["drop"], ["503", "drop"]])
def test_a_direct_row_call_is_retried_as_a_litellm_one_is(
    model_loop: Any, failures: list[str]
) -> None:
    # The retries are the bridge's (D79) on both paths: a 5xx or a dropped connection
    # is retried twice, paced, and the row gets the answer.
    flaky = _Flaky(list(failures))
    model_loop.run(flaky.start())
    route = ModelRoute("openai/m", "openai/m", {"api_base": flaky.url, "api_key": "k"})
    bridge = Bridge(route)
    model_loop.run(bridge.start())
    try:
        answer = _row_call(model_loop, bridge, {"messages": [{"role": "user", "content": "hi"}]})
    finally:
        model_loop.run(bridge.close())
        model_loop.run(flaky.stop())
    assert answer["choices"][0]["message"]["content"].startswith("seen ")
    assert _user_agents(flaky) == ["direct"] * (len(failures) + 1)


def test_a_dead_endpoint_fails_a_direct_row_call_in_one_line(model_loop: Any) -> None:
    import httpx

    route = ModelRoute("openai/m", "openai/m", {"api_base": f"http://127.0.0.1:{free_port()}/v1", "api_key": "k"})
    bridge = Bridge(route)
    model_loop.run(bridge.start())
    url, key = bridge.open_rollout("r1")

    async def post() -> httpx.Response:
        async with httpx.AsyncClient() as client:
            return await client.post(
                url + "/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {key}"},
                timeout=60,
            )

    try:
        response = model_loop.run(post())
    finally:
        bridge.close_rollout("r1")
        model_loop.run(bridge.close())
    assert response.status_code == 502
    detail = response.json()["detail"]
    assert detail.startswith("APIConnectionError: ") and "\n" not in detail, detail
