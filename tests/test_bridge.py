"""The LiteLLM bridge against a real loopback OpenAI-compatible server, with real LiteLLM.

Clients are the OpenAI SDK (what rollouts use) and raw aiohttp (to see status codes
and SSE framing). Also tests the network guard that keeps every test on loopback.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer, ToolRule, count_tokens

from pytest_osmosis.core.errors import ModelPreflightError
from pytest_osmosis.model import routes, wire
from pytest_osmosis.model.bridge import JUDGE_MODEL_HEADER, Bridge
from pytest_osmosis.model.routes import ModelRoute, resolve_route

MODEL = "openai/osmosis-test"  # unknown to LiteLLM's catalog: every param passes through


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Harness:
    """A started bridge plus helpers that call it the way rollouts do."""

    def __init__(self, loop: Any, bridge: Bridge) -> None:
        self.loop = loop
        self.bridge = bridge

    def run(self, coro: Any) -> Any:
        return self.loop.run(coro)

    def sdk(self, rollout_id: str) -> Any:
        import openai

        url, key = self.bridge.open_rollout(rollout_id)
        return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, str]:
        import aiohttp

        async def go() -> tuple[int, str]:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            async with aiohttp.ClientSession() as session:
                async with session.post(
                    self.bridge.base_url + path, data=data, headers=headers or {}
                ) as resp:
                    return resp.status, await resp.text()

        result: tuple[int, str] = self.run(go())
        return result


def _start(loop: Any, route: ModelRoute) -> Bridge:
    bridge = Bridge(route)
    loop.run(bridge.start())
    return bridge


@pytest.fixture
def harness(model_loop: Any, model_server: ModelServer) -> Iterator[Harness]:
    route = ModelRoute(MODEL, MODEL, {"api_base": model_server.url, "api_key": "sk-test-bridge"})
    bridge = _start(model_loop, route)
    yield Harness(model_loop, bridge)
    model_loop.run(bridge.close())


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_resolve_route_passes_provider_models_through() -> None:
    route = resolve_route("anthropic/claude-sonnet-4-5")
    assert route == ModelRoute("anthropic/claude-sonnet-4-5", "anthropic/claude-sonnet-4-5", {})


MODEL_MODULES = sorted(
    f"pytest_osmosis.model.{path.stem}"
    for path in (Path(__file__).parents[1] / "pytest_osmosis" / "model").glob("*.py")
    if path.stem != "__init__"
)


def test_importing_the_bridge_imports_neither_litellm_nor_aiohttp() -> None:
    assert "pytest_osmosis.model.bridge" in MODEL_MODULES
    code = (
        f"import sys, {', '.join(MODEL_MODULES)}; "
        "print('litellm' in sys.modules, 'aiohttp' in sys.modules)"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_the_model_package_never_imports_the_judge_or_pytest() -> None:
    """One-way: the judge uses pytest_osmosis.model, never the reverse (not even inside a
    function), and model access runs without pytest."""
    found = []
    for path in sorted((Path(__file__).parents[1] / "pytest_osmosis" / "model").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
                if node.module == "pytest_osmosis":
                    names += [f"pytest_osmosis.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "pytest" or name.startswith(
                    ("pytest_osmosis.rubric.judge", "pytest_osmosis.rubric.command")
                ):
                    found.append(f"{path.name}:{node.lineno} imports {name}")
    assert found == []


def test_round_trip_echoes_client_model_and_routes_to_configured(
    harness: Harness, model_server: ModelServer
) -> None:
    client = harness.sdk("r1")
    resp = harness.run(
        client.chat.completions.create(model="my-alias", messages=_user("What is 6 * 7?"))
    )
    assert resp.model == "my-alias"
    assert resp.choices[0].message.content == "42"
    assert resp.choices[0].finish_reason == "stop"
    # The provider saw the configured model, not the client's alias.
    assert model_server.bodies[-1]["model"] == "osmosis-test"
    expected_total = count_tokens("What is 6 * 7?") + 1
    assert resp.usage.total_tokens == expected_total
    assert harness.bridge.close_rollout("r1") == expected_total
    assert (harness.bridge.calls, harness.bridge.tokens_total) == (1, expected_total)


def test_every_inference_field_reaches_an_openai_compatible_endpoint(
    harness: Harness, model_server: ModelServer
) -> None:
    """As osmosis-ai 0.3.8's bridge: nothing is dropped, ``extra_body`` is merged in, and an
    OpenAI-compatible endpoint gets the fields as JSON, not through LiteLLM's mapping."""
    _, key = harness.bridge.open_rollout("r1")
    fields = {
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 50,
        "user": "someone",
        "metadata": {"a": 1},
        "seed": 3,
        "logprobs": True,
    }
    status, text = harness.post(
        "/v1/rollouts/r1/chat/completions",
        {"model": "x", "messages": _user("hello there"), **fields, "extra_body": {"top_k": 5}},
        {"Authorization": f"Bearer {key}"},
    )
    assert status == 200, text
    path, sent = model_server.requests[-1]
    assert path == "/v1/chat/completions" and sent["model"] == "osmosis-test"
    assert {k: sent.get(k) for k in fields} == fields and sent["top_k"] == 5
    assert "extra_body" not in sent and "n" not in sent
    assert json.loads(text)["choices"][0]["message"]["content"] == "echo: hello there"


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"api_base": "http://198.51.100.7/v1", "api_key": "stolen"}, "api_base, api_key"),
        ({"extra_body": {"base_url": "http://198.51.100.7/v1"}}, "base_url"),
        ({"litellm_logging_obj": 1, "timeout": 1}, "litellm_logging_obj, timeout"),
        ({"n": 2}, "only n=1"),
    ],
)
def test_a_body_that_would_change_the_bridge_is_refused_in_one_line(
    harness: Harness, model_server: ModelServer, extra: dict[str, Any], named: str
) -> None:
    _, key = harness.bridge.open_rollout("r1")
    auth = {"Authorization": f"Bearer {key}"}
    body = {"model": "x", "messages": _user("hi"), **extra}
    status, text = harness.post("/v1/rollouts/r1/chat/completions", body, auth)
    assert status == 400, text
    error = json.loads(text)["error"]
    assert error["type"] == "invalid_request_error" and named in error["message"]
    status, text = harness.post("/v1/rollouts/r1/chat/completions", {**body, "stream": True}, auth)
    event = next(e for e in _sse_events(text) if e.startswith("event: error"))
    assert json.loads(event.split("data: ", 1)[1])["error"]["code"] == 400
    assert model_server.requests_total == 0


