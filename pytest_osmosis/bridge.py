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
import gc
import json
import logging
import os
import re
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_osmosis.errors import ModelPreflightError
from pytest_osmosis.ratelimit import Backoff, is_rate_limit, retry_after

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "EMBEDDED_MODEL_PATH",
    "JUDGE_MISSING_API_KEY",
    "JUDGE_MODEL_HEADER",
    "JUDGE_MODEL_NOT_FOUND",
    "JUDGE_PROVIDER_ERROR",
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
JUDGE_PROVIDER_ERROR = "judge_provider_error"

# Only these request fields reach the provider: the rollout must not be able to
# change the model, the credentials or the endpoint the user configured. Beyond the
# contract's five, these are inference fields osmosis-ai 0.3.8's bridge also forwards and
# the SDK's agent integrations send (structured output, stop words, newer token limits).
_FORWARDED = (
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

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def resolve_route(model_path: str) -> ModelRoute:
    """Map the configured model to a LiteLLM call; ``osmosis/embedded`` starts the local model."""
    if model_path == EMBEDDED_MODEL_PATH:
        from pytest_osmosis.embedded import embedded_route

        return embedded_route()
    return ModelRoute(model_path=model_path, litellm_model=model_path, kwargs={})


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


def _tool_calls(raw: Any, *, indexed: bool) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for index, call in enumerate(raw):
        if isinstance(call, dict):
            item = dict(call)
        else:
            function = call.function
            item = {
                "id": call.id,
                "type": getattr(call, "type", None) or "function",
                "function": {"name": function.name, "arguments": function.arguments},
            }
        if indexed:
            item["index"] = index
        calls.append(item)
    return calls


def _usage(response: Any) -> dict[str, int] | None:
    usage = getattr(response, "usage", None)
    if usage is None:
        return None
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion = int(getattr(usage, "completion_tokens", 0) or 0)
    total = getattr(usage, "total_tokens", None)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": int(total) if total is not None else prompt + completion,
    }


