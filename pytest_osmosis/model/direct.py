"""Chat calls to an OpenAI-compatible endpoint without LiteLLM, where the bytes are the same.

Importing LiteLLM costs 2-5 s, and each call through it 4-5 ms of CPU on the loop every
row shares. The preflight only needs to know whether a model answers; ``osmosis/embedded``
and a local server (vLLM, llama.cpp, Ollama, a test stub) speak OpenAI's API over plain
HTTP: none should pay for LiteLLM. A request goes out here only where it is byte-for-byte the
one LiteLLM's ``openai/`` provider would send (same URL, bearer, JSON body; the test
``test_fast_start.py::test_a_direct_request_is_the_one_litellm_sends`` captures both at
a stub and compares them): a route LiteLLM reaches at an OpenAI-compatible endpoint with
nothing but a base, a key and a temperature, and a body whose messages LiteLLM forwards
unchanged. Rows' calls go here only over plain HTTP without a proxy (`rows_go_direct`); the
answer gets LiteLLM's reasoning split (`_split_reasoning`), and the bridge retries and
paces both paths alike (ratelimit.py). Everything else goes through LiteLLM.

An answer comes back as the parsed JSON (the wire helpers read dicts and LiteLLM objects
alike); a failure raises :class:`DirectError` named as LiteLLM names the same status
(``AuthenticationError``, ``NotFoundError``, ``RateLimitError``...), so the bridge and its
preflight classify both the same way.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pytest_osmosis.model.routes import EMBEDDED_MODEL_PATH, ModelRoute, is_openai_api

__all__ = [
    "PLAIN_FIELDS",
    "DirectClient",
    "DirectError",
    "direct_base",
    "is_plain",
    "litellm_configured",
    "missing_keys",
    "request_body",
    "rows_go_direct",
]

OPENAI_PREFIX = "openai/"
_ROUTE_KEYS = frozenset({"api_base", "api_key", "temperature"})
"""Route settings the direct request reproduces; a route with any other goes via LiteLLM."""
_LITELLM_GLOBALS = (
    "api_base", "api_key", "openai_key", "organization", "headers",
    "callbacks", "success_callback", "failure_callback", "input_callback",
)  # fmt: skip
"""LiteLLM settings a rollout may set in code (where a call goes, who is told of it); any
of them set means LiteLLM makes the call."""
_HEADER_VARIABLES = ("OPENAI_ORGANIZATION", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID")
"""Variables that make LiteLLM or its OpenAI client add a header (organization, project)."""
_PROXY_VARIABLES = {
    "http": ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"),
    "https": ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"),
}
"""Variables that send LiteLLM's (httpx's) requests through a proxy, by the URL's scheme."""
_THINK = re.compile(
    r"<(?:think|thinking|budget:thinking)>(.*?)</(?:think|thinking|budget:thinking)>(.*)", re.DOTALL
)
"""Reasoning written into the content, as LiteLLM splits it off (its
``parse_content_for_reasoning``)."""
_ENVELOPE = frozenset({"model", "messages", "stream", "stream_options", "n"})
PLAIN_FIELDS = frozenset(
    {
        "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "tools",
        "tool_choice", "parallel_tool_calls", "response_format", "seed", "presence_penalty",
        "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user", "metadata",
        "reasoning_effort",
    }
)  # fmt: skip
"""OpenAI chat parameters a body may carry on the direct path: none is a LiteLLM setting
(the bridge would refuse those), and LiteLLM forwards each as JSON, unchanged."""
_PLAIN_ROLES = frozenset({"system", "user", "assistant", "tool"})
_PLAIN_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
_TIMEOUT_S = 600.0  # LiteLLM's default request timeout


def litellm_configured() -> bool:
    """Whether code in this process set LiteLLM globals that change where a call goes."""
    litellm = sys.modules.get("litellm")
    return litellm is not None and any(getattr(litellm, n, None) for n in _LITELLM_GLOBALS)