def test_a_native_provider_gets_the_fields_as_litellm_parameters_never_dropped() -> None:
    """Anthropic (not OpenAI-compatible): fields are LiteLLM kwargs and ``drop_params`` is
    off, so an unsupported one is the provider's error, not silently lost."""
    import litellm

    route = ModelRoute("anthropic/claude-sonnet-4-5", "anthropic/claude-sonnet-4-5", {})
    body = {"messages": _user("hi"), "temperature": 0.2, "metadata": {"user_id": "u"}, "seed": 1}
    call = wire._chat_call(litellm, body, route)
    assert call == {
        "messages": _user("hi"),
        "drop_params": False,
        "temperature": 0.2,
        "metadata": {"user_id": "u"},
        "seed": 1,
    }
    with pytest.raises(wire._BadRequest, match="only user_id"):
        wire._chat_call(litellm, {**body, "metadata": {"x": 1}}, route)


def test_only_openai_itself_is_called_through_the_responses_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import litellm

    for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(litellm, "api_base", None)

    def responses(model: str, **kwargs: Any) -> bool:
        return routes._uses_responses_api(litellm, ModelRoute(model, model, kwargs))

    assert responses("openai/gpt-5-mini")
    assert responses("openai/gpt-5-mini", api_base="https://api.openai.com/v1/")
    assert not responses("anthropic/claude-sonnet-4-5")
    assert not responses("gpt-5-mini")  # the SDK asks for the openai/ prefix
    assert not responses("openai/gpt-5-mini", api_base="http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert not responses("openai/gpt-5-mini")


@pytest.fixture
def at_openai(
    model_loop: Any, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Harness]:
    """The harness's model, served where the bridge takes OpenAI itself to be (set before
    the bridge starts: it decides at start which calls may skip LiteLLM)."""
    monkeypatch.setattr(routes, "_OPENAI_API_BASE", model_server.url)
    route = ModelRoute(MODEL, MODEL, {"api_base": model_server.url, "api_key": "sk-test-bridge"})
    bridge = _start(model_loop, route)
    yield Harness(model_loop, bridge)
    model_loop.run(bridge.close())


WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


# LiteLLM 1.108.0's Responses API imports the optional `mcp` package (found by the floors CI
# lane): there, an openai/* call at OpenAI fails and the preflight stops the session in one
# line. Known gap at our floor, listed in docs/sdk-call-routes.md.
def _responses_api_runs() -> bool:
    import importlib.metadata
    import importlib.util

    version = tuple(int(p) for p in importlib.metadata.version("litellm").split(".")[:2])
    return version >= (1, 109) or importlib.util.find_spec("mcp") is not None


needs_responses_api = pytest.mark.skipif(
    not _responses_api_runs(), reason="litellm 1.108 without mcp cannot call the Responses API"
)


@needs_responses_api
def test_responses_route_translates_the_call_and_its_answer(
    at_openai: Harness, model_server: ModelServer
) -> None:
    client = at_openai.sdk("r")
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    resp = at_openai.run(
        client.chat.completions.create(
            model="alias",
            messages=[{"role": "system", "content": "Be brief."}, *_user("What is 6 * 7?")],
            temperature=0.5,
            top_p=0.8,
            max_tokens=40,
            stop=["STOP"],
            reasoning_effort="low",
            response_format={"type": "json_schema", "json_schema": {"name": "A", "schema": schema}},
        )
    )
    path, sent = model_server.requests[-1]
    assert path == "/v1/responses" and model_server.bodies == []
    assert sent["model"] == "osmosis-test"
    assert sent["input"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 6 * 7?"},
    ]
    assert (sent["temperature"], sent["top_p"], sent["max_output_tokens"]) == (0.5, 0.8, 40)
    assert sent["reasoning"] == {"effort": "low"}
    assert sent["text"] == {"format": {"type": "json_schema", "name": "A", "schema": schema}}
    assert sent["stop"] == ["STOP"]  # no Responses name: sent as it came, in the JSON
    assert "messages" not in sent and "max_tokens" not in sent
    assert (resp.model, resp.choices[0].message.content) == ("alias", "42")
    assert resp.choices[0].finish_reason == "stop"
    expected = count_tokens("Be brief. What is 6 * 7?") + 1
    assert resp.usage.total_tokens == expected
    assert at_openai.bridge.call_usage("r") == [
        {"prompt_tokens": expected - 1, "completion_tokens": 1, "cached_tokens": 0}
    ]
    assert at_openai.bridge.close_rollout("r") == expected


@needs_responses_api
def test_responses_route_carries_tool_calls_both_ways(
    at_openai: Harness, model_server: ModelServer
) -> None:
    model_server.tool_rules = [ToolRule("weather", "get_weather", {"city": "Oslo"})]
    model_server.tool_answer = "It is {result} there."
    client = at_openai.sdk("t")
    messages: list[dict[str, Any]] = _user("What is the weather in Oslo?")
    choice = {"type": "function", "function": {"name": "get_weather"}}
    first = at_openai.run(
        client.chat.completions.create(
            model="m",
            messages=messages,
            tools=WEATHER,
            tool_choice=choice,
        )
    )
    sent = model_server.requests[-1][1]
    assert sent["tools"] == [{"type": "function", **WEATHER[0]["function"]}]
    assert sent["tool_choice"] == {"type": "function", "name": "get_weather"}
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "call_000001",
        "get_weather",
        {"city": "Oslo"},
    )
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = at_openai.run(
        client.chat.completions.create(model="m", messages=messages, tools=WEATHER)
    )
    assert model_server.requests[-1][1]["input"][1:] == [
        {
            "type": "function_call",
            "call_id": call.id,
            "name": "get_weather",
            "arguments": call.function.arguments,
        },
        {"type": "function_call_output", "call_id": call.id, "output": "sunny"},
    ]
    assert second.choices[0].message.content == "It is sunny there."
    assert at_openai.bridge.close_rollout("t") == (
        first.usage.total_tokens + second.usage.total_tokens
    )


