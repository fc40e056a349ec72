"""Loopback OpenAI-compatible endpoint that forwards rollout calls to LiteLLM in-process.

Rollouts only ever see ``http://127.0.0.1:<port>/v1/rollouts/<rollout_id>`` and a
per-session bearer; provider keys stay in this process (contract §4.7). Routing by
rollout id in the URL lets the bridge sum tokens per work item without trusting the
client. A call carrying ``X-Osmosis-Judge-Model`` (a `RubricGrader`'s judge) goes to that
model instead of the run's, still counted in the row. LiteLLM is imported inside the
functions that call it: importing it costs ~3 s and plain pytest runs must not pay that.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import gc
import hmac
import json
import logging
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_osmosis.errors import ModelPreflightError
from pytest_osmosis.model.ratelimit import Backoff, is_rate_limit, retry_after

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "EMBEDDED_MODEL_PATH",
    "JUDGE_MISSING_API_KEY",
    "JUDGE_MODEL_HEADER",
    "JUDGE_MODEL_NOT_ALLOWED",
    "JUDGE_MODEL_NOT_FOUND",
    "JUDGE_PROVIDER_ERROR",
    "MAX_BODY_BYTES",
    "Bridge",
    "ModelRoute",
    "resolve_route",
]

logger = logging.getLogger(__name__)

EMBEDDED_MODEL_PATH = "osmosis/embedded"
JUDGE_MODEL_HEADER = "X-Osmosis-Judge-Model"
"""A request header naming the model (LiteLLM id or ``osmosis/embedded``) to answer it."""
# ``error.type`` of a failed judge call, so the grader can raise the matching JudgeError.
JUDGE_MISSING_API_KEY = "judge_missing_api_key"
JUDGE_MODEL_NOT_FOUND = "judge_model_not_found"
JUDGE_MODEL_NOT_ALLOWED = "judge_model_not_allowed"
JUDGE_PROVIDER_ERROR = "judge_provider_error"

# A judge call (`RubricGrader`) is the rubric command's call made through the bridge: only
# these fields reach the judge, with ``drop_params`` as the rubric command sets it.
_JUDGE_FORWARDED = (
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "tools",
    "tool_choice",
    "max_completion_tokens",
    "stop",
    "response_format",
    "parallel_tool_calls",
    "reasoning_effort",
)

# A rollout's call is forwarded as osmosis-ai 0.3.8's bridge forwards it (its
# ``request_policy``): every inference field of the body, ``extra_body`` merged in; these
# belong to the bridge's envelope and are not forwarded...
_ENVELOPE = frozenset({"model", "messages", "stream", "stream_options", "n"})
# ...and a body naming one of these (or LiteLLM's own call settings) would change the
# model, the credentials, the endpoint or the accounting: refused, never run or dropped.
_CONTROL_NAMES = frozenset(
    {
        "base_url", "extra_headers", "deployment_id", "drop_params", "additional_drop_params",
        "callbacks", "success_callback", "failure_callback", "ssl_verify", "mock_delay",
        "mock_tool_calls", "initial_prompt_value", "original_function", "engine", "config",
        "user_api_key_end_user_id", "wx_credentials", "apikey", "url", "custom_endpoint",
        "deployment_url", "zen_api_key", "endpoint_url", "default_headers", "api_type",
        "model_id", "account_id", "predibase_tenant_id", "project_id", "space_id", "region",
        "workspace_id", "anthropic-workspace-id", "anthropic_workspace_id",
        "use_psc_endpoint_format", "method", "user_config", "user_agent",
        "databricks_user_agent", "braintrust_api_key", "braintrust_host",
        "braintrust_project", "lunary_public_key", "posthog_host", "slack_webhook_url",
        "models", "preset", "usage", "contents", "systemInstruction", "system_instruction",
        "system", "prompt", "input", "inputText",
    }
)  # fmt: skip
_CONTROL_PREFIXES = (
    "_", "litellm_", "aws_", "azure_", "vertex_", "watsonx_", "sagemaker_", "oci_", "wx_", "s3_",
)  # fmt: skip
_OPENAI_API_BASE = "https://api.openai.com/v1"
"""Where an ``openai/*`` model is served by OpenAI itself: its calls use the Responses API."""
_REASONING_FIELDS = ("reasoning_content", "thinking_blocks", "reasoning_details")

# Contract §5.5: these LiteLLM exceptions mean the configuration is wrong, not flaky.
_PREFLIGHT_FATAL = frozenset(
    {
        "AuthenticationError",
        "BudgetExceededError",
        "NotFoundError",
        "UnsupportedParamsError",
        "APIConnectionError",
        "BadRequestError",
        "PermissionDeniedError",
        "UnprocessableEntityError",
    }
)
# LiteLLM reports a refused connection or a missing OpenAI key as an
# InternalServerError; the cause chain tells them apart from a real provider 500.
_CONNECT_ERRORS = frozenset(
    {"APIConnectionError", "ConnectError", "ClientConnectorError", "ConnectTimeout"}
)
_CREDENTIAL_HINT = re.compile(r"api[ _-]?key|credential", re.IGNORECASE)
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
_KEY_NAME = re.compile(r"KEY|TOKEN|CREDENTIAL", re.IGNORECASE)
_SSE_HEARTBEAT_S = 15.0
MAX_BODY_BYTES = 32 * 1024 * 1024
"""The largest request body the bridge reads (413 above it): a chat call with images fits."""
_MAX_JSON_DEPTH = 200
IDLE_TIMEOUT_S = 5.0
"""A connection that has sent no complete request headers this long is closed (also between
requests): an idle local client cannot hold the bridge's file descriptors."""
BODY_TIMEOUT_S = 60.0
"""A body not received within this long is answered 408 (a slow client, not a slow model)."""
"""Deeper request JSON is refused (400): copying and forwarding it would exhaust the stack."""
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(frozen=True)
class ModelRoute:
    """How LiteLLM reaches the configured model."""

    model_path: str
    """What the user configured, e.g. ``openai/gpt-5-mini`` or ``osmosis/embedded``."""
    litellm_model: str
    """What is passed as ``model=`` to LiteLLM."""
    kwargs: dict[str, object] = field(default_factory=dict, hash=False)
    """Extra LiteLLM kwargs; they win over what a rollout sends (e.g. temperature 0)."""


@dataclass
class _Target:
    """A model the bridge forwards to, with its own shared 429 back-off."""

    route: ModelRoute
    backoff: Backoff
    judge: bool = False
    """Named by a request's judge header: its errors name the judge model."""


class _JudgeUnavailable(Exception):
    """The judge model named in a request cannot be called; one line, and a kind for clients."""

    def __init__(self, kind: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


def resolve_route(model_path: str) -> ModelRoute:
    """Map the configured model to a LiteLLM call; ``osmosis/embedded`` starts the local model."""
    if model_path == EMBEDDED_MODEL_PATH:
        from pytest_osmosis.model.embedded import embedded_route

        return embedded_route()
    return ModelRoute(model_path=model_path, litellm_model=model_path, kwargs={})


def _model_ids(models: Iterable[str]) -> set[str]:
    """Model ids as a judge header names them (`Bridge._target` strips the header too)."""
    return {model.strip() for model in models if model.strip()}


def _route_secrets(route: ModelRoute) -> tuple[str, ...]:
    return tuple(v for k, v in route.kwargs.items() if isinstance(v, str) and "key" in k.lower())


def _litellm() -> Any:
    import litellm

    # Stops LiteLLM printing "Give Feedback / Get Help" banners on every error.
    litellm.suppress_debug_info = True
    return litellm


_LITELLM_READY = threading.Event()


def import_litellm() -> None:
    """Import LiteLLM with the cyclic GC paused, then freeze what it made.

    Its ~3 s import builds a heap of long-lived objects that the collector would walk
    again and again while it grows, after it, and at exit (this halves the import).
    A LiteLLM that cannot be imported (e.g. a rollout's install replaced it) raises
    :class:`ModelPreflightError` with one line: no model call can work in this session.
    """
    if "litellm" not in sys.modules:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            import litellm  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - ImportError, or an incompatible dependency
            sys.modules.pop("litellm", None)
            raise ModelPreflightError(
                f"LiteLLM cannot be imported ({type(exc).__name__}: {' '.join(str(exc).split())})"
            ) from None
        finally:
            gc.freeze()
            if was_enabled:
                gc.enable()
    _LITELLM_READY.set()


async def _litellm_imported() -> None:
    """Import LiteLLM off the loop thread if nothing has yet (sessions import it up front)."""
    if not _LITELLM_READY.is_set():
        await asyncio.to_thread(import_litellm)


def _one_line(exc: BaseException, secret_values: tuple[str, ...] = ()) -> str:
    """A provider error as one short line, with anything that looks like a secret removed."""
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    text = text.split("Traceback (most recent call last)", 1)[0]
    text = " ".join(text.split())
    if text.startswith("litellm."):
        text = text[len("litellm.") :]
    values = {
        value for name, value in os.environ.items() if _SECRET_NAME.search(name) and len(value) >= 8
    }
    values.update(v for v in secret_values if v and len(v) >= 4)
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, "[REDACTED]")
    return text[:500]


def _chain(exc: BaseException) -> list[BaseException]:
    links: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(links) < 20 and all(link is not seen for seen in links):
        links.append(link)
        link = link.__cause__ or link.__context__
    return links


def _endpoint_of(chain: list[BaseException]) -> str:
    """host:port of a failed connect (aiohttp's error carries them), for the message."""
    for link in chain:
        host, port = getattr(link, "host", None), getattr(link, "port", None)
        if isinstance(host, str) and host:
            return f"{host}:{port}" if port else host
    return "the provider endpoint"


def _field(obj: Any, name: str, default: Any = None) -> Any:
    """An attribute of a LiteLLM object or a key of a converted (dict) response."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _plain(value: Any) -> Any:
    """JSON data from LiteLLM's pydantic objects (None fields left out), as the SDK sends it."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump(exclude_none=True))
    if hasattr(value, "__dict__"):
        return {k: _plain(v) for k, v in vars(value).items() if not k.startswith("_")}
    return value


def _message_of(choice: Any) -> Any:
    message = _field(choice, "message")
    return message if message is not None else _field(choice, "delta", {})


def _reasoning(choice: Any) -> dict[str, Any]:
    """Reasoning a provider returned (Anthropic thinking blocks, ...), to hand back to it."""
    message = _message_of(choice)
    provider_fields = _field(message, "provider_specific_fields")
    found: dict[str, Any] = {}
    for name in _REASONING_FIELDS:
        value = _field(message, name)
        if value is None:
            value = _field(provider_fields, name)
        if value is not None:
            found[name] = _plain(value)
    return found


def _usage(response: Any) -> dict[str, int] | None:
    usage = _field(response, "usage")
    if usage is None:
        return None
    prompt = _field(usage, "prompt_tokens")
    if prompt is None:
        prompt = _field(usage, "input_tokens", 0)
    completion = _field(usage, "completion_tokens")
    if completion is None:
        completion = _field(usage, "output_tokens", 0)
    total = _field(usage, "total_tokens")
    if total is None:
        total = int(prompt or 0) + int(completion or 0)
    return {
        "prompt_tokens": int(prompt or 0),
        "completion_tokens": int(completion or 0),
        "total_tokens": int(total or 0),
    }


def _call_metrics(response: Any, usage: dict[str, int] | None) -> dict[str, int]:
    """One call's entry for the trajectory, named as the SDK's ``LlmCallMetrics``."""
    if usage is None:
        return {}
    entry = {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
    }
    details = _field(_field(response, "usage"), "prompt_tokens_details")
    cached = _field(details, "cached_tokens")
    if isinstance(cached, int) and not isinstance(cached, bool):
        entry["cached_tokens"] = cached
    return entry


def _payload(
    response: Any, model: str, usage: dict[str, int] | None, *, stream: bool
) -> dict[str, Any]:
    """OpenAI chat.completion (or its single-chunk stream form), as osmosis-ai 0.3.8 writes it.

    Content is always a string; reasoning fields and a refusal travel with the message;
    a streamed delta carries no role, and its tool calls are indexed by position.
    """
    choices: list[dict[str, Any]] = []
    for index, choice in enumerate(_field(response, "choices", None) or []):
        message = _message_of(choice)
        content = str(_field(message, "content", "") or "")
        tool_calls = _field(message, "tool_calls")
        refusal = _field(message, "refusal")
        body: dict[str, Any] = {} if stream else {"role": "assistant"}
        body.update({"content": content, **_reasoning(choice)})
        if tool_calls:
            plain = _plain(tool_calls)
            if stream:
                plain = [
                    {**call, "index": position} if isinstance(call, dict) else call
                    for position, call in enumerate(plain if isinstance(plain, list) else [plain])
                ]
            body["tool_calls"] = plain
        if refusal is not None:
            body["refusal"] = str(refusal)
        choices.append(
            {
                "index": int(_field(choice, "index", index) or index),
                "delta" if stream else "message": body,
                "finish_reason": _field(choice, "finish_reason", "stop"),
            }
        )
    payload: dict[str, Any] = {
        "id": _field(response, "id", None) or "chatcmpl-osmosis",
        "object": "chat.completion.chunk" if stream else "chat.completion",
        "created": int(_field(response, "created", None) or time.time()),
        "model": model,
        "choices": choices,
    }
    if usage:
        payload["usage"] = usage
    return payload


class _BadRequest(Exception):
    """The rollout sent a body the bridge cannot forward (answered 400)."""


class Bridge:
    """One loopback listener per session; rollouts are told apart by their URL.

    `start`, `preflight` and `close` run on the caller's event loop; `open_rollout`
    and `close_rollout` may be called from any thread.
    """

    def __init__(self, route: ModelRoute, judge_models: Iterable[str] = ()) -> None:
        self.route = route
        self._allowed_judges = _model_ids(judge_models)
        """Judge models a request's header may name besides the run's (see allow_judge_models)."""
        self.calls = 0
        """Model calls forwarded for rollouts that returned a response."""
        self.errors = 0
        """Model calls forwarded for rollouts that failed (answered 502 / SSE error)."""
        self.tokens_total = 0
        """Sum of usage.total_tokens over every call served (preflight excluded)."""
        self.preflight_warning: str | None = None
        """Set when preflight met a non-fatal error (logged, the run goes on)."""
        self._keys: dict[str, bytes] = {}
        """Per open rollout: its ``Authorization`` header value; gone when the rollout closes."""
        self._tokens: dict[str, int | None] = {}
        self._calls: dict[str, list[dict[str, int]]] = {}
        self._reasoning: dict[str, dict[str, dict[str, Any]]] = {}
        """Per rollout: reasoning fields by the id of the tool call they came with."""
        self._rate_limited: dict[str, int] = {}
        self.backoff = Backoff()
        """Back-off of the run's model; each judge model has its own."""
        self._lock = threading.Lock()
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self._unserved: set[Any] = set()
        """Connections accepted that have not sent a complete request yet (see _reap)."""
        self.max_connections = _connection_cap()
        """Connections served at once; more are answered 503 (the process's fds are bounded)."""
        self._base = ""
        self._route_kwargs = dict(route.kwargs)
        self._secrets = _route_secrets(route)
        self._main = _Target(route, self.backoff)
        # Judge models by the id a request named: resolved once, failures cached too, so a
        # missing key or an unknown id costs one lookup, not one per row.
        self._judges: dict[str, _Target | _JudgeUnavailable] = {}
        self._judge_lock: asyncio.Lock | None = None

    # ----------------------------------------------------------------- lifecycle

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` once started."""
        if not self._base:
            raise RuntimeError("Bridge.start() has not run")
        return self._base

    async def start(self) -> None:
        """Bind 127.0.0.1 on an ephemeral port, on the running loop."""
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(
            "/v1/rollouts/{rollout_id}/chat/completions", self._handle, expect_handler=self._expect
        )
        unserved = self._unserved

        @web.middleware
        async def seen(request: web.Request, handler: Any) -> web.StreamResponse:
            """This connection has sent a complete request: it is not idle (see _reap)."""
            unserved.discard(request.protocol)
            response: web.StreamResponse = await handler(request)
            return response

        app.middlewares.append(seen)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, keepalive_timeout=IDLE_TIMEOUT_S
        )
        await runner.setup()
        loop = asyncio.get_running_loop()
        server = runner.server
        assert server is not None

        def accept() -> asyncio.BaseProtocol:
            """A connection beyond the bound is answered 503 and closed, never queued."""
            if len(server.connections) >= self.max_connections:
                return _Busy()
            handler = server()
            self._unserved.add(handler)
            due = loop.time() + IDLE_TIMEOUT_S
            loop.call_at(due, self._reap, handler, due)
            return handler

        self._server = await loop.create_server(accept, "127.0.0.1", 0, backlog=1024)
        self._runner = runner
        self._base = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def _reap(self, handler: Any, due: float) -> None:
        """Close a connection that sent no complete request within IDLE_TIMEOUT_S."""
        loop = asyncio.get_running_loop()
        if loop.time() - due > 1.0:
            # The loop itself was blocked (a row's code): give the client its time again.
            due = loop.time() + IDLE_TIMEOUT_S
            loop.call_at(due, self._reap, handler, due)
            return
        if handler not in self._unserved:
            return
        self._unserved.discard(handler)
        transport = handler.transport
        if transport is not None:
            transport.close()

    async def close(self) -> None:
        """Stop listening; the embedded model (if any) lives on for the process."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def open_rollout(self, rollout_id: str) -> tuple[str, str]:
        """Accept calls for `rollout_id`; returns (chat_completions_url, api_key)."""
        if not rollout_id or "/" in rollout_id:
            raise ValueError(f"rollout id must be one URL path segment, got {rollout_id!r}")
        with self._lock:
            key = self._keys.get(rollout_id)
            if key is None:
                # Unguessable and this rollout's alone: it stops working when the row ends.
                key = f"Bearer {secrets.token_urlsafe(32)}".encode()
                self._keys[rollout_id] = key
            self._tokens.setdefault(rollout_id, None)
            self._calls.setdefault(rollout_id, [])
        return f"{self.base_url}/v1/rollouts/{rollout_id}", key.decode()[len("Bearer ") :]

    def close_rollout(self, rollout_id: str) -> int | None:
        """Stop serving `rollout_id` and return its token total (None: no usage seen)."""
        with self._lock:
            self._keys.pop(rollout_id, None)
            self._calls.pop(rollout_id, None)
            self._reasoning.pop(rollout_id, None)
            return self._tokens.pop(rollout_id, None)

    def allow_judge_models(self, models: Iterable[str]) -> None:
        """Let requests name these judge models: a token holder may not spend on any other."""
        with self._lock:
            self._allowed_judges.update(_model_ids(models))

    def pop_rate_limited(self, rollout_id: str) -> int:
        """How many of `rollout_id`'s calls the provider answered with 429 (then retried)."""
        with self._lock:
            return self._rate_limited.pop(rollout_id, 0)

    def _open(self, rollout_id: str) -> bool:
        with self._lock:
            return rollout_id in self._tokens

    def call_usage(self, rollout_id: str) -> list[dict[str, int]]:
        """Per-call token counts served for `rollout_id` so far, in the order they completed.

        One entry per successful call (``{}`` when the provider reported no usage), so the
        count still lines up with the trajectory's agent steps.
        """
        with self._lock:
            return [dict(entry) for entry in self._calls.get(rollout_id, ())]

    # ----------------------------------------------------------------- preflight

    async def preflight(self) -> None:
        """Fail the session early and once on a model that cannot work (contract §5.5)."""
        litellm = _litellm()
        route = self.route
        kwargs = self._route_kwargs
        api_base = kwargs.get("api_base")
        try:
            litellm.get_llm_provider(
                model=route.litellm_model, api_base=api_base if isinstance(api_base, str) else None
            )
        except Exception as exc:
            raise ModelPreflightError(
                f"model preflight failed for {route.model_path!r}: not a LiteLLM model id; "
                "use 'provider/model' (e.g. openai/gpt-5-mini, anthropic/claude-sonnet-4-5) "
                f"or {EMBEDDED_MODEL_PATH!r} ({_one_line(exc, self._secrets)})"
            ) from None
        try:
            # By the route the rows' calls take, as the SDK's preflight does.
            await self._complete(
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 256}
            )
        except Exception as exc:
            self._classify_preflight(litellm, exc)

    def _classify_preflight(self, litellm: Any, exc: Exception) -> None:
        name = type(exc).__name__
        if name == "RateLimitError":
            return
        model = self.route.model_path
        detail = _one_line(exc, self._secrets)
        if name == "AuthenticationError" or _CREDENTIAL_HINT.search(detail):
            missing = self._missing_keys(litellm)
            if missing:
                raise ModelPreflightError(
                    f"model preflight failed for {model!r}: no API key, set "
                    f"{' or '.join(missing)} in the environment ({detail})"
                ) from None
        chain = _chain(exc)
        if any(type(link).__name__ in _CONNECT_ERRORS for link in chain):
            where = self._route_kwargs.get("api_base") or _endpoint_of(chain)
            root = _one_line(chain[-1], self._secrets)
            raise ModelPreflightError(
                f"model preflight failed for {model!r}: cannot reach {where}: {root}"
            ) from None
        if name in _PREFLIGHT_FATAL:
            raise ModelPreflightError(
                f"model preflight failed for {model!r}: {name}: {detail}"
            ) from None
        self.preflight_warning = f"model preflight for {model!r} met {name}: {detail}"
        logger.warning("%s", self.preflight_warning)

    def _missing_keys(self, litellm: Any) -> list[str]:
        if self._route_kwargs.get("api_key"):
            return []
        try:
            report = litellm.validate_environment(model=self.route.litellm_model)
        except Exception:
            return []
        missing = report.get("missing_keys") if isinstance(report, dict) else None
        return [str(k) for k in missing or []]

    # ----------------------------------------------------------------- judge models

    async def _target(self, header: str) -> _Target:
        """The model a request goes to: the judge its header names, else the run's model."""
        model = header.strip()
        if not model or model == self.route.model_path:
            return self._main
        with self._lock:
            allowed = model in self._allowed_judges
        if not allowed:
            raise _JudgeUnavailable(
                JUDGE_MODEL_NOT_ALLOWED,
                f"judge model {model[:200]!r} is not declared by this session: name it as a "
                "RubricGrader's judge_model or in ini osmosis_judge_models",
                status=403,
            )
        known = self._judges.get(model)
        if known is None:
            if self._judge_lock is None:
                self._judge_lock = asyncio.Lock()
            async with self._judge_lock:
                known = self._judges.get(model)
                if known is None:
                    try:
                        # Off the loop: osmosis/embedded starts a local server here.
                        known = await asyncio.get_running_loop().run_in_executor(
                            None, _resolve_judge, model
                        )
                    except _JudgeUnavailable as exc:
                        logger.warning("osmosis bridge: %s", exc)  # once, not once per row
                        known = exc
                    else:
                        self._secrets = _route_secrets(known.route) + self._secrets
                    self._judges[model] = known
        if isinstance(known, _JudgeUnavailable):
            # A fresh exception each time: re-raising one instance would grow its traceback.
            raise _JudgeUnavailable(known.kind, str(known), known.status)
        return known

    def _failure(self, exc: BaseException, target: _Target) -> tuple[int, str, str]:
        """``(status, error.type, one-line detail)`` of a failed call; a judge's names the judge."""
        detail = _one_line(exc, self._secrets)
        if not target.judge:
            status = _error_status(exc)
            return status, "invalid_request_error" if status == 400 else "bridge_error", detail
        return (502, *self._judge_failure(exc, target, detail))

    def _judge_failure(self, exc: BaseException, target: _Target, detail: str) -> tuple[str, str]:
        model = target.route.model_path
        if type(exc).__name__ == "NotFoundError":
            return (
                JUDGE_MODEL_NOT_FOUND,
                f"judge model {model!r} not found by its provider: {detail}",
            )
        chain = _chain(exc)
        if any(type(link).__name__ in _CONNECT_ERRORS for link in chain):
            where = target.route.kwargs.get("api_base") or _endpoint_of(chain)
            root = _one_line(chain[-1], self._secrets)
            return JUDGE_PROVIDER_ERROR, f"judge model {model!r}: cannot reach {where}: {root}"
        return JUDGE_PROVIDER_ERROR, f"provider error from judge model {model!r}: {detail}"

    # ----------------------------------------------------------------- serving

    def _refusal(self, request: web.Request) -> web.Response | None:
        """The answer to a call that may not be served, decided from its headers alone."""
        rollout_id = request.match_info.get("rollout_id", "")
        with self._lock:
            key = self._keys.get(rollout_id)
        if key is None:
            return _json_error(404, f"unknown or finished rollout id {rollout_id[:100]!r}")
        header = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(header, key):
            return _json_error(401, "missing or wrong bearer token for the osmosis bridge")
        return None

    async def _expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue``: refuse before the client sends its body."""
        from aiohttp.web_urldispatcher import _default_expect_handler

        refused = self._refusal(request)
        if refused is not None:
            return refused
        if (request.content_length or 0) > MAX_BODY_BYTES:
            return _body_too_large()
        await _default_expect_handler(request)
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        refused = self._refusal(request)
        if refused is not None:
            return refused
        rollout_id = request.match_info["rollout_id"]
        try:
            body = _parsed(await _read_body(request))
            call = _forwarded(body)
        except web.HTTPRequestEntityTooLarge:
            return _body_too_large()
        except _SlowBody:
            response = _json_error(408, f"request body not received within {BODY_TIMEOUT_S:g} s")
            response.force_close()
            return response
        except (ValueError, _BadRequest) as exc:
            return _json_error(400, f"bad chat completions request: {exc}")
        model = body.get("model")
        echo = model if isinstance(model, str) and model else self.route.model_path
        try:
            await _litellm_imported()
        except ModelPreflightError as exc:
            return _json_error(503, str(exc))
        try:
            target = await self._target(request.headers.get(JUDGE_MODEL_HEADER, ""))
        except _JudgeUnavailable as exc:
            return _json_error(exc.status, str(exc), kind=exc.kind)
        if body.get("stream"):
            return await self._stream(request, rollout_id, call, echo, target)
        try:
            response = await self._complete(call, rollout_id, target)
        except Exception as exc:
            self.errors += 1
            status, kind, detail = self._failure(exc, target)
            logger.warning("osmosis bridge: model call failed: %s", detail)
            return _json_error(status, detail, kind=kind)
        usage = _usage(response)
        self._account(rollout_id, usage, _call_metrics(response, usage))
        return web.Response(
            body=json.dumps(_payload(response, echo, usage, stream=False)).encode(),
            content_type="application/json",
        )

    async def _complete(
        self, body: dict[str, Any], rollout_id: str | None = None, target: _Target | None = None
    ) -> Any:
        """One provider call for a chat body, made the way osmosis-ai 0.3.8's bridge makes it."""
        litellm = _litellm()
        target = target or self._main
        route = target.route
        responses = False
        if target.judge:
            call = {**_judge_call(body), **route.kwargs}
        else:
            body = self._with_reasoning(body, rollout_id)
            responses = _uses_responses_api(litellm, route)
            call = _responses_call(body, route) if responses else _chat_call(litellm, body, route)
        while True:
            await target.backoff.wait()
            try:
                if responses:
                    raw = await litellm.aresponses(model=route.litellm_model, **call)
                else:
                    raw = await litellm.acompletion(model=route.litellm_model, **call)
            except Exception as exc:
                # A 429 slows every call to this model and is retried while the rollout
                # is open; its own budget, not the rate limit, decides when it gives up.
                if not is_rate_limit(exc) or rollout_id is None or not self._open(rollout_id):
                    raise
                target.backoff.hit(retry_after(exc))
                with self._lock:
                    self._rate_limited[rollout_id] = self._rate_limited.get(rollout_id, 0) + 1
                continue
            target.backoff.ok()
            break
        response = _from_responses(raw) if responses else raw
        if not _field(response, "choices", None):
            raise RuntimeError("the model returned no choices")
        if not target.judge and rollout_id is not None:
            self._remember_reasoning(response, rollout_id)
        return response

    def _with_reasoning(self, body: dict[str, Any], rollout_id: str | None) -> dict[str, Any]:
        """Hand a provider back the reasoning it returned with a tool call, where the
        client's replayed assistant message dropped it (Anthropic thinking with tools)."""
        with self._lock:
            stored = dict(self._reasoning.get(rollout_id or "", {}))
        messages = body.get("messages")
        if not stored or not isinstance(messages, list):
            return body
        replayed = []
        for message in messages:
            if isinstance(message, dict) and message.get("role") == "assistant":
                for call in message.get("tool_calls") or []:
                    fields = stored.get(_field(call, "id") or "")
                    if fields:
                        missing = {
                            k: v for k, v in fields.items() if message.get(k) in (None, [], "")
                        }
                        message = {**message, **missing}
                        break
            replayed.append(message)
        return {**body, "messages": replayed}

    def _remember_reasoning(self, response: Any, rollout_id: str) -> None:
        for choice in _field(response, "choices", None) or []:
            fields = _reasoning(choice)
            calls = _field(_message_of(choice), "tool_calls")
            if not fields or not calls:
                continue
            with self._lock:
                if rollout_id not in self._tokens:
                    return  # closed meanwhile
                stored = self._reasoning.setdefault(rollout_id, {})
                for call in calls:
                    call_id = _field(call, "id")
                    if call_id:
                        stored[call_id] = fields

    def _account(self, rollout_id: str, usage: dict[str, int] | None, call: dict[str, int]) -> None:
        self.calls += 1
        with self._lock:
            calls = self._calls.get(rollout_id)
            if calls is not None:
                calls.append(call)
        if usage is None:
            return
        total = usage["total_tokens"]
        self.tokens_total += total
        with self._lock:
            if rollout_id in self._tokens:
                self._tokens[rollout_id] = (self._tokens[rollout_id] or 0) + total

    async def _stream(
        self,
        request: web.Request,
        rollout_id: str,
        call: dict[str, Any],
        echo: str,
        target: _Target,
    ) -> web.StreamResponse:
        """SSE the way the official bridge does it: pings, one full chunk, [DONE]."""
        from aiohttp import web

        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        await response.write(b": ping\n\n")
        task = asyncio.ensure_future(self._complete(call, rollout_id, target))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=_SSE_HEARTBEAT_S)
                if done:
                    break
                await response.write(b": ping\n\n")
        finally:
            if not task.done():
                task.cancel()
        try:
            result = task.result()
        except Exception as exc:
            self.errors += 1
            status, kind, detail = self._failure(exc, target)
            logger.warning("osmosis bridge: model call failed: %s", detail)
            error = {
                "detail": detail,
                "error": {"message": detail, "type": kind, "code": status},
            }
            await response.write(f"event: error\ndata: {json.dumps(error)}\n\n".encode())
        else:
            usage = _usage(result)
            self._account(rollout_id, usage, _call_metrics(result, usage))
            chunk = json.dumps(_payload(result, echo, usage, stream=True))
            await response.write(f"data: {chunk}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _resolve_judge(model: str) -> _Target:
    """Route a judge model as the run's model is routed, and check it can be called."""
    from pytest_osmosis.errors import OsmosisError

    try:
        route = resolve_route(model)
    except OsmosisError as exc:
        raise _JudgeUnavailable(
            JUDGE_MODEL_NOT_FOUND, f"judge model {model!r} is unavailable: {_one_line(exc)}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - e.g. the embedded engine crashed while starting
        raise _JudgeUnavailable(
            JUDGE_MODEL_NOT_FOUND,
            f"judge model {model!r} is unavailable: {type(exc).__name__}: {_one_line(exc)}",
        ) from None
    litellm = _litellm()
    api_base = route.kwargs.get("api_base")
    try:
        litellm.get_llm_provider(
            model=route.litellm_model, api_base=api_base if isinstance(api_base, str) else None
        )
    except Exception:  # noqa: BLE001 - LiteLLM says "provider not provided" in many ways
        raise _JudgeUnavailable(
            JUDGE_MODEL_NOT_FOUND,
            f"unknown judge model {model!r}: not a LiteLLM model id; use provider/model "
            "(e.g. openai/gpt-5-mini, anthropic/claude-sonnet-4-5) "
            f"or {EMBEDDED_MODEL_PATH!r}",
        ) from None
    missing = _missing_judge_keys(litellm, route)
    if missing:
        raise _JudgeUnavailable(
            JUDGE_MISSING_API_KEY,
            f"missing API key: set {' and '.join(missing)} for judge model {model!r} "
            f"(or use the offline judge {EMBEDDED_MODEL_PATH})",
        )
    return _Target(route, Backoff(), judge=True)


def _missing_judge_keys(litellm: Any, route: ModelRoute) -> list[str]:
    """The variables a judge's provider needs and lacks, as the rubric command reports them."""
    from pytest_osmosis.judge import DEFAULT_API_KEY_ENV, provider_of

    if route.kwargs.get("api_key"):
        return []
    env = DEFAULT_API_KEY_ENV.get(provider_of(route.litellm_model) or "")
    if env is not None:
        return [] if os.environ.get(env, "").strip() else [env]
    try:
        report = litellm.validate_environment(model=route.litellm_model)
    except Exception:  # noqa: BLE001 - no verdict: let the call itself tell
        return []
    names = report.get("missing_keys") if isinstance(report, dict) else None
    return [str(name) for name in names or [] if _KEY_NAME.search(str(name))]


async def _read_body(request: web.Request) -> bytes:
    """The body, refused from its declared length before reading when it is too large."""
    from aiohttp import web

    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, request.content_length or 0)
    try:
        return await asyncio.wait_for(request.read(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise _SlowBody from None


class _SlowBody(Exception):
    """The client did not send its body within BODY_TIMEOUT_S (answered 408)."""


class _Busy(asyncio.Protocol):
    """A connection over `Bridge.max_connections`: one 503, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        detail = b"the osmosis bridge is serving its maximum number of connections"
        transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(detail), detail)
        )
        transport.close()


def _connection_cap() -> int:
    """Half the process's file descriptors (the rest are the session's own), 64 at least."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 512
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 4096
    return max(64, min(4096, soft // 2))


def _body_too_large() -> web.Response:
    return _json_error(
        413, f"request body larger than the bridge's limit of {MAX_BODY_BYTES // 2**20} MiB"
    )


def _parsed(raw: bytes) -> dict[str, Any]:
    """The request JSON, refused (``_BadRequest``) when it is not an object or nests too deep."""
    try:
        body = json.loads(raw)
    except RecursionError:
        body = None
        too_deep = True
    else:
        too_deep = _deeper_than(body, _MAX_JSON_DEPTH)
    if too_deep:
        raise _BadRequest(f"request body nests deeper than {_MAX_JSON_DEPTH} levels")
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    return body


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests deeper than `limit` (iteratively: no recursion to exhaust)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _forwarded(body: dict[str, Any]) -> dict[str, Any]:
    """The request, checked for what every route needs; the call is built from it later."""
    if not isinstance(body.get("messages"), list):
        raise _BadRequest("'messages' must be a list")
    return body


def _judge_call(body: dict[str, Any]) -> dict[str, Any]:
    call: dict[str, Any] = {"drop_params": True}
    for key in _JUDGE_FORWARDED:
        value = body.get(key)
        if value is not None:
            call[key] = value
    return call


@functools.cache
def _control_names() -> frozenset[str]:
    """Names a body may not set: ours plus every LiteLLM call setting (metadata is data)."""
    import litellm
    from litellm.types.router import GenericLiteLLMParams
    from litellm.types.utils import all_litellm_params

    return (
        _CONTROL_NAMES
        | frozenset(all_litellm_params)
        | frozenset(GenericLiteLLMParams.model_fields)
        | frozenset(litellm.common_cloud_provider_auth_params["params"])
    ) - {"metadata"}


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        previous = base.get(key)
        if isinstance(previous, dict) and isinstance(value, dict):
            base[key] = _merged(previous, value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _inference_fields(body: dict[str, Any], route: ModelRoute) -> dict[str, Any]:
    """Every field of the body the provider should see; the route's own settings win."""
    extra = body.get("extra_body")
    if extra is not None and not isinstance(extra, dict):
        raise _BadRequest("extra_body must be a JSON object")
    fields = _merged(
        copy.deepcopy({k: v for k, v in body.items() if k != "extra_body"}), extra or {}
    )
    if fields.get("n") not in (None, 1):
        raise _BadRequest("the bridge supports only n=1")
    for key in _ENVELOPE:
        fields.pop(key, None)
    blocked = sorted(
        key for key in fields if key in _control_names() or key.startswith(_CONTROL_PREFIXES)
    )
    if blocked:
        raise _BadRequest(
            "request fields cannot override the bridge's configuration: " + ", ".join(blocked)
        )
    if "extra_body" in fields:
        raise _BadRequest("extra_body cannot contain another extra_body")
    for key in route.kwargs:
        fields.pop(key, None)
    return fields


def _api_base(route: ModelRoute) -> str | None:
    value = route.kwargs.get("api_base")
    return value if isinstance(value, str) else None


def _uses_responses_api(litellm: Any, route: ModelRoute) -> bool:
    """An ``openai/*`` model served by OpenAI itself is called through the Responses API.

    The endpoint is resolved LiteLLM's way (the route's ``api_base``, ``litellm.api_base``,
    ``OPENAI_BASE_URL``, ``OPENAI_API_BASE``), as osmosis-ai 0.3.8 decides it.
    """
    return route.litellm_model.startswith("openai/") and _official_openai(litellm, route)


def _official_openai(litellm: Any, route: ModelRoute) -> bool:
    base = litellm.OpenAIGPTConfig.get_api_base(_api_base(route))
    return str(base or "").rstrip("/") == _OPENAI_API_BASE


def _chat_call(litellm: Any, body: dict[str, Any], route: ModelRoute) -> dict[str, Any]:
    """``acompletion`` kwargs: an OpenAI-compatible endpoint gets the fields as JSON
    (``extra_body``); a native provider gets them as LiteLLM's parameters, never dropped."""
    from litellm.constants import openai_compatible_providers

    fields = _inference_fields(body, route)
    resolved, provider, _, _ = litellm.get_llm_provider(
        model=route.litellm_model, api_base=_api_base(route)
    )
    native_claude = provider in {"azure_ai", "vertex_ai"} and "claude" in resolved
    openai_wire = not native_claude and (
        provider == "openrouter"
        or provider in openai_compatible_providers
        or (provider == "openai" and not _official_openai(litellm, route))
    )
    call: dict[str, Any] = {"messages": copy.deepcopy(body["messages"]), "drop_params": False}
    if openai_wire:
        if fields:
            call["extra_body"] = fields
    else:
        metadata = fields.pop("metadata", None)
        if metadata is not None:
            if provider in {"openai", "azure"}:
                call["extra_body"] = {"metadata": metadata}
            elif provider == "anthropic" or native_claude:
                if not isinstance(metadata, dict) or set(metadata) - {"user_id"}:
                    raise _BadRequest("Anthropic metadata supports only user_id")
                fields["metadata"] = metadata
            else:
                raise _BadRequest(
                    f"LiteLLM cannot forward metadata to {provider}; "
                    "use its provider-specific parameter"
                )
        call.update(fields)
    call.update(route.kwargs)
    return call


def _responses_content(content: Any, *, role: Any) -> Any:
    if not isinstance(content, list):
        return content
    parts: list[Any] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text_kind = "output_text" if role == "assistant" else "input_text"
            parts.append({"type": text_kind, "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url")
            url, detail = (
                (image.get("url"), image.get("detail", "auto"))
                if isinstance(image, dict)
                else (image, "auto")
            )
            parts.append({"type": "input_image", "image_url": url, "detail": detail})
        elif kind == "file" and isinstance(part.get("file"), dict):
            keys = ("file_id", "file_data", "filename")
            parts.append(
                {"type": "input_file", **{k: part["file"][k] for k in keys if k in part["file"]}}
            )
        else:
            parts.append(part)
    return parts


def _responses_input(messages: Any) -> list[Any]:
    """Chat messages as Responses input items: tool calls and results become their own items."""
    items: list[Any] = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "tool":
            output = _responses_content(message.get("content", ""), role=role)
            if not isinstance(output, (str, list)):
                output = json.dumps(output, separators=(",", ":"))
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id", ""),
                    "output": output,
                }
            )
            continue
        calls = message.get("tool_calls")
        content = message.get("content")
        refusal = message.get("refusal") if role == "assistant" else None
        if content not in (None, ""):
            items.append({"role": role, "content": _responses_content(content, role=role)})
        elif isinstance(refusal, str) and refusal:
            items.append({"role": role, "content": [{"type": "refusal", "refusal": refusal}]})
        elif not calls:
            items.append({"role": role, "content": ""})
        if role != "assistant" or not isinstance(calls, list):
            continue
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            arguments = function.get("arguments", "")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, separators=(",", ":"))
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id", ""),
                    "name": function.get("name", ""),
                    "arguments": arguments,
                }
            )
    return items


def _responses_call(body: dict[str, Any], route: ModelRoute) -> dict[str, Any]:
    """``aresponses`` kwargs from a chat body: Responses names for the chat parameters,
    function tools flattened, anything else in ``extra_body``."""
    fields = _inference_fields(body, route)
    call: dict[str, Any] = {"input": _responses_input(body.get("messages", []))}
    # The native name wins over the newer chat limit, which wins over max_tokens.
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if key in fields:
            call["max_output_tokens"] = fields.pop(key)
    if "reasoning_effort" in fields:
        effort = fields.pop("reasoning_effort")
        reasoning = fields.get("reasoning", {})
        mapped = effort if isinstance(effort, dict) else {"effort": effort}
        if not isinstance(reasoning, dict) or any(
            key in reasoning and reasoning[key] != value for key, value in mapped.items()
        ):
            raise _BadRequest("reasoning and reasoning_effort contain conflicting settings")
        fields["reasoning"] = {**mapped, **reasoning}
    if "response_format" in fields:
        form = fields.pop("response_format")
        if (
            isinstance(form, dict)
            and form.get("type") == "json_schema"
            and isinstance(form.get("json_schema"), dict)
        ):
            form = {**{k: v for k, v in form.items() if k != "json_schema"}, **form["json_schema"]}
        text = fields.get("text", {})
        if not isinstance(text, dict) or ("format" in text and text["format"] != form):
            raise _BadRequest("text.format and response_format contain conflicting settings")
        fields["text"] = {**text, "format": form}
    if "tool_choice" in fields:
        choice = fields.pop("tool_choice")
        if (
            isinstance(choice, dict)
            and choice.get("type") == "function"
            and isinstance(choice.get("function"), dict)
        ):
            choice = {"type": "function", "name": choice["function"].get("name", "")}
        call["tool_choice"] = choice
    if "tools" in fields:
        tools = fields.pop("tools")
        if isinstance(tools, list):
            tools = [
                {"type": "function", **tool["function"]}
                if isinstance(tool, dict)
                and tool.get("type") == "function"
                and isinstance(tool.get("function"), dict)
                else tool
                for tool in tools
            ]
        call["tools"] = tools
    for key in ("temperature", "top_p", "parallel_tool_calls"):
        if key in fields:
            call[key] = fields.pop(key)
    if fields:
        call["extra_body"] = fields  # merged into the request JSON by LiteLLM
    call.update(route.kwargs)
    return call


def _from_responses(response: Any) -> dict[str, Any]:
    """A Responses result as a chat completion; an unfinished one is an error."""
    status = _field(response, "status")
    reason = _field(_field(response, "incomplete_details"), "reason")
    if status == "incomplete":
        if reason not in {"max_output_tokens", "content_filter"}:
            raise RuntimeError(
                f"OpenAI Responses API returned an incomplete response with reason {reason!r}"
            )
    elif status != "completed":
        error = _field(response, "error")
        detail = ": ".join(
            str(value) for value in (_field(error, "code"), _field(error, "message")) if value
        )
        raise RuntimeError(
            f"OpenAI Responses API returned status {status!r}" + (f": {detail}" if detail else "")
        )
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in _field(response, "output", None) or []:
        kind = _field(item, "type")
        if kind == "message":
            for part in _field(item, "content", None) or []:
                if _field(part, "type") == "output_text":
                    texts.append(str(_field(part, "text", "") or ""))
                elif _field(part, "type") == "refusal":
                    refusals.append(str(_field(part, "refusal", "") or ""))
        elif kind == "function_call":
            calls.append(
                {
                    "id": _field(item, "call_id") or _field(item, "id"),
                    "type": "function",
                    "function": {
                        "name": _field(item, "name", ""),
                        "arguments": _field(item, "arguments", ""),
                    },
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    if refusals:
        message["refusal"] = "".join(refusals)
    finish = "tool_calls" if calls else "stop"
    if status == "incomplete":
        finish = "length" if reason == "max_output_tokens" else "content_filter"
    chat: dict[str, Any] = {
        "id": _field(response, "id", None) or "chatcmpl-osmosis",
        "created": int(_field(response, "created_at", None) or time.time()),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    usage = _field(response, "usage")
    if usage is not None:
        prompt = int(_field(usage, "input_tokens", 0) or 0)
        completion = int(_field(usage, "output_tokens", 0) or 0)
        chat["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": int(_field(usage, "total_tokens", prompt + completion) or 0),
        }
        cached = _field(_field(usage, "input_tokens_details"), "cached_tokens")
        if isinstance(cached, int) and not isinstance(cached, bool):
            chat["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    return chat


def _error_status(exc: BaseException) -> int:
    """The status a rollout sees: a provider's 4xx as it came (a refused body is 400), else 502."""
    status = 400 if isinstance(exc, _BadRequest) else getattr(exc, "status_code", None)
    for link in _chain(exc):
        response = getattr(link, "response", None)
        if type(link).__name__ == "HTTPStatusError" and response is not None:
            status = getattr(response, "status_code", status)
            break
    return status if isinstance(status, int) and 400 <= status < 500 else 502


def _json_error(status: int, detail: str, *, kind: str | None = None) -> web.Response:
    from aiohttp import web

    if kind is None:
        kind = "bridge_error" if status >= 500 else "invalid_request_error"
    body = {"detail": detail, "error": {"message": detail, "type": kind, "code": status}}
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type="application/json"
    )