def direct_base(route: ModelRoute) -> str | None:
    """The endpoint base a direct request for ``route`` goes to; None: only LiteLLM may call it.

    The base is resolved as LiteLLM resolves it (the route's ``api_base``, then
    ``OPENAI_BASE_URL``, then ``OPENAI_API_BASE``); OpenAI itself is no candidate (its
    calls use the Responses API), nor is an organization header LiteLLM would add, nor a
    base LiteLLM's client would reach through a proxy variable.
    """
    if not route.litellm_model.startswith(OPENAI_PREFIX) or set(route.kwargs) - _ROUTE_KEYS:
        return None
    if litellm_configured() or any(os.environ.get(name) for name in _HEADER_VARIABLES):
        return None
    base = route.kwargs.get("api_base")
    if not isinstance(base, str) or not base:
        base = os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE")
    if not base or is_openai_api(base):
        return None
    proxies = _PROXY_VARIABLES.get(urlsplit(base).scheme, ())
    if route.model_path != EMBEDDED_MODEL_PATH and any(os.environ.get(n) for n in proxies):
        return None  # LiteLLM's client would go through the proxy (never to our own server)
    return base


def rows_go_direct(route: ModelRoute) -> bool:
    """Whether rows' calls on ``route`` skip LiteLLM (each still only with a plain body).

    ``osmosis/embedded``, and any endpoint `direct_base` allows over plain HTTP: there the
    request LiteLLM's client makes is the bytes on the wire. Over HTTPS, LiteLLM's
    certificate store (its own settings and variables) is not ours to reproduce, so rows
    there go through LiteLLM; the one-request preflight may still go direct.
    """
    base = direct_base(route)
    if base is None:
        return False
    return route.model_path == EMBEDDED_MODEL_PATH or urlsplit(base).scheme == "http"


def _api_key(route: ModelRoute) -> str | None:
    key = route.kwargs.get("api_key")
    if isinstance(key, str) and key:
        return key
    return os.environ.get("OPENAI_API_KEY") or None


def missing_keys(route: ModelRoute) -> list[str]:
    """The variable a direct route lacks its key in (LiteLLM's ``openai/`` reads this one)."""
    return [] if _api_key(route) else ["OPENAI_API_KEY"]


def _plain_content(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(part, dict)
        and set(part) == {"type", "text"}
        and part["type"] == "text"
        and isinstance(part["text"], str)
        for part in content
    )


def is_plain(body: Mapping[str, Any]) -> bool:
    """Whether LiteLLM would send ``body`` unchanged: plain messages, plain OpenAI fields.

    Anything LiteLLM rewrites (developer roles, cache-control marks, images, files, tool
    results with parts) or interprets (its own settings, ``extra_body``) is not plain.
    """
    if set(body) - _ENVELOPE - PLAIN_FIELDS or body.get("n") not in (None, 1):
        return False
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    for message in messages:
        if not isinstance(message, dict) or set(message) - _PLAIN_MESSAGE_KEYS:
            return False
        if message.get("role") not in _PLAIN_ROLES or not _plain_content(message.get("content")):
            return False
        if message.get("role") == "tool" and not isinstance(message.get("content"), str):
            return False
        if _holds_none(message.get("tool_calls")):
            return False
    return True