@needs_responses_api
def test_responses_route_streams_one_chunk_and_reports_a_cut_answer(
    at_openai: Harness, model_server: ModelServer
) -> None:
    model_server.tool_rules = [ToolRule("add", "add", {"a": 1, "b": 2})]
    _, key = at_openai.bridge.open_rollout("s")
    auth = {"Authorization": f"Bearer {key}"}
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    body = {"model": "m", "messages": _user("please add"), "stream": True, "tools": tools}
    status, text = at_openai.post("/v1/rollouts/s/chat/completions", body, auth)
    data = [json.loads(e[len("data: ") :]) for e in _sse_events(text) if e.startswith("data: {")]
    assert status == 200 and len(data) == 1 and _sse_events(text)[-1] == "data: [DONE]"
    delta = data[0]["choices"][0]["delta"]
    assert (
        delta["tool_calls"][0]["index"] == 0 and delta["tool_calls"][0]["function"]["name"] == "add"
    )
    assert data[0]["choices"][0]["finish_reason"] == "tool_calls" and data[0]["usage"]
    assert "stream" not in model_server.requests[-1][1]  # the provider call is not streamed
    words = " ".join(["word"] * 30)
    body = {"model": "m", "messages": _user(words), "max_tokens": 20}
    status, text = at_openai.post("/v1/rollouts/s/chat/completions", body, auth)
    answer = json.loads(text)["choices"][0]
    assert model_server.requests[-1][1]["max_output_tokens"] == 20
    assert answer["finish_reason"] == "length"  # an "incomplete" response, as chat says it
    assert answer["message"]["content"] == " ".join(["echo:", *["word"] * 19])


