"""A deterministic OpenAI-compatible chat server on loopback, for tests and benchmarks.

Real HTTP, real SSE, real usage numbers: the plugin's tests drive LiteLLM's own
`openai/` provider against it instead of mocking LiteLLM, so they exercise the
code path a user's run takes. Everything the server answers is computed from the
request (arithmetic rule, scripted substrings, echo), never recorded.

In-process: ``server = ModelServer(); server.start()`` (a daemon thread with its
own loop) or ``await server.start_async()`` on a loop you own.
As a process: ``python tests/model_server.py --port 0 --delay 0.2`` prints its base
URL (``http://127.0.0.1:PORT/v1``) on the first stdout line and serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from aiohttp import web

__all__ = ["ModelServer", "ToolRule", "answer_for", "count_tokens"]

_ARITH = re.compile(
    r"what\s+is\s+(-?\d+(?:\.\d+)?)\s*([-+*/x×])\s*(-?\d+(?:\.\d+)?)\s*\??", re.IGNORECASE
)
_WORD = re.compile(r"\S+")


def count_tokens(text: str) -> int:
    """Deterministic stand-in for a tokenizer: whitespace-separated words."""
    return len(_WORD.findall(text))


def _text_of(content: Any) -> str:
    """Flatten OpenAI message content (a string or a list of parts) to text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return " ".join(parts)
    return json.dumps(content)


def _arith(text: str) -> str | None:
    """Answer "What is A + B?" style questions exactly; None when there is none."""
    match = _ARITH.search(text)
    if match is None:
        return None
    a, op, b = Fraction(match.group(1)), match.group(2), Fraction(match.group(3))
    if op == "+":
        value = a + b
    elif op == "-":
        value = a - b
    elif op in "*x×":
        value = a * b
    else:
        if b == 0:
            return "undefined"
        value = a / b
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6g}"


def answer_for(last_user: str, replies: dict[str, str] | None = None) -> str:
    """The default rule: scripted substring first, then arithmetic, then an echo."""
    for needle, reply in (replies or {}).items():
        if needle in last_user:
            return reply
    arith = _arith(last_user)
    if arith is not None:
        return arith
    return f"echo: {last_user}"


@dataclass
class ToolRule:
    """When the last user message contains `trigger` and the request offers tools,
    answer with a call to `name` (it must be one of the offered tools) with `arguments`."""

    trigger: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Failure:
    status: int
    remaining: int
    retry_after: float | None
    message: str