def _holds_none(value: Any) -> bool:
    if value is None:
        return False
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def request_body(body: Mapping[str, Any], route: ModelRoute) -> bytes:
    """The JSON LiteLLM's ``openai/`` provider sends for a plain ``body`` on ``route``.

    Its order: the model (provider prefix dropped), the messages (a key whose value is
    null left out, as LiteLLM leaves it out), the route's temperature, then the body's
    fields as the rollout wrote them (the route's own settings win); the OpenAI SDK's
    compact UTF-8 encoding.
    """
    messages = [{k: v for k, v in m.items() if v is not None} for m in body["messages"]]
    data: dict[str, Any] = {
        "model": route.litellm_model[len(OPENAI_PREFIX) :],
        "messages": messages,
    }
    if "temperature" in route.kwargs:
        data["temperature"] = route.kwargs["temperature"]
    for key, value in body.items():
        if key not in _ENVELOPE and key not in route.kwargs:
            data[key] = value
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class DirectError(Exception):
    """A failed direct call; ``type(exc).__name__`` is LiteLLM's name for the same failure."""

    def __init__(self, message: str, status_code: int | None = None, headers: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.headers = headers


class AuthenticationError(DirectError):
    pass


class PermissionDeniedError(DirectError):
    pass


class NotFoundError(DirectError):
    pass


class BadRequestError(DirectError):
    pass


class UnprocessableEntityError(DirectError):
    pass


class RateLimitError(DirectError):
    pass


class InternalServerError(DirectError):
    pass


class APIError(DirectError):
    pass


class APIConnectionError(DirectError):
    pass


class Timeout(DirectError):
    pass


_BY_STATUS: dict[int, type[DirectError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def _error_text(raw: bytes) -> str:
    """The provider's own message from an OpenAI-style error body, else the body."""
    text = raw.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    error = parsed.get("error") if isinstance(parsed, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str):
        return message
    if isinstance(error, str):
        return error
    return text


def _split_reasoning(message: dict[str, Any]) -> None:
    """The message's reasoning where LiteLLM's answer puts it: ``reasoning_content``.

    A provider's ``reasoning_content`` stays, its ``reasoning`` is renamed, and reasoning
    written into the content in think tags is split off it (``extract_reasoning_content``
    in LiteLLM 1.108 to 1.110, the versions the byte-for-byte test runs on).
    """
    if "reasoning_content" in message:
        return
    if "reasoning" in message:
        message["reasoning_content"] = message.pop("reasoning")
        return
    content = message.get("content")
    match = _THINK.match(content) if isinstance(content, str) and content else None
    if match is not None:
        message["reasoning_content"], message["content"] = match.group(1), match.group(2)


class DirectClient:
    """One connection pool per route, on the loop that uses it (the bridge's)."""

    def __init__(self, route: ModelRoute, base: str) -> None:
        self.route = route
        self.url = base.rstrip("/") + "/chat/completions"
        self._session: Any = None

    async def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST a plain chat body; the parsed chat.completion, or a :class:`DirectError`."""
        import aiohttp

        key = _api_key(self.route)
        if key is None:
            raise AuthenticationError(
                "The api_key client option must be set either by passing api_key to the "
                "client or by setting the OPENAI_API_KEY environment variable"
            )
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S), auto_decompress=True
            )
        headers = {
            "Authorization": f"Bearer {key}",
            "Accept": "application/json",
            "Content-Type": "application/json",
        }
        data = request_body(body, self.route)
        try:
            async with self._session.post(self.url, data=data, headers=headers) as response:
                raw = await response.read()
                status = response.status
                if status >= 400:
                    fallback = InternalServerError if status >= 500 else APIError
                    kind = _BY_STATUS.get(status, fallback)
                    raise kind(
                        f"{status} from {self.url}: {_error_text(raw)}",
                        status_code=status,
                        headers=response.headers,
                    )
        except asyncio.TimeoutError as exc:
            raise Timeout(f"Timeout: no answer from {self.url} within {_TIMEOUT_S:g} s") from exc
        except aiohttp.ClientError as exc:
            # LiteLLM's name for a refused or dropped connection; the cause stays chained
            # (the preflight names the endpoint and the root from it).
            raise APIConnectionError(f"APIConnectionError: {self.url}: {exc}") from exc
        try:
            answer = json.loads(raw)
        except ValueError:
            raise APIError(f"APIError: {self.url} answered with no JSON", status_code=502) from None
        if not isinstance(answer, dict):
            raise APIError(f"APIError: {self.url} answered with no JSON object", status_code=502)
        for choice in answer.get("choices") or ():
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict):
                _split_reasoning(message)
        return answer

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