def test_route_kwargs_override_what_the_rollout_sends(
    model_loop: Any, model_server: ModelServer
) -> None:
    route = ModelRoute(
        MODEL, MODEL, {"api_base": model_server.url, "api_key": "k", "temperature": 0.0}
    )
    bridge = _start(model_loop, route)
    try:
        client = Harness(model_loop, bridge).sdk("r")
        model_loop.run(
            client.chat.completions.create(model="m", messages=_user("hi"), temperature=1.5)
        )
    finally:
        model_loop.run(bridge.close())
    assert model_server.bodies[-1]["temperature"] == 0.0


def test_tokens_are_accounted_per_rollout_under_concurrency(
    harness: Harness, model_server: ModelServer
) -> None:
    # The first call waits at the model for a second (an event: 50 ms answers alone left the
    # overlap to the scheduler); the rest take 50 ms each.
    model_server.delay = 0.05
    model_server.gather, model_server.gather_on, model_server.gather_timeout = 2, "word", 600.0
    clients = {rid: harness.sdk(rid) for rid in ("a", "b", "c")}
    plan = [("a", i) for i in range(8)] + [("b", i) for i in range(5)] + [("c", 0)]

    async def call(rid: str, i: int) -> tuple[str, int]:
        words = " ".join(["word"] * (i + 1))
        resp = await clients[rid].chat.completions.create(
            model="m", messages=_user(f"{rid} {words}")
        )
        return rid, resp.usage.total_tokens

    async def all_calls() -> list[tuple[str, int]]:
        return await asyncio.gather(*(call(rid, i) for rid, i in plan))

    results = harness.run(all_calls())
    expected = {rid: sum(t for r, t in results if r == rid) for rid in clients}
    assert model_server.peak_in_flight > 1  # the calls really overlapped
    assert expected["a"] != expected["b"]
    assert {rid: harness.bridge.close_rollout(rid) for rid in clients} == expected
    assert harness.bridge.close_rollout("a") is None
    assert harness.bridge.tokens_total == sum(expected.values())
    assert harness.bridge.calls == len(plan)


def test_rollout_without_usage_reports_none(harness: Harness) -> None:
    harness.bridge.open_rollout("idle")
    assert harness.bridge.close_rollout("idle") is None


def test_bearer_and_rollout_id_are_enforced(harness: Harness, model_server: ModelServer) -> None:
    _, key = harness.bridge.open_rollout("live")
    body = {"model": "m", "messages": _user("hi")}
    path = "/v1/rollouts/live/chat/completions"
    assert harness.post(path, body)[0] == 401
    assert harness.post(path, body, {"Authorization": "Bearer wrong"})[0] == 401
    assert harness.post(path, body, {"Authorization": key})[0] == 401
    auth = {"Authorization": f"Bearer {key}"}
    status, text = harness.post("/v1/rollouts/nope/chat/completions", body, auth)
    assert status == 404 and "nope" in json.loads(text)["detail"]
    harness.bridge.open_rollout("done")
    harness.bridge.close_rollout("done")
    assert harness.post("/v1/rollouts/done/chat/completions", body, auth)[0] == 404
    assert harness.post(path, b"{not json", auth)[0] == 400
    assert harness.post(path, {"model": "m", "messages": "hi"}, auth)[0] == 400
    assert harness.post(path, [1, 2], auth)[0] == 400
    assert model_server.requests_total == 0
    assert harness.post(path, body, auth)[0] == 200


def test_tool_call_round_trip(harness: Harness, model_server: ModelServer) -> None:
    model_server.tool_rules = [ToolRule("weather", "get_weather", {"city": "Oslo"})]
    model_server.tool_answer = "It is {result} there."
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    client = harness.sdk("t")
    messages: list[dict[str, Any]] = _user("What is the weather in Oslo?")
    first = harness.run(
        client.chat.completions.create(
            model="m", messages=messages, tools=tools, tool_choice="auto"
        )
    )
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Oslo"},
    )
    assert model_server.bodies[-1]["tool_choice"] == "auto"
    assert model_server.bodies[-1]["tools"][0]["function"]["name"] == "get_weather"
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = harness.run(client.chat.completions.create(model="m", messages=messages, tools=tools))
    assert second.choices[0].message.content == "It is sunny there."
    assert model_server.bodies[-1]["messages"][-1]["tool_call_id"] == call.id
    assert harness.bridge.close_rollout("t") == (
        first.usage.total_tokens + second.usage.total_tokens
    )