class ModelServer:
    """OpenAI-compatible ``POST /v1/chat/completions`` and ``/v1/responses`` on 127.0.0.1.

    Script it by assigning attributes (safe from any thread between requests):
    `replies` (substring -> reply), `tool_rules`, `tool_answer` (format string with
    `{result}` used after a tool result), `delay` (seconds for every request) and
    `delays` (substring -> seconds), `gather` (hold requests until that many are in
    flight), `hold` (hold requests until the test clears it), `rate_limit` (a provider's
    requests/s limit, see `limit_rate`), and call `fail_next()` to inject errors.
    Observe it through `requests_total`, `rate_limited` (429s the rate limit answered), `in_flight`, `peak_in_flight`, `bodies` (chat),
    `requests` (every call with its API path) and `answered` (per request, in order: the
    last user message and the `time.monotonic()` at which its answer was about to be sent;
    the clock is system-wide, so comparable with stamps taken in other processes).
    """

    def __init__(self, *, delay: float = 0.0, port: int = 0) -> None:
        self.delay = delay
        self.delays: dict[str, float] = {}
        self.replies: dict[str, str] = {}
        self.tool_rules: list[ToolRule] = []
        self.tool_answer = "{result}"
        self.gather = 0
        """When > 1, each request whose last user message contains `gather_on` waits until
        this many such are in flight at once (then all go on), or `gather_timeout` seconds:
        a peak it reaches is reached for sure, not by a race. The rate limit sees them
        after the wait, all at once, however slowly a loaded machine sent them."""
        self.gather_on = ""
        self.gather_timeout = 30.0
        self.hold = ""
        """When set, each request whose last user message contains it waits (counted in
        `holding`) until `hold` is changed or cleared: the test decides when it is answered."""
        self.holding = 0
        self.fail_on: dict[str, tuple[int, int]] = {}
        """Substring -> (HTTP status, count): the next `count` requests whose last user
        message contains it are answered with that status (one row's provider errors)."""
        self._stopping = False
        self._gathering = 0
        self._gathered: asyncio.Event | None = None
        self.requests_total = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.bodies: list[dict[str, Any]] = []
        """Chat completions request bodies, in arrival order."""
        self.requests: list[tuple[str, dict[str, Any]]] = []
        """Every model request as (API path, body): ``/v1/chat/completions`` or ``/v1/responses``."""
        self.answered: list[tuple[str, float]] = []
        self._failures: list[_Failure] = []
        self.rate_limit = 0.0
        """When > 0, a token bucket of this many requests/s (see `limit_rate`)."""
        self.rate_burst = 0.0
        self.rate_limited = 0
        """Requests the rate limit answered 429 (with ``Retry-After``)."""
        self._bucket = 0.0
        self._bucket_at = 0.0
        self._first_at: float | None = None
        self._last_at = 0.0
        self._lock = threading.Lock()
        self._port_wanted = port
        self.ssl_context: Any = None
        """An ``ssl.SSLContext`` to serve https with (set before starting): a provider's stand-in."""
        self._port = 0
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._seq = 0

    # ----------------------------------------------------------------- scripting

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """Base URL the way OpenAI clients want it (they append /chat/completions)."""
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self._port}/v1"

    def env(self) -> dict[str, str]:
        """Environment that points LiteLLM's `openai/` provider (and the OpenAI SDK) here."""
        return {
            "OPENAI_API_BASE": self.url,
            "OPENAI_BASE_URL": self.url,
            "OPENAI_API_KEY": "sk-test-model-server",
        }

    def fail_next(
        self,
        status: int,
        count: int = 1,
        *,
        retry_after: float | None = None,
        message: str | None = None,
    ) -> None:
        """Answer the next `count` requests with HTTP `status` (429 gets Retry-After)."""
        if status == 429 and retry_after is None:
            retry_after = 0
        text = message or f"injected error {status}"
        with self._lock:
            self._failures.append(_Failure(status, count, retry_after, text))

    def limit_rate(self, per_second: float, *, burst: float | None = None) -> None:
        """Behave like a rate-limited provider: a token bucket refilled at `per_second`
        holding `burst` requests (default one second's worth, full at first); a request
        that finds it empty is answered 429 at once, with ``Retry-After`` saying when the
        next one would be accepted. ``limit_rate(0)`` turns it off."""
        with self._lock:
            self.rate_limit = float(per_second)
            self.rate_burst = float(burst if burst is not None else per_second)
            self._bucket = self.rate_burst
            self._bucket_at = time.monotonic()
            self.rate_limited = 0

    def _admit(self) -> float | None:
        """None when the rate limit lets this request in, else the seconds to wait."""
        with self._lock:
            if self.rate_limit <= 0:
                return None
            now = time.monotonic()
            self._bucket = min(
                self.rate_burst, self._bucket + (now - self._bucket_at) * self.rate_limit
            )
            self._bucket_at = now
            if self._bucket >= 1.0:
                self._bucket -= 1.0
                return None
            self.rate_limited += 1
            return (1.0 - self._bucket) / self.rate_limit

    def reset(self) -> None:
        """Forget the script and the counters (the listener stays up)."""
        with self._lock:
            self.delay = 0.0
            self.delays = {}
            self.replies = {}
            self.tool_rules = []
            self.tool_answer = "{result}"
            self.gather = 0
            self.gather_on = ""
            self._gathered = None
            self.hold = ""
            self.requests_total = 0
            self.peak_in_flight = self.in_flight
            self.bodies = []
            self.requests = []
            self.answered = []
            self._failures = []
            self.fail_on = {}
            self.rate_limit = 0.0
            self.rate_limited = 0

    def configure(self, config: dict[str, Any]) -> None:
        """Apply a JSON-able script (the `--config` file of the standalone server)."""
        self.delay = float(config.get("delay", self.delay))
        self.delays = {str(k): float(v) for k, v in config.get("delays", {}).items()}
        self.replies = {str(k): str(v) for k, v in config.get("replies", {}).items()}
        self.tool_rules = [
            ToolRule(str(r["trigger"]), str(r["name"]), dict(r.get("arguments", {})))
            for r in config.get("tool_rules", [])
        ]
        self.tool_answer = str(config.get("tool_answer", self.tool_answer))
        if config.get("rate_limit"):
            self.limit_rate(float(config["rate_limit"]), burst=config.get("rate_burst"))
        for failure in config.get("fail_next", []):
            self.fail_next(
                int(failure["status"]),
                int(failure.get("count", 1)),
                retry_after=failure.get("retry_after"),
                message=failure.get("message"),
            )

    # ----------------------------------------------------------------- lifecycle

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/stats", self._stats)
        return app

    async def start_async(self) -> None:
        """Listen on the running loop (used by the thread mode and the CLI)."""
        runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(
            runner, "127.0.0.1", self._port_wanted, backlog=1024, ssl_context=self.ssl_context
        )
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def stop_async(self) -> None:
        self._stopping = True  # held requests let go: cleanup waits for every handler
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> ModelServer:
        """Serve from `loop` (running in another thread) or from a fresh daemon thread."""
        if loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            self._thread = threading.Thread(target=run, name="model-server", daemon=True)
            self._thread.start()
            ready.wait()
        self._loop = loop
        asyncio.run_coroutine_threadsafe(self.start_async(), loop).result(timeout=30)
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop_async(), loop).result(timeout=30)
        if self._thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=30)
            loop.close()
            self._thread = None
        self._loop = None

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- handlers

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "model-server", "object": "model"}]}
        )

    async def _stats(self, request: web.Request) -> web.Response:
        """Counters for a benchmark that runs this server as its own process."""
        with self._lock:
            counts = {
                "requests_total": self.requests_total,
                "rate_limited": self.rate_limited,
                "peak_in_flight": self.peak_in_flight,
                # From the first request's arrival to the last's: the run's model phase.
                "span_s": self._last_at - self._first_at if self._first_at is not None else 0.0,
            }
        return web.json_response(counts)

    def _take_failure(self) -> _Failure | None:
        with self._lock:
            while self._failures:
                failure = self._failures[0]
                if failure.remaining <= 0:
                    self._failures.pop(0)
                    continue
                failure.remaining -= 1
                return failure
        return None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, self._answer)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's Responses API (non-streaming), answered by the same rules as chat."""
        return await self._serve(request, self._answer_responses)

    async def _serve(self, request: web.Request, answer: Any) -> web.StreamResponse:
        """Count, parse, record, delay, inject failures, then let `answer` reply."""
        with self._lock:
            self.requests_total += 1
            self._last_at = time.monotonic()
            if self._first_at is None:
                self._first_at = self._last_at
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            self._seq += 1
            seq = self._seq
        try:
            try:
                body = await request.json()
            except ValueError:
                return _error(400, "request body is not JSON")
            chat = answer == self._answer
            messages = _as_messages(body) if isinstance(body, dict) else None
            if not isinstance(messages, list):
                wanted = "a 'messages' list" if chat else "an 'input' string or list"
                return _error(400, f"body must be an object with {wanted}")
            path = "/v1/chat/completions" if chat else "/v1/responses"
            last_user = next(
                (
                    _text_of(m.get("content"))
                    for m in reversed(messages)
                    if isinstance(m, dict) and m.get("role") == "user"
                ),
                "",
            )
            if self.gather > 1 and self.gather_on in last_user:
                await self._gather()  # before the rate limit: the wave arrives at once
            wait = self._admit()
            if wait is not None:  # a provider refuses at once, before any work
                return _error(429, "rate limit exceeded", {"Retry-After": f"{wait:.3f}"})
            self.requests.append((path, body))
            if chat:
                self.bodies.append(body)
            if self.hold and self.hold in last_user:
                with self._lock:
                    self.holding += 1
                try:
                    while self.hold and self.hold in last_user and not self._stopping:
                        await asyncio.sleep(0.02)
                finally:
                    with self._lock:
                        self.holding -= 1
            delay = self.delay
            for needle, seconds in self.delays.items():
                if needle in last_user:
                    delay = seconds
                    break
            if delay > 0:
                await asyncio.sleep(delay)
            self.answered.append((last_user, time.monotonic()))
            for needle, (status, count) in list(self.fail_on.items()):
                if needle in last_user and count > 0:
                    with self._lock:
                        self.fail_on[needle] = (status, count - 1)
                    return _error(status, f"injected error {status} for {needle!r}")
            failure = self._take_failure()
            if failure is not None:
                headers = {}
                if failure.retry_after is not None:
                    headers["Retry-After"] = f"{failure.retry_after:g}"
                return _error(failure.status, failure.message, headers)
            result: web.StreamResponse = await answer(request, body, messages, last_user, seq)
            return result
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _gather(self) -> None:
        if self._gathered is None:
            self._gathered = asyncio.Event()
        self._gathering += 1
        try:
            if self._gathering >= self.gather:
                self._gathered.set()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._gathered.wait(), self.gather_timeout)
        finally:
            self._gathering -= 1

    def _reply(
        self, body: dict[str, Any], messages: list[Any], last_user: str, seq: int, limit: Any
    ) -> tuple[str | None, list[dict[str, Any]] | None, str, dict[str, int]]:
        """(content, tool calls, finish reason, usage) for a conversation, by the script."""
        content: str | None
        tool_calls: list[dict[str, Any]] | None = None
        last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
        offered = set()
        for tool in body.get("tools") or []:
            if isinstance(tool, dict):
                function = tool.get("function")
                offered.add(
                    function.get("name") if isinstance(function, dict) else tool.get("name")
                )
        rule = next(
            (r for r in self.tool_rules if r.trigger in last_user and r.name in offered), None
        )
        if last.get("role") == "tool":
            content = self.tool_answer.format(result=_text_of(last.get("content")))
        elif rule is not None and body.get("tool_choice") != "none":
            content = None
            tool_calls = [
                {
                    "id": f"call_{seq:06d}",
                    "type": "function",
                    "function": {"name": rule.name, "arguments": json.dumps(rule.arguments)},
                }
            ]
        else:
            content = answer_for(last_user, self.replies)
        finish_reason = "tool_calls" if tool_calls else "stop"
        if content is not None and isinstance(limit, int) and limit > 0:
            words = content.split(" ")
            if len(words) > limit:
                content = " ".join(words[:limit])
                finish_reason = "length"
        prompt_text = " ".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict))
        completion_text = content if content is not None else json.dumps(tool_calls)
        prompt_tokens = max(1, count_tokens(prompt_text))
        completion_tokens = max(1, count_tokens(completion_text))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        return content, tool_calls, finish_reason, usage

    async def _answer(
        self,
        request: web.Request,
        body: dict[str, Any],
        messages: list[Any],
        last_user: str,
        seq: int,
    ) -> web.StreamResponse:
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        content, tool_calls, finish_reason, usage = self._reply(
            body, messages, last_user, seq, limit
        )
        model = str(body.get("model") or "model-server")
        cid = f"chatcmpl-{seq:08d}"
        created = int(time.time())
        if body.get("stream"):
            return await _stream(
                request, cid, created, model, content, tool_calls, finish_reason, usage
            )
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return web.json_response(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
                "usage": usage,
            }
        )

    async def _answer_responses(
        self,
        request: web.Request,
        body: dict[str, Any],
        messages: list[Any],
        last_user: str,
        seq: int,
    ) -> web.StreamResponse:
        content, tool_calls, finish_reason, usage = self._reply(
            body, messages, last_user, seq, body.get("max_output_tokens")
        )
        output: list[dict[str, Any]] = []
        if content is not None:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{seq:08d}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": content, "annotations": []}],
                }
            )
        for call in tool_calls or []:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{seq:08d}",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                    "status": "completed",
                }
            )
        incomplete = finish_reason == "length"
        return web.json_response(
            {
                "id": f"resp_{seq:08d}",
                "object": "response",
                "created_at": int(time.time()),
                "status": "incomplete" if incomplete else "completed",
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "error": None,
                "model": str(body.get("model") or "model-server"),
                "output": output,
                "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
                "tool_choice": body.get("tool_choice", "auto"),
                "tools": body.get("tools") or [],
                "usage": {
                    "input_tokens": usage["prompt_tokens"],
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": usage["completion_tokens"],
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": usage["total_tokens"],
                },
            }
        )