def _call_metrics(response: Any, usage: dict[str, int] | None) -> dict[str, int]:
    """One call's entry for the trajectory, named as the SDK's ``LlmCallMetrics``."""
    if usage is None:
        return {}
    entry = {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
    }
    details = getattr(getattr(response, "usage", None), "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None)
    if isinstance(cached, int) and not isinstance(cached, bool):
        entry["cached_tokens"] = cached
    return entry


def _payload(
    response: Any, model: str, usage: dict[str, int] | None, *, stream: bool
) -> dict[str, Any]:
    """OpenAI chat.completion (or its single-chunk stream form) from a LiteLLM response."""
    choices: list[dict[str, Any]] = []
    for index, choice in enumerate(response.choices):
        message = choice.message
        content = message.content
        raw_calls = getattr(message, "tool_calls", None)
        reasoning = getattr(message, "reasoning_content", None)
        body: dict[str, Any]
        if stream:
            body = {"role": "assistant", "content": content or ""}
        else:
            body = {"role": "assistant", "content": content}
        if raw_calls:
            body["tool_calls"] = _tool_calls(raw_calls, indexed=stream)
        if reasoning is not None:
            body["reasoning_content"] = reasoning
        choices.append(
            {
                "index": getattr(choice, "index", index) or index,
                "delta" if stream else "message": body,
                "finish_reason": getattr(choice, "finish_reason", None) or "stop",
            }
        )
    payload: dict[str, Any] = {
        "id": getattr(response, "id", None) or "chatcmpl-osmosis",
        "object": "chat.completion.chunk" if stream else "chat.completion",
        "created": int(getattr(response, "created", None) or time.time()),
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        payload["usage"] = usage
    return payload


class _BadRequest(Exception):
    """The rollout sent a body the bridge cannot forward (answered 400)."""


class Bridge:
    """One loopback listener per session; rollouts are told apart by their URL.

    `start`, `preflight` and `close` run on the caller's event loop; `open_rollout`
    and `close_rollout` may be called from any thread.
    """

    def __init__(self, route: ModelRoute) -> None:
        self.route = route
        self.calls = 0
        """Model calls forwarded for rollouts that returned a response."""
        self.errors = 0
        """Model calls forwarded for rollouts that failed (answered 502 / SSE error)."""
        self.tokens_total = 0
        """Sum of usage.total_tokens over every call served (preflight excluded)."""
        self.preflight_warning: str | None = None
        """Set when preflight met a non-fatal error (logged, the run goes on)."""
        self._api_key = secrets.token_hex(16)
        self._auth = f"Bearer {self._api_key}".encode()
        self._tokens: dict[str, int | None] = {}
        self._calls: dict[str, list[dict[str, int]]] = {}
        self._rate_limited: dict[str, int] = {}
        self.backoff = Backoff()
        """Back-off of the run's model; each judge model has its own."""
        self._lock = threading.Lock()
        self._runner: web.AppRunner | None = None
        self._base = ""
        self._route_kwargs = dict(route.kwargs)
        self._secrets = _route_secrets(route) + (self._api_key,)
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

        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/rollouts/{rollout_id}/chat/completions", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        self._runner = runner
        self._base = f"http://127.0.0.1:{runner.addresses[0][1]}"

    async def close(self) -> None:
        """Stop listening; the embedded model (if any) lives on for the process."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def open_rollout(self, rollout_id: str) -> tuple[str, str]:
        """Accept calls for `rollout_id`; returns (chat_completions_url, api_key)."""
        if not rollout_id or "/" in rollout_id:
            raise ValueError(f"rollout id must be one URL path segment, got {rollout_id!r}")
        with self._lock:
            self._tokens.setdefault(rollout_id, None)
            self._calls.setdefault(rollout_id, [])
        return f"{self.base_url}/v1/rollouts/{rollout_id}", self._api_key

    def close_rollout(self, rollout_id: str) -> int | None:
        """Stop serving `rollout_id` and return its token total (None: no usage seen)."""
        with self._lock:
            self._calls.pop(rollout_id, None)
            return self._tokens.pop(rollout_id, None)

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
        call: dict[str, Any] = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 256,
            **kwargs,
        }
        try:
            await litellm.acompletion(model=route.litellm_model, drop_params=True, **call)
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
            raise _JudgeUnavailable(known.kind, str(known))
        return known

    def _failure(self, exc: BaseException, target: _Target) -> tuple[str, str]:
        """``(error.type, one-line detail)`` of a failed call; a judge's names the judge."""
        detail = _one_line(exc, self._secrets)
        if not target.judge:
            return "bridge_error", detail
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

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        header = request.headers.get("Authorization", "")
        if not secrets.compare_digest(header.encode(), self._auth):
            return _json_error(401, "missing or wrong bearer token for the osmosis bridge")
        rollout_id = request.match_info["rollout_id"]
        if rollout_id not in self._tokens:
            return _json_error(404, f"unknown or finished rollout id {rollout_id!r}")
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise _BadRequest("request body must be a JSON object")
            call = _forwarded(body)
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
            return _json_error(400, str(exc), kind=exc.kind)
        if body.get("stream"):
            return await self._stream(request, rollout_id, call, echo, target)
        try:
            response = await self._complete(call, rollout_id, target)
        except Exception as exc:
            self.errors += 1
            kind, detail = self._failure(exc, target)
            logger.warning("osmosis bridge: model call failed: %s", detail)
            return _json_error(502, detail, kind=kind)
        usage = _usage(response)
        self._account(rollout_id, usage, _call_metrics(response, usage))
        return web.Response(
            body=json.dumps(_payload(response, echo, usage, stream=False)).encode(),
            content_type="application/json",
        )

    async def _complete(
        self, call: dict[str, Any], rollout_id: str | None = None, target: _Target | None = None
    ) -> Any:
        litellm = _litellm()
        target = target or self._main
        kwargs = target.route.kwargs
        if kwargs:
            call.update(kwargs)
        while True:
            await target.backoff.wait()
            try:
                response = await litellm.acompletion(
                    model=target.route.litellm_model, drop_params=True, **call
                )
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
        if not response.choices:
            raise RuntimeError("the model returned no choices")
        return response

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
            kind, detail = self._failure(exc, target)
            logger.warning("osmosis bridge: model call failed: %s", detail)
            error = {
                "detail": detail,
                "error": {"message": detail, "type": kind, "code": 502},
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


def _forwarded(body: dict[str, Any]) -> dict[str, Any]:
    call: dict[str, Any] = {}
    for key in _FORWARDED:
        value = body.get(key)
        if value is not None:
            call[key] = value
    if not isinstance(call.get("messages"), list):
        raise _BadRequest("'messages' must be a list")
    return call


def _json_error(status: int, detail: str, *, kind: str | None = None) -> web.Response:
    from aiohttp import web

    if kind is None:
        kind = "bridge_error" if status >= 500 else "invalid_request_error"
    body = {"detail": detail, "error": {"message": detail, "type": kind, "code": status}}
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type="application/json"
    )