def _sse_events(text: str) -> list[str]:
    return [block for block in text.split("\n\n") if block]


def test_streaming_sends_one_full_chunk_then_done(
    harness: Harness, model_server: ModelServer
) -> None:
    client = harness.sdk("s")

    async def stream() -> list[Any]:
        chunks = await client.chat.completions.create(
            model="alias", messages=_user("What is 12 + 30?"), stream=True
        )
        return [chunk async for chunk in chunks]

    chunks = harness.run(stream())
    assert len(chunks) == 1
    chunk = chunks[0]
    assert chunk.model == "alias"
    assert chunk.choices[0].delta.content == "42"
    assert chunk.choices[0].finish_reason == "stop"
    assert chunk.usage.total_tokens == count_tokens("What is 12 + 30?") + 1
    assert harness.bridge.close_rollout("s") == chunk.usage.total_tokens

    _, key = harness.bridge.open_rollout("raw")
    status, text = harness.post(
        "/v1/rollouts/raw/chat/completions",
        {"model": "m", "messages": _user("hi"), "stream": True},
        {"Authorization": f"Bearer {key}"},
    )
    events = _sse_events(text)
    assert status == 200
    assert events[0] == ": ping" and events[-1] == "data: [DONE]"
    assert len([e for e in events if e.startswith("data: {")]) == 1


def test_streaming_tool_calls_carry_an_index(harness: Harness, model_server: ModelServer) -> None:
    model_server.tool_rules = [ToolRule("add", "add", {"a": 1, "b": 2})]
    _, key = harness.bridge.open_rollout("st")
    status, text = harness.post(
        "/v1/rollouts/st/chat/completions",
        {
            "model": "m",
            "messages": _user("please add"),
            "stream": True,
            "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}],
        },
        {"Authorization": f"Bearer {key}"},
    )
    assert status == 200
    data = [json.loads(e[len("data: ") :]) for e in _sse_events(text) if e.startswith("data: {")]
    delta = data[0]["choices"][0]["delta"]
    assert delta["tool_calls"][0]["index"] == 0
    assert delta["tool_calls"][0]["function"]["name"] == "add"
    assert data[0]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(("upstream", "answered"), [(400, 400), (422, 422), (500, 502)])
def test_provider_error_keeps_its_4xx_else_502_with_one_line_detail(
    harness: Harness, model_server: ModelServer, upstream: int, answered: int
) -> None:
    """As osmosis-ai 0.3.8: a client must not retry a provider's 400 as if it were a 5xx."""
    model_server.fail_next(upstream, count=3, message="bad request\nfrom sk-test-bridge upstream")
    _, key = harness.bridge.open_rollout("e")
    status, text = harness.post(
        "/v1/rollouts/e/chat/completions",
        {"model": "m", "messages": _user("hi")},
        {"Authorization": f"Bearer {key}"},
    )
    assert status == answered
    assert json.loads(text)["error"]["type"] == (
        "invalid_request_error" if answered == 400 else "bridge_error"
    )
    detail = json.loads(text)["detail"]
    assert "bad request" in detail and "\n" not in detail
    assert "sk-test-bridge" not in detail and "[REDACTED]" in detail
    assert harness.bridge.close_rollout("e") is None
    assert (harness.bridge.calls, harness.bridge.errors) == (0, 1)


def test_streaming_error_is_an_error_event(harness: Harness, model_server: ModelServer) -> None:
    model_server.fail_next(404, message="no such model")
    _, key = harness.bridge.open_rollout("se")
    status, text = harness.post(
        "/v1/rollouts/se/chat/completions",
        {"model": "m", "messages": _user("hi"), "stream": True},
        {"Authorization": f"Bearer {key}"},
    )
    events = _sse_events(text)
    assert status == 200
    assert events[-1] == "data: [DONE]"
    error = next(e for e in events if e.startswith("event: error"))
    payload = json.loads(error.split("data: ", 1)[1])
    assert "no such model" in payload["detail"]


# ------------------------------------------------------------------ judge model header

JUDGE = "openai/judge-model"


@pytest.fixture
def judged(harness: Harness, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The harness plus a judge route: LiteLLM's `openai/` provider reaches the server via env."""
    for name, value in model_server.env().items():
        monkeypatch.setenv(name, value)
    resolved: list[str] = []

    def counting(model_path: str) -> ModelRoute:
        resolved.append(model_path)
        return resolve_route(model_path)

    monkeypatch.setattr(routes, "resolve_route", counting)
    # What a session declares (a RubricGrader's judge_model, ini osmosis_judge_models).
    harness.bridge.allow_judge_models(
        [JUDGE, "anthropic/claude-sonnet-4-5", "groq/llama-3.1-8b", "no-such-model-family"]
    )
    _, key = harness.bridge.open_rollout("j")

    def post(body: dict[str, Any], judge: str | None = JUDGE) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key}"}
        if judge is not None:
            headers[JUDGE_MODEL_HEADER] = judge
        status, text = harness.post("/v1/rollouts/j/chat/completions", body, headers)
        return status, text if body.get("stream") else json.loads(text)

    return post, resolved


