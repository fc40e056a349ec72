"""Loopback OpenAI-compatible endpoint that forwards rollout calls to LiteLLM in-process.

Rollouts only ever see ``http://127.0.0.1:<port>/v1/rollouts/<rollout_id>`` and a
per-session bearer; provider keys stay in this process (contract §4.7). Routing by
rollout id in the URL lets the bridge sum tokens per work item without trusting the
client. A call carrying ``X-Osmosis-Judge-Model`` (a `RubricGrader`'s judge) goes to that
model instead of the run's, still counted in the row. LiteLLM is imported inside the
functions that call it: importing it costs ~3 s and plain pytest runs must not pay that.
What a call becomes on the wire (`wire`), where it goes (`routes`) and how a provider's
failure reads (`errors`) live beside this server, which only serves.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hmac
import json
import logging
import secrets
import select
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from pytest_osmosis.core.errors import ModelPreflightError
from pytest_osmosis.model.cache import CachedAttempt, offline_judge
from pytest_osmosis.model.direct import (
    DirectClient,
    direct_base,
    is_plain,
    litellm_configured,
    missing_keys,
    rows_go_direct,
)
from pytest_osmosis.model.litellm import _litellm, _litellm_imported, cost_usd
from pytest_osmosis.model.provider_errors import (
    _CONNECT_ERRORS,
    _CREDENTIAL_HINT,
    _PREFLIGHT_FATAL,
    _chain,
    _endpoint_of,
    _one_line,
    _out_of_descriptors,
)
from pytest_osmosis.model.ratelimit import Backoff
from pytest_osmosis.model.routes import (
    EMBEDDED_MODEL_PATH,
    JUDGE_MODEL_NOT_ALLOWED,
    JUDGE_MODEL_NOT_FOUND,
    JUDGE_PROVIDER_ERROR,
    ModelRoute,
    _JudgeUnavailable,
    _model_ids,
    _resolve_judge,
    _route_secrets,
    _Target,
    _uses_responses_api,
    not_a_model_id,
)
from pytest_osmosis.model.wire import (
    _BadRequest,
    _call_metrics,
    _chat_call,
    _field,
    _forwarded,
    _from_responses,
    _judge_call,
    _message_of,
    _payload,
    _reasoning,
    _responses_call,
    _usage,
)

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "BODY_TIMEOUT_S",
    "IDLE_TIMEOUT_S",
    "JUDGE_MODEL_HEADER",
    "MAX_BODY_BYTES",
    "Bridge",
]

logger = logging.getLogger(__name__)

JUDGE_MODEL_HEADER = "X-Osmosis-Judge-Model"
"""A request header naming the model (LiteLLM id or ``osmosis/embedded``) to answer it."""
_SSE_HEARTBEAT_S = 15.0
MAX_BODY_BYTES = 32 * 1024 * 1024
"""The largest request body the bridge reads (413 above it): a chat call with images fits."""
_MAX_JSON_DEPTH = 200
IDLE_TIMEOUT_S = 5.0
"""A new connection that has sent no complete request headers this long is closed: an idle
local client cannot hold the bridge's file descriptors."""
KEEP_ALIVE_S = 20.0
"""How long a served connection may wait idle for its next request. Longer than the idle
expiry of the clients rollouts use (httpx, so the OpenAI SDK and LiteLLM: 5 s; aiohttp: 15 s),
so that a client retires a connection before the bridge closes it: a close at the client's
own expiry raced a request just sent on it, and failed that row (``httpx.ReadError``)."""
KEEP_ALIVE_ADVERTISED_S = 15
"""``Keep-Alive: timeout=15`` on every answer: clients that read it retire idle connections
well before KEEP_ALIVE_S."""
BODY_TIMEOUT_S = 60.0
"""A body not received within this long is answered 408 (a slow client, not a slow model)."""
"""Deeper request JSON is refused (400): copying and forwarding it would exhaust the stack."""
CLOSE_GRACE_S = 1.0
"""How long `Bridge.close` lets a call in flight finish (twice: answered, then cancelled)
before it closes the connection: the bridge closes when the session stops, so a call still
in flight is one whose row is being stopped anyway. Well within the session's own bound on
the close (plugin/models.py), so the close is never abandoned half-way."""
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


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
        self._costs: dict[str, float | None] = {}
        """Per open rollout: dollars spent so far by LiteLLM's cost map (None: no priced call
        yet); in ``_unpriced`` once a call had no usage or no price (its cost is unknown)."""
        self._unpriced: set[str] = set()
        self._cached: dict[str, CachedAttempt] = {}
        """Per open rollout using the model-call cache: its row and attempt there."""
        self.offline = False
        """Replaying a model-call cache: no call reaches a provider, no judge is resolved."""
        self._provider_errors: dict[str, int] = {}
        """Per rollout: model calls the provider answered with a 5xx (``pop_provider_errors``)."""
        self.backoff = Backoff()
        """Back-off of the run's model; each judge model has its own."""
        self._lock = threading.Lock()
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self._closing = False
        self._listener: _Listener | None = None
        self._unserved: set[Any] = set()
        """Connections accepted that have not sent a complete request yet (see _reap)."""
        self._connections: dict[asyncio.BaseProtocol, asyncio.Transport] = {}
        """Every connection made and not yet lost, by its protocol: `close` closes them all."""
        self.max_connections = _connection_cap()
        """Connections served at once; more are answered 503 (the process's fds are bounded)."""
        self.exhaustions = 0
        """Calls the bridge could not serve for want of its own resources (see `exhausted`)."""
        self.last_exhaustion = ""
        self._base = ""
        self._route_kwargs = dict(route.kwargs)
        self._secrets = _route_secrets(route)
        self._main = _Target(route, self.backoff)
        base = direct_base(route)
        self._direct = DirectClient(route, base) if base else None
        """The upstream that skips LiteLLM where its request is LiteLLM's (model/direct.py)."""
        self._rows_direct = rows_go_direct(route)
        """Rows' calls go direct too: to our own llama.cpp server, or any endpoint over plain
        HTTP (contract D72); retries are the back-off's on both paths (D79)."""
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
        app.on_response_prepare.append(_advertise_keep_alive)
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=KEEP_ALIVE_S,
            shutdown_timeout=CLOSE_GRACE_S,
        )
        await runner.setup()
        loop = asyncio.get_running_loop()
        server = runner.server
        assert server is not None
        handler_class = _tracked_handler(self._connections)
        listener = _Listener(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))

        def accept() -> asyncio.BaseProtocol:
            """A connection beyond the bound is answered 503 and closed, never queued."""
            if self._closing:  # accepted just before the close, which closed it: no transport
                raise ConnectionAbortedError("the osmosis bridge has closed")
            listener.take()
            if len(server.connections) >= self.max_connections:
                cap = self.max_connections
                self.exhausted(f"the osmosis bridge is serving its maximum of {cap} connections")
                return _Busy(self._connections)
            handler = _as_class(server(), handler_class)
            self._unserved.add(handler)
            due = loop.time() + IDLE_TIMEOUT_S
            loop.call_at(due, self._reap, handler, due)
            return handler

        self._server = await loop.create_server(accept, sock=listener, backlog=1024)
        self._listener = listener
        self._runner = runner
        self._base = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        if self._rows_direct:  # their price is read from LiteLLM's file: off the rows' loop
            from pytest_osmosis.model.prices import price

            await loop.run_in_executor(None, price, self.route.litellm_model)

    def exhausted(self, why: str) -> None:
        """Count a call the session's own exhaustion left unserved: no rollout's failure.

        A row failing after this is not journalled; the session stops (runner.execute).
        """
        with self._lock:
            self.exhaustions += 1
            self.last_exhaustion = why

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
        transport = handler.transport
        if _bytes_waiting(transport):  # its request is arriving: the loop reads it next
            loop.call_later(1.0, self._reap, handler, loop.time() + 1.0)
            return
        self._unserved.discard(handler)
        if transport is not None:
            transport.close()

    async def close(self) -> None:
        """Stop listening and close every connection; the embedded model (if any) lives on.

        No connection of ours is left open for the garbage collector: one collected after
        its asyncio server closed raised ``TypeError`` in ``Server._wakeup`` on Python
        3.13.0 (an unraisable exception pytest reports), and leaked a descriptor on any.
        """
        self._closing = True
        server, self._server = self._server, None
        if server is not None:
            server.close()  # listens no more
        if self._listener is not None:
            self._listener.drop_untaken()
        runner, self._runner = self._runner, None
        try:
            if runner is not None:
                await runner.cleanup()  # calls in flight get CLOSE_GRACE_S, then are cancelled
        finally:
            # aiohttp's shutdown closes the connections it knew when it began, unless it was
            # cancelled; one made since (accepted just before the server closed), one closed
            # with unsent bytes, and a 503 answer are closed here, even when we are cancelled.
            await self._close_connections()
        if self._direct is not None:
            await self._direct.close()

    async def _close_connections(self) -> None:
        """Abort every connection still open and wait until the loop has let each go."""
        await asyncio.sleep(0)  # a connection made before the server closed: connection_made
        for _ in range(100):
            if not self._connections:
                return
            for transport in list(self._connections.values()):
                transport.abort()
            await asyncio.sleep(0)  # connection_lost runs on the loop's next pass

    def open_rollout(
        self, rollout_id: str, cache: CachedAttempt | None = None
    ) -> tuple[str, str]:
        """Accept calls for `rollout_id`; returns (chat_completions_url, api_key).

        With `cache`, its calls go through the model-call cache as that row and attempt.
        """
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
            self._costs.setdefault(rollout_id, None)
            if cache is not None:
                self._cached[rollout_id] = cache
        return f"{self.base_url}/v1/rollouts/{rollout_id}", key.decode()[len("Bearer ") :]

    def close_rollout(self, rollout_id: str) -> int | None:
        """Stop serving `rollout_id` and return its token total (None: no usage seen)."""
        with self._lock:
            self._keys.pop(rollout_id, None)
            self._calls.pop(rollout_id, None)
            self._reasoning.pop(rollout_id, None)
            self._cached.pop(rollout_id, None)
            return self._tokens.pop(rollout_id, None)

    def allow_judge_models(self, models: Iterable[str]) -> None:
        """Let requests name these judge models: a token holder may not spend on any other."""
        with self._lock:
            self._allowed_judges.update(_model_ids(models))

    def pop_cost(self, rollout_id: str) -> float | None:
        """What `rollout_id`'s calls cost in dollars; None when unknown: no call was priced,
        or one had no usage or no price (an attempt that made no call has no price: not $0)."""
        with self._lock:
            cost = self._costs.pop(rollout_id, None)
            if rollout_id in self._unpriced:
                self._unpriced.discard(rollout_id)
                return None
            return cost

    def pop_rate_limited(self, rollout_id: str) -> int:
        """How many of `rollout_id`'s calls the provider answered with 429 (then retried)."""
        with self._lock:
            return self._rate_limited.pop(rollout_id, 0)

    def pop_provider_errors(self, rollout_id: str) -> int:
        """How many of `rollout_id`'s calls the provider answered with a 5xx (infrastructure)."""
        with self._lock:
            return self._provider_errors.pop(rollout_id, 0)

    def _count_rate_limit(self, rollout_id: str | None) -> None:
        if rollout_id is not None:
            with self._lock:
                self._rate_limited[rollout_id] = self._rate_limited.get(rollout_id, 0) + 1

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
        """Fail the session early and once on a model that cannot work (contract §5.5).

        An OpenAI-compatible route is checked with one direct request, without LiteLLM.
        """
        litellm = None if self._direct is not None else _litellm()
        route = self.route
        kwargs = self._route_kwargs
        api_base = kwargs.get("api_base")
        try:
            if litellm is not None:
                litellm.get_llm_provider(
                    model=route.litellm_model,
                    api_base=api_base if isinstance(api_base, str) else None,
                )
        except Exception as exc:
            raise ModelPreflightError(
                not_a_model_id(route.model_path, _one_line(exc, self._secrets))
            ) from None
        try:
            # By the route the rows' calls take, as the SDK's preflight does; our own
            # embedded model need not write a whole answer to prove it runs.
            tokens = 1 if route.model_path == EMBEDDED_MODEL_PATH else 256
            await self._complete(
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}
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
        if litellm is None:  # checked directly: the variable LiteLLM's openai/ reads
            return missing_keys(self.route)
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
                            None, offline_judge if self.offline else _resolve_judge, model
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
        # A direct bridge imports LiteLLM only for what needs it; a replayed answer needs
        # none (~3 s of import).
        if not self._rows_direct and not self.offline:
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
            if _out_of_descriptors(exc):
                detail = f"the osmosis bridge ran out of file descriptors: {_one_line(exc)}"
                self.exhausted(detail)
                return _json_error(503, detail)
            self.errors += 1
            status, kind, detail = self._failure(exc, target)
            logger.warning("osmosis bridge: model call failed: %s", detail)
            return _json_error(status, detail, kind=kind)
        usage = _usage(response)
        self._account(rollout_id, usage, _call_metrics(response, usage), target)
        return web.Response(
            body=json.dumps(_payload(response, echo, usage, stream=False)).encode(),
            content_type="application/json",
        )

    async def _complete(
        self, body: dict[str, Any], rollout_id: str | None = None, target: _Target | None = None
    ) -> Any:
        """One model call: through the model-call cache (model/cache.py) when the rollout
        has one (looked up before the provider, stored after), else straight to it."""
        target = target or self._main
        with self._lock:
            cached = self._cached.get(rollout_id or "")
        if cached is None:
            return await self._upstream(body, rollout_id, target)
        model = target.route.model_path
        response, hit = await cached.serve(
            model, body, lambda: self._upstream(body, rollout_id, target), self._secrets
        )
        if hit and not target.judge and rollout_id is not None:
            self._remember_reasoning(response, rollout_id)
        return response

    async def _upstream(
        self, body: dict[str, Any], rollout_id: str | None = None, target: _Target | None = None
    ) -> Any:
        """One provider call for a chat body, made the way osmosis-ai 0.3.8's bridge makes it."""
        target = target or self._main
        route = target.route
        responses = False
        if not target.judge:
            body = self._with_reasoning(body, rollout_id)
        direct = self._direct_client(body, rollout_id, target)
        request: Callable[[], Awaitable[Any]]
        if direct is not None:
            request = functools.partial(direct.complete, body)
        else:
            await _litellm_imported()
            litellm = _litellm()
            if target.judge:
                call = {**_judge_call(body), **route.kwargs}
            else:
                responses = _uses_responses_api(litellm, route)
                call = (
                    _responses_call(body, route) if responses else _chat_call(litellm, body, route)
                )
            send = litellm.aresponses if responses else litellm.acompletion
            request = functools.partial(
                send, model=route.litellm_model, **{**call, "max_retries": 0}
            )
        try:
            if direct is not None and rollout_id is None:
                # The preflight's direct check is one request, never retried (contract D71).
                raw = await request()
            else:
                # Retries are the back-off's (ratelimit.py), not the provider client's: every
                # 429 is paced and counted. A 429 is retried while the rollout is open; its
                # own budget, not the rate limit, decides when it gives up.
                raw = await target.backoff.call(
                    request,
                    retry_rate_limit=lambda: rollout_id is not None and self._open(rollout_id),
                    on_rate_limit=lambda: self._count_rate_limit(rollout_id),
                )
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            if rollout_id is not None and isinstance(status, int) and status >= 500:
                with self._lock:
                    self._provider_errors[rollout_id] = self._provider_errors.get(rollout_id, 0) + 1
            raise
        response = _from_responses(raw) if responses else raw
        if not _field(response, "choices", None):
            raise RuntimeError("the model returned no choices")
        if not target.judge and rollout_id is not None:
            self._remember_reasoning(response, rollout_id)
        return response

    def _direct_client(
        self, body: dict[str, Any], rollout_id: str | None, target: _Target
    ) -> DirectClient | None:
        """The direct client where this call may skip LiteLLM, else None (LiteLLM calls).

        The preflight (no rollout) of an OpenAI-compatible route, and the rows of
        ``osmosis/embedded`` or of an endpoint over plain HTTP, unless a rollout has since
        configured LiteLLM in code; a call only when its body is one LiteLLM sends unchanged.
        """
        if self._direct is None or target is not self._main:
            return None
        if rollout_id is not None and (not self._rows_direct or litellm_configured()):
            return None
        return self._direct if is_plain(body) else None

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

    def _account(
        self,
        rollout_id: str,
        usage: dict[str, int] | None,
        call: dict[str, int],
        target: _Target | None = None,
    ) -> None:
        self.calls += 1
        with self._lock:
            calls = self._calls.get(rollout_id)
            if calls is not None:
                calls.append(call)
        if usage is None:
            with self._lock:
                if rollout_id in self._costs:
                    self._unpriced.add(rollout_id)
            return
        total = usage["total_tokens"]
        self.tokens_total += total
        model = (target or self._main).route.litellm_model
        cost = cost_usd(model, usage["prompt_tokens"], usage["completion_tokens"])
        with self._lock:
            if rollout_id in self._tokens:
                self._tokens[rollout_id] = (self._tokens[rollout_id] or 0) + total
            if rollout_id in self._costs:
                if cost is None:
                    self._unpriced.add(rollout_id)
                else:
                    self._costs[rollout_id] = (self._costs[rollout_id] or 0.0) + cost

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
            if _out_of_descriptors(exc):
                self.exhausted(f"the osmosis bridge ran out of file descriptors: {_one_line(exc)}")
            else:
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
            self._account(rollout_id, usage, _call_metrics(result, usage), target)
            chunk = json.dumps(_payload(result, echo, usage, stream=True))
            await response.write(f"data: {chunk}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _read_body(request: web.Request) -> bytes:
    """The body, refused from its declared length before reading when it is too large."""
    from aiohttp import web

    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, request.content_length or 0)
    try:
        return await asyncio.wait_for(request.read(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise _SlowBody from None


_Protocol = TypeVar("_Protocol", bound=asyncio.BaseProtocol)


async def _advertise_keep_alive(request: web.Request, response: web.StreamResponse) -> None:
    if response.keep_alive is not False:
        response.headers.setdefault("Keep-Alive", f"timeout={KEEP_ALIVE_ADVERTISED_S}")


def _bytes_waiting(transport: Any) -> bool:
    """Whether a connection's socket holds bytes (or its end) the loop has not read yet."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    try:
        fd = sock.fileno()
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(0))
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False


@functools.cache
def _idle_only_handler() -> type:
    from aiohttp.web_protocol import RequestHandler

    class IdleOnlyHandler(RequestHandler):
        """aiohttp's handler, except that its keep-alive timer never closes a connection
        whose next request waits unread in the socket (sent just as the timer fired)."""

        __slots__ = ()

        def _process_keepalive(self) -> None:
            if _bytes_waiting(self.transport):
                # Looked at again in a second: by then the request is being served (the
                # timer then closes nothing), or it is a client too slow to finish one.
                self._keepalive_handle = asyncio.get_running_loop().call_later(
                    1.0, self._process_keepalive
                )
                return
            super()._process_keepalive()

    return IdleOnlyHandler


class _Listener(socket.socket):
    """The bridge's listening socket. It holds each connection the loop accepts until the
    bridge's protocol factory takes it (`take`): one accepted just before the bridge closed
    is closed by the bridge (`drop_untaken`; the factory then refuses it), never made into a
    transport of a closed server, whose collection raised in ``Server._wakeup`` on Python
    3.13.0 (CPython gh-109564). A loop that accepts without ``accept()`` (uvloop) holds none.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._untaken: collections.deque[socket.socket] = collections.deque()

    def accept(self) -> tuple[socket.socket, Any]:
        conn, address = super().accept()
        self._untaken.append(conn)
        return conn, address

    def take(self) -> None:
        """The factory took the oldest connection (asyncio makes them in accept order)."""
        if self._untaken:
            self._untaken.popleft()

    def drop_untaken(self) -> None:
        while self._untaken:
            self._untaken.popleft().close()


def _tracked_handler(open_connections: dict[Any, Any]) -> type | None:
    """An ``IdleOnlyHandler`` that notes its connection in *open_connections* while it is
    open (one class per bridge); None where aiohttp's handler cannot be subclassed."""
    try:
        base = _idle_only_handler()
    except ImportError:
        return None

    class TrackedHandler(base):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            open_connections[self] = transport
            super().connection_made(transport)

        def connection_lost(self, exc: BaseException | None) -> None:
            open_connections.pop(self, None)
            super().connection_lost(exc)

    return TrackedHandler


def _as_class(handler: _Protocol, cls: type | None) -> _Protocol:
    """*handler* as an instance of *cls* (a subclass of its own); as it is where aiohttp's
    layout differs."""
    if cls is not None:
        try:
            handler.__class__ = cls
        except TypeError:
            pass
    return handler


class _SlowBody(Exception):
    """The client did not send its body within BODY_TIMEOUT_S (answered 408)."""


class _Busy(asyncio.Protocol):
    """A connection over `Bridge.max_connections`: one 503, then closed."""

    def __init__(self, open_connections: dict[Any, Any]) -> None:
        self._connections = open_connections

    def connection_lost(self, exc: BaseException | None) -> None:
        self._connections.pop(self, None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._connections[self] = transport
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


def _error_status(exc: BaseException) -> int:
    """The status a rollout sees: a provider's 4xx as it came (a refused body is 400), else 502."""
    status = 400 if isinstance(exc, _BadRequest) else getattr(exc, "status_code", None)
    for link in _chain(exc):
        response = getattr(link, "response", None)
        if type(link).__name__ == "HTTPStatusError" and response is not None:
            status = getattr(response, "status_code", status)
            break
    return status if isinstance(status, int) and 400 <= status < 500 else 502


#: On every error the bridge answers: it has already retried what was worth retrying
#: (ratelimit.py), so a client that retries too (the OpenAI SDK's ``max_retries=2`` on a
#: 5xx) would multiply one provider failure into nine provider requests. The OpenAI and
#: Anthropic SDKs honour this header.
NO_RETRY_HEADERS = {"x-should-retry": "false"}


def _json_error(status: int, detail: str, *, kind: str | None = None) -> web.Response:
    from aiohttp import web

    if kind is None:
        kind = "bridge_error" if status >= 500 else "invalid_request_error"
    body = {"detail": detail, "error": {"message": detail, "type": kind, "code": status}}
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=NO_RETRY_HEADERS,
    )