def _as_messages(body: dict[str, Any]) -> list[Any] | None:
    """Chat messages of a chat body, or of a Responses body's ``input`` items."""
    if "messages" in body:
        chat = body["messages"]
        return chat if isinstance(chat, list) else None
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        return None
    messages: list[Any] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call_output":
            messages.append({"role": "tool", "content": item.get("output")})
        elif item.get("type") == "function_call":
            messages.append({"role": "assistant", "content": None})
        elif "role" in item:
            messages.append({"role": item["role"], "content": item.get("content")})
    return messages


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    kind = "rate_limit_error" if status == 429 else "invalid_request_error"
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": status}},
        status=status,
        headers=headers,
    )


async def _stream(
    request: web.Request,
    cid: str,
    created: int,
    model: str,
    content: str | None,
    tool_calls: list[dict[str, Any]] | None,
    finish_reason: str,
    usage: dict[str, int],
) -> web.StreamResponse:
    """Word-per-chunk SSE; the last chunk carries finish_reason and usage."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)

    def chunk(delta: dict[str, Any], finish: str | None, with_usage: bool = False) -> bytes:
        payload: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if with_usage:
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n".encode()

    await response.write(chunk({"role": "assistant", "content": ""}, None))
    if content:
        for i, word in enumerate(content.split(" ")):
            await response.write(chunk({"content": word if i == 0 else " " + word}, None))
    if tool_calls:
        indexed = [{"index": i, **call} for i, call in enumerate(tool_calls)]
        await response.write(chunk({"tool_calls": indexed}, None))
    await response.write(chunk({}, finish_reason, with_usage=True))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument(
        "--reply",
        action="append",
        default=[],
        metavar="SUBSTRING=REPLY",
        help="answer REPLY when the last user message contains SUBSTRING",
    )
    parser.add_argument(
        "--rate-limit", type=float, default=0.0, help="requests/s beyond which it answers 429"
    )
    parser.add_argument("--config", help="JSON file: delay, delays, replies, tool_rules, ...")
    parser.add_argument(
        "--tls", nargs=2, metavar=("CERT", "KEY"), help="serve https with this certificate"
    )
    args = parser.parse_args(argv)

    server = ModelServer(delay=args.delay, port=args.port)
    if args.tls:
        import ssl

        server.ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.ssl_context.load_cert_chain(*args.tls)
    if args.config:
        with open(args.config, encoding="utf-8") as fh:
            server.configure(json.load(fh))
    if args.rate_limit > 0:
        server.limit_rate(args.rate_limit)
    for item in args.reply:
        needle, sep, reply = item.partition("=")
        if not sep:
            parser.error(f"--reply expects SUBSTRING=REPLY, got {item!r}")
        server.replies[needle] = reply

    async def serve() -> None:
        await server.start_async()
        print(server.url, flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