def test_judge_header_routes_to_the_judge_model_and_counts_in_the_rollout(
    harness: Harness, model_server: ModelServer, judged: Any
) -> None:
    post, resolved = judged
    totals = []
    for judge in (JUDGE, None, JUDGE, MODEL, "  "):
        # The body's model never routes: only the header does.
        status, payload = post({"model": JUDGE, "messages": _user("What is 2 + 3?")}, judge)
        assert status == 200, payload
        assert payload["model"] == JUDGE and payload["choices"][0]["message"]["content"] == "5"
        totals.append(payload["usage"]["total_tokens"])
    status, text = post({"model": "x", "messages": _user("What is 1 + 1?"), "stream": True})
    assert status == 200 and '"content": "2"' in text
    assert [b["model"] for b in model_server.bodies] == [
        "judge-model", "osmosis-test", "judge-model", "osmosis-test", "osmosis-test",
        "judge-model",
    ]
    # The judge's route is its own (env endpoint and key), not the run's route kwargs.
    assert resolved == [JUDGE]
    usage = json.loads(text.split("data: ", 1)[1].split("\n", 1)[0])["usage"]["total_tokens"]
    assert harness.bridge.close_rollout("j") == sum(totals) + usage
    assert harness.bridge.calls == 6


def test_judge_rate_limits_back_off_only_the_judge_model(
    harness: Harness, model_server: ModelServer, judged: Any
) -> None:
    post, _ = judged
    # The provider client does not retry by itself: the bridge sees (and counts) every 429.
    model_server.fail_next(429, count=3, retry_after=0)
    assert post({"messages": _user("What is 2 + 2?")})[0] == 200
    assert harness.bridge.pop_rate_limited("j") == 3  # still the row's rate limits
    assert harness.bridge.backoff.hits == 0  # the run's model was not slowed down
    model_server.fail_next(429, count=3, retry_after=0)
    assert post({"messages": _user("What is 2 + 2?")}, None)[0] == 200
    assert harness.bridge.backoff.hits >= 1
    assert model_server.requests_total == 8


@pytest.mark.parametrize(
    ("judge", "unset", "kind", "message"),
    [
        ("anthropic/claude-sonnet-4-5", "ANTHROPIC_API_KEY", "judge_missing_api_key",
         "missing API key: set ANTHROPIC_API_KEY for judge model 'anthropic/claude-sonnet-4-5'"),
        ("groq/llama-3.1-8b", "GROQ_API_KEY", "judge_missing_api_key",
         "missing API key: set GROQ_API_KEY for judge model 'groq/llama-3.1-8b'"),
        ("no-such-model-family", None, "judge_model_not_found",
         "unknown judge model 'no-such-model-family': not a LiteLLM model id"),
    ],
)
def test_a_judge_that_cannot_be_called_is_a_one_line_400_resolved_once(
    harness: Harness,
    model_server: ModelServer,
    judged: Any,
    monkeypatch: pytest.MonkeyPatch,
    judge: str,
    unset: str | None,
    kind: str,
    message: str,
) -> None:
    post, resolved = judged
    if unset:
        monkeypatch.delenv(unset, raising=False)
    for _ in range(3):
        status, payload = post({"model": judge, "messages": _user("hi")}, judge)
        assert status == 400
        assert payload["error"]["type"] == kind
        assert payload["detail"].startswith(message) and "\n" not in payload["detail"]
    assert resolved == [judge]
    assert model_server.requests_total == 0
    # The run's model still answers the same rollout.
    assert post({"model": judge, "messages": _user("hi")}, None)[0] == 200


@pytest.mark.parametrize(
    ("status", "kind", "message"),
    [
        (404, "judge_model_not_found", "judge model 'openai/judge-model' not found by its provider"),
        (400, "judge_provider_error", "provider error from judge model 'openai/judge-model': "),
    ],
)
def test_a_judge_provider_error_names_the_judge(
    harness: Harness, model_server: ModelServer, judged: Any, status: int, kind: str, message: str
) -> None:
    post, _ = judged
    model_server.fail_next(status, message="upstream says no\nsk-test-model-server")
    answered, payload = post({"messages": _user("hi")})
    assert answered == 502 and payload["error"]["type"] == kind
    detail = payload["detail"]
    assert detail.startswith(message) and "upstream says no" in detail and "\n" not in detail
    assert "sk-test-model-server" not in detail
    model_server.fail_next(status, message="upstream says no")
    answered, text = post({"messages": _user("hi"), "stream": True})
    error = next(e for e in _sse_events(text) if e.startswith("event: error"))
    assert json.loads(error.split("data: ", 1)[1])["error"]["type"] == kind
    model_server.fail_next(status, message="upstream says no")
    answered, payload = post({"messages": _user("hi")}, None)  # the run's model: its status
    assert answered == status and payload["error"]["code"] == status
    assert "judge" not in payload["detail"]


# ------------------------------------------------------------------ preflight


def _preflight(loop: Any, route: ModelRoute) -> Bridge:
    bridge = Bridge(route)
    loop.run(bridge.preflight())
    return bridge


def test_preflight_passes_and_is_not_counted(model_loop: Any, model_server: ModelServer) -> None:
    bridge = _preflight(
        model_loop, ModelRoute(MODEL, MODEL, {"api_base": model_server.url, "api_key": "k"})
    )
    assert model_server.requests_total == 1
    assert model_server.bodies[0]["max_tokens"] == 256
    assert (bridge.calls, bridge.tokens_total, bridge.preflight_warning) == (0, 0, None)


@pytest.mark.parametrize("via", ["route", "env"])
def test_preflight_unreachable_endpoint(
    model_loop: Any, monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    base = f"http://127.0.0.1:{_closed_port()}/v1"
    if via == "route":
        route = ModelRoute(MODEL, MODEL, {"api_base": base, "api_key": "k"})
    else:  # the usual way: LiteLLM resolves the endpoint from the environment
        monkeypatch.setenv("OPENAI_BASE_URL", base)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        route = resolve_route(MODEL)
    with pytest.raises(ModelPreflightError) as info:
        _preflight(model_loop, route)
    message = str(info.value)
    where = base if via == "route" else base[len("http://") : -len("/v1")]
    assert f"model preflight failed for {MODEL!r}: cannot reach {where}: " in message
    assert "\n" not in message


def test_preflight_unknown_provider(model_loop: Any, model_server: ModelServer) -> None:
    with pytest.raises(ModelPreflightError) as info:
        _preflight(model_loop, resolve_route("nosuchprovider/some-model"))
    message = str(info.value)
    assert "'nosuchprovider/some-model'" in message and "provider/model" in message
    assert "\n" not in message
    assert model_server.requests_total == 0


@pytest.mark.parametrize(
    ("model", "env_var", "base_var"),
    [
        ("openai/gpt-5-mini", "OPENAI_API_KEY", "OPENAI_BASE_URL"),
        ("anthropic/claude-sonnet-4-5", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
    ],
)
def test_preflight_missing_key_names_the_env_var(
    model_loop: Any,
    model_server: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    env_var: str,
    base_var: str,
) -> None:
    for name in list(os.environ):
        if name.startswith(env_var.split("_")[0] + "_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv(base_var, model_server.url)  # if a call went out, it stays local
    with pytest.raises(ModelPreflightError) as info:
        _preflight(model_loop, resolve_route(model))
    message = str(info.value)
    assert message.startswith(f"model preflight failed for {model!r}: no API key, set {env_var}")
    assert "\n" not in message
    assert model_server.requests_total == 0


def test_preflight_rejected_key(
    model_loop: Any, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in model_server.env().items():
        monkeypatch.setenv(name, value)
    model_server.fail_next(401, message="Incorrect API key provided")
    with pytest.raises(ModelPreflightError) as info:
        _preflight(model_loop, resolve_route("openai/gpt-5-mini"))
    assert "AuthenticationError" in str(info.value)
    assert "Incorrect API key provided" in str(info.value)


def test_preflight_ignores_rate_limits(model_loop: Any, model_server: ModelServer) -> None:
    model_server.fail_next(429, count=10, retry_after=0)
    bridge = _preflight(
        model_loop, ModelRoute(MODEL, MODEL, {"api_base": model_server.url, "api_key": "k"})
    )
    assert model_server.requests_total >= 1
    assert bridge.preflight_warning is None


def test_preflight_server_error_is_only_a_warning(
    model_loop: Any, model_server: ModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    model_server.fail_next(500, count=10, message="upstream overloaded")
    bridge = _preflight(
        model_loop, ModelRoute(MODEL, MODEL, {"api_base": model_server.url, "api_key": "k"})
    )
    assert bridge.preflight_warning is not None
    assert "upstream overloaded" in bridge.preflight_warning
    assert "upstream overloaded" in caplog.text


# ------------------------------------------------------------------ network guard


def test_guard_blocks_non_loopback_connect_before_it_happens(network_guard: Any) -> None:
    with network_guard.expected() as caught, socket.socket() as sock:
        sock.setblocking(False)
        with pytest.raises(network_guard.NetworkGuardError):
            sock.connect(("192.0.2.1", 9))
        # An attempted connect would have bound an ephemeral local port.
        assert sock.getsockname() == ("0.0.0.0", 0)
    assert caught == [
        "network guard: socket.connect to 192.0.2.1:9 blocked (tests may only use loopback)"
    ]


def test_guard_blocks_dns_lookups_and_allows_loopback(
    network_guard: Any, model_server: ModelServer
) -> None:
    with network_guard.expected() as caught:
        with pytest.raises(network_guard.NetworkGuardError):
            socket.getaddrinfo("example.com", 443)
        with pytest.raises(network_guard.NetworkGuardError):
            socket.create_connection(("2001:db8::1", 80), timeout=1)
    assert len(caught) == 2 and "example.com:443" in caught[0]
    socket.getaddrinfo("localhost", 80)
    with socket.create_connection(("127.0.0.1", model_server.port), timeout=5):
        pass


def test_guard_covers_subprocesses(network_guard: Any) -> None:
    code = "import socket; socket.create_connection(('192.0.2.1', 9), timeout=1)"
    with network_guard.expected() as caught:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert "NetworkGuardError" in out.stderr
    assert len(caught) == 1 and "192.0.2.1:9" in caught[0]


def test_guard_fails_a_test_that_swallows_the_error(
    pytester: pytest.Pytester, network_guard: Any
) -> None:
    tests_dir = Path(__file__).parent
    shutil.copy(tests_dir / "conftest.py", pytester.path / "conftest.py")
    shutil.copy(tests_dir / "model_server.py", pytester.path / "model_server.py")
    shutil.copytree(tests_dir / "netguard", pytester.path / "netguard")
    pytester.makepyfile(
        test_swallow="""
        import socket

        def test_swallows():
            try:
                socket.create_connection(("192.0.2.1", 9), timeout=1)
            except OSError:
                pass

        def test_clean():
            pass
        """
    )
    with network_guard.expected() as caught:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*network guard: socket.getaddrinfo to 192.0.2.1:9 blocked*"])
    assert caught  # the child's guard also reported to this process


# ------------------------------------------------------------------ the model server itself


def _post_raw(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], str]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def test_model_server_rules_errors_and_counters(model_server: ModelServer) -> None:
    ask = {"model": "m", "messages": _user("What is 7 - 10?")}
    status, _, text = _post_raw(model_server.url, ask)
    assert status == 200 and json.loads(text)["choices"][0]["message"]["content"] == "-3"
    model_server.replies = {"7 - 10": "scripted"}
    assert json.loads(_post_raw(model_server.url, ask)[2])["choices"][0]["message"]["content"] == (
        "scripted"
    )
    model_server.fail_next(429, count=2, retry_after=1.5)
    for _ in range(2):
        status, headers, text = _post_raw(model_server.url, ask)
        assert status == 429 and headers["Retry-After"] == "1.5"
        assert json.loads(text)["error"]["type"] == "rate_limit_error"
    assert _post_raw(model_server.url, ask)[0] == 200
    assert model_server.requests_total == 5 and len(model_server.bodies) == 5


def test_model_server_streams_usage_in_the_last_chunk(
    model_loop: Any, model_server: ModelServer
) -> None:
    import litellm

    async def stream() -> tuple[str, Any]:
        chunks = await litellm.acompletion(
            model=MODEL,
            messages=_user("say three words"),
            api_base=model_server.url,
            api_key="k",
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            usage = getattr(chunk, "usage", None) or usage
        return text, usage

    text, usage = model_loop.run(stream())
    assert text == "echo: say three words"
    assert (usage.prompt_tokens, usage.completion_tokens) == (3, 4)


def test_model_server_runs_standalone(tmp_path: Path) -> None:
    config = tmp_path / "script.json"
    config.write_text(json.dumps({"replies": {"ping": "pong"}}))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("model_server.py")),
            "--port",
            "0",
            "--delay",
            "0.01",
            "--config",
            str(config),
            "--reply",
            "hello=world",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        for question, answer in (("ping?", "pong"), ("hello", "world")):
            _, _, text = _post_raw(url, {"messages": _user(question)})
            assert json.loads(text)["choices"][0]["message"]["content"] == answer
    finally:
        proc.terminate()
        proc.wait(timeout=10)
