"""The bridge holds the user's model key on a loopback port: what a local process may not do.

Every test here is an abuse case (issue 14 section 2): a caller without the rollout's
token, a token holder sending what would exhaust or misuse the bridge. Raw sockets show
what the server does before (or instead of) reading a body.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from model_server import ModelServer
from workspaces import calc_rows, write_workspace

import pytest_osmosis.model.bridge as bridge_module
from pytest_osmosis.model.bridge import JUDGE_MODEL_HEADER, MAX_BODY_BYTES, Bridge
from pytest_osmosis.model.routes import JUDGE_MODEL_NOT_ALLOWED, ModelRoute

MODEL = "openai/osmosis-test"
PATH = "/v1/rollouts/{}/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Harness:
    def __init__(self, loop: Any, bridge: Bridge) -> None:
        self.loop = loop
        self.bridge = bridge

    def run(self, coro: Any) -> Any:
        return self.loop.run(coro)

    @property
    def port(self) -> int:
        return int(self.bridge.base_url.rsplit(":", 1)[1])

    def post(
        self, rollout_id: str, body: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, str]:
        import aiohttp

        async def go() -> tuple[int, str]:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            async with aiohttp.ClientSession() as session:
                async with session.post(
                    self.bridge.base_url + PATH.format(rollout_id), data=data, headers=headers or {}
                ) as resp:
                    return resp.status, await resp.text()

        result: tuple[int, str] = self.run(go())
        return result

    def raw(self, head: str, *, until: bytes = b"\r\n\r\n") -> bytes:
        """Send `head` on a fresh socket; what the server answers, up to `until` or EOF."""

        async def go() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            try:
                writer.write(head.encode())
                await writer.drain()
                received = b""
                while until not in received:
                    chunk = await asyncio.wait_for(reader.read(65536), 120)
                    if not chunk:
                        break
                    received += chunk
                return received
            finally:
                writer.close()

        result: bytes = self.run(go())
        return result


@pytest.fixture
def harness(model_loop: Any, model_server: ModelServer) -> Iterator[Harness]:
    route = ModelRoute(MODEL, MODEL, {"api_base": model_server.url, "api_key": "sk-test-abuse"})
    bridge = Bridge(route)
    model_loop.run(bridge.start())
    yield Harness(model_loop, bridge)
    model_loop.run(bridge.close())


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _head(rollout_id: str, key: str, *extra: str) -> str:
    lines = [
        f"POST {PATH.format(rollout_id)} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Authorization: Bearer {key}",
        "Content-Type: application/json",
        *extra,
    ]
    return "\r\n".join(lines) + "\r\n\r\n"


# ------------------------------------------------------------------ tokens


def test_each_rollout_has_its_own_unguessable_token(harness: Harness) -> None:
    keys = {harness.bridge.open_rollout(f"r{n}")[1] for n in range(50)}
    assert len(keys) == 50
    assert all(len(key) >= 40 for key in keys)  # 32 random bytes, url-safe
    # Asking again for an open rollout gives the same token.
    assert harness.bridge.open_rollout("r0")[1] in keys


def test_another_rollouts_token_is_refused(harness: Harness, model_server: ModelServer) -> None:
    _, mine = harness.bridge.open_rollout("mine")
    _, theirs = harness.bridge.open_rollout("theirs")
    status, text = harness.post("mine", BODY, _auth(theirs))
    assert status == 401 and "bearer" in json.loads(text)["detail"]
    assert model_server.requests_total == 0
    assert harness.post("mine", BODY, _auth(mine))[0] == 200


def test_a_closed_rollouts_token_stops_working(harness: Harness, model_server: ModelServer) -> None:
    _, done = harness.bridge.open_rollout("done")
    _, live = harness.bridge.open_rollout("live")
    assert harness.post("done", BODY, _auth(done))[0] == 200
    harness.bridge.close_rollout("done")
    # Neither on its own URL nor on a rollout still running.
    assert harness.post("done", BODY, _auth(done))[0] == 404
    assert harness.post("live", BODY, _auth(done))[0] == 401
    assert model_server.requests_total == 1
    assert harness.post("live", BODY, _auth(live))[0] == 200


def test_a_wrong_bearer_is_refused_before_the_body_is_sent(harness: Harness) -> None:
    """``Expect: 100-continue`` with a wrong token: 401 at once, never "100 Continue"."""
    harness.bridge.open_rollout("r")
    answer = harness.raw(_head("r", "wrong", "Content-Length: 100000000", "Expect: 100-continue"))
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def test_a_wrong_bearer_is_answered_without_waiting_for_the_body(harness: Harness) -> None:
    """A declared 100 MB body that never comes: the 401 does not wait for it."""
    harness.bridge.open_rollout("r")
    answer = harness.raw(_head("r", "wrong", "Content-Length: 100000000"))
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


# ------------------------------------------------------------------ bodies


def test_a_body_over_the_limit_is_a_one_line_413(
    harness: Harness, model_server: ModelServer
) -> None:
    _, key = harness.bridge.open_rollout("big")
    text = "x" * (MAX_BODY_BYTES + 1)
    status, answer = harness.post(
        "big", {**BODY, "messages": [{"role": "user", "content": text}]}, _auth(key)
    )
    detail = json.loads(answer)["detail"]
    assert status == 413 and detail == "request body larger than the bridge's limit of 32 MiB"
    assert model_server.requests_total == 0
    assert harness.post("big", BODY, _auth(key))[0] == 200


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(harness: Harness) -> None:
    _, key = harness.bridge.open_rollout("r")
    length = f"Content-Length: {250 * 2**20}"
    assert harness.raw(_head("r", key, length)).startswith(b"HTTP/1.1 413")
    assert harness.raw(_head("r", key, length, "Expect: 100-continue")).startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 100_000,  # json.loads itself runs out of stack
        json.dumps({**BODY, "metadata": json.loads("[" * 300 + "]" * 300)}),  # parses, too deep
    ],
    ids=["unparseable", "parseable"],
)
def test_deeply_nested_json_is_a_one_line_400(
    harness: Harness, model_server: ModelServer, raw: str
) -> None:
    _, key = harness.bridge.open_rollout("deep")
    status, answer = harness.post("deep", raw, _auth(key))
    detail = json.loads(answer)["detail"]
    assert status == 400, answer[:300]
    assert detail == "bad chat completions request: request body nests deeper than 200 levels"
    assert model_server.requests_total == 0


# ------------------------------------------------------------------ judge models


def test_a_judge_model_the_session_did_not_declare_is_a_403_naming_it(
    harness: Harness, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in model_server.env().items():
        monkeypatch.setenv(name, value)
    harness.bridge.allow_judge_models(["openai/declared-judge"])
    _, key = harness.bridge.open_rollout("j")

    def ask(judge: str) -> tuple[int, Any]:
        headers = {**_auth(key), JUDGE_MODEL_HEADER: judge}
        status, text = harness.post("j", BODY, headers)
        return status, json.loads(text)

    status, answer = ask("openai/gpt-expensive")
    assert status == 403 and answer["error"]["type"] == JUDGE_MODEL_NOT_ALLOWED
    assert answer["detail"] == (
        "judge model 'openai/gpt-expensive' is not declared by this session: "
        "name it as a RubricGrader's judge_model or in ini osmosis_judge_models"
    )
    assert model_server.requests_total == 0
    # Declared judges and the run's own model are served.
    assert ask("openai/declared-judge")[0] == 200
    assert ask(MODEL)[0] == 200
    assert [body["model"] for body in model_server.bodies] == ["declared-judge", "osmosis-test"]


# ------------------------------------------------------------------ connections


async def _idle(port: int, count: int, first: bytes = b"") -> list[Any]:
    """`count` connections that send `first` (or nothing) and then wait."""
    opened = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if first:
            writer.write(first)
        opened.append((reader, writer))
    return opened


async def _closed_by_server(opened: list[Any]) -> list[bytes]:
    """What each connection received before the server closed it (generous bound: it must)."""

    async def until_eof(reader: asyncio.StreamReader) -> bytes:
        return await asyncio.wait_for(reader.read(), 120)

    try:
        return list(await asyncio.gather(*(until_eof(reader) for reader, _ in opened)))
    finally:
        for _, writer in opened:
            writer.close()


def test_idle_connections_are_closed_and_do_not_stop_a_legit_call(
    harness: Harness, model_server: ModelServer
) -> None:
    _, key = harness.bridge.open_rollout("legit")
    opened = harness.run(_idle(harness.port, 200))
    assert harness.post("legit", BODY, _auth(key))[0] == 200
    assert harness.run(_closed_by_server(opened)) == [b""] * 200
    assert harness.post("legit", BODY, _auth(key))[0] == 200


def test_a_client_sending_its_headers_slowly_is_closed(harness: Harness) -> None:
    harness.bridge.open_rollout("r")
    partial = f"POST {PATH.format('r')} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthori".encode()
    opened = harness.run(_idle(harness.port, 20, partial))
    assert harness.run(_closed_by_server(opened)) == [b""] * 20


def test_a_body_that_never_arrives_is_a_408(
    harness: Harness, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bridge_module, "BODY_TIMEOUT_S", 0.5)  # the client is the slow one
    _, key = harness.bridge.open_rollout("r")
    opened = harness.run(
        _idle(harness.port, 1, (_head("r", key, "Content-Length: 1000") + "{").encode())
    )
    (answer,) = harness.run(_closed_by_server(opened))
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request body not received within 0.5 s" in answer
    assert model_server.requests_total == 0


def test_connections_over_the_bound_are_a_503_and_closed(
    harness: Harness, model_server: ModelServer
) -> None:
    harness.bridge.max_connections = 8
    _, key = harness.bridge.open_rollout("r")
    opened = harness.run(_idle(harness.port, 8))

    async def registered() -> None:
        # The server counts a connection once its loop has accepted it.
        runner = harness.bridge._runner
        assert runner is not None and runner.server is not None
        while len(runner.server.connections) < 8:
            await asyncio.sleep(0.01)

    harness.run(asyncio.wait_for(registered(), 120))
    (busy,) = harness.run(_closed_by_server(harness.run(_idle(harness.port, 1))))
    assert busy.startswith(b"HTTP/1.1 503") and b"maximum number of connections" in busy
    # Once the idle ones are closed, the bridge serves again.
    assert harness.run(_closed_by_server(opened)) == [b""] * 8
    assert harness.post("r", BODY, _auth(key))[0] == 200


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP answer read off a kept-alive connection: (its head, its body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 120)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await asyncio.wait_for(reader.readexactly(length), 120)


def _block_until(loop: asyncio.AbstractEventLoop, moment: float) -> None:
    """Keep the loop busy until its clock passes *moment* (what a busy loop does anyway)."""
    while loop.time() <= moment:
        pass


def test_a_request_sent_as_the_keep_alive_timer_fires_is_served(
    harness: Harness, model_server: ModelServer
) -> None:
    """The bridge closed idle connections at 5 s, httpx (so the OpenAI SDK) reuses them up
    to 5 s: one row in 1,000 through a shared client failed ``httpx.ReadError``. Here the
    client's next request and the bridge's keep-alive timer fall in one pass of the loop,
    request first, for sure: the request is answered, the connection kept."""
    _, key = harness.bridge.open_rollout("r")
    body = json.dumps(BODY).encode()
    request = _head("r", key, f"Content-Length: {len(body)}").encode() + body

    async def race() -> tuple[bytes, tuple[bytes, bytes]]:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection("127.0.0.1", harness.port)
        try:
            writer.write(request)
            first, _ = await _answer(reader)
            runner = harness.bridge._runner
            assert runner is not None and runner.server is not None
            (handler,) = runner.server.connections
            # The bridge's keep-alive timer, due in a moment rather than in KEEP_ALIVE_S.
            if handler._keepalive_handle is not None:
                handler._keepalive_handle.cancel()
            due = loop.time() + 0.2
            handler._next_keepalive_close_time = due
            handler._keepalive_handle = loop.call_at(due, handler._process_keepalive)
            loop.call_at(due - 0.01, writer.write, request)  # the client reuses it, just in time
            loop.call_soon(_block_until, loop, due)  # both fall due in the same pass
            return first, await _answer(reader)
        finally:
            writer.close()

    first, (head, answer) = harness.run(race())
    assert first.startswith(b"HTTP/1.1 200") and b"Keep-Alive: timeout=15" in first, first
    assert head.startswith(b"HTTP/1.1 200"), head
    assert json.loads(answer)["choices"][0]["message"]["content"]
    assert model_server.requests_total == 2


def test_the_bridge_keeps_a_served_connection_longer_than_clients_reuse_one() -> None:
    """The idle expiry of httpx (the OpenAI SDK's, LiteLLM's) and aiohttp (15 s) against ours:
    the client retires a connection first, so no close races a request."""
    import httpx
    import openai

    expiries = [httpx.Limits().keepalive_expiry, openai.DEFAULT_CONNECTION_LIMITS.keepalive_expiry]
    assert expiries == [5.0, 5.0]
    assert 15.0 <= bridge_module.KEEP_ALIVE_ADVERTISED_S < bridge_module.KEEP_ALIVE_S


JUDGING_ROLLOUT = '''
import httpx

from pytest_osmosis.rollout import AgentWorkflow, Grader, LocalBackend, get_rollout_context


class Echo(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, {"role": "assistant", "content": "4"}]


class OwnJudge(Grader):
    """A hand-written grader asking its own judge model through the bridge."""

    async def grade(self, ctx):
        rollout = get_rollout_context()
        async with httpx.AsyncClient(timeout=60) as client:
            response = await client.post(
                rollout.chat_completions_url + "/chat/completions",
                headers={
                    "Authorization": f"Bearer {rollout.api_key}",
                    "X-Osmosis-Judge-Model": "openai/listed-judge",
                },
                json={"model": "judge", "messages": [{"role": "user", "content": "hi"}]},
            )
        if response.status_code != 200:
            raise RuntimeError(response.json()["detail"])
        ctx.sample.reward = 1.0


backend = LocalBackend(workflow=Echo, grader=OwnJudge)
'''


@pytest.mark.parametrize("listed", [True, False], ids=["ini-listed", "undeclared"])
def test_a_session_reaches_only_the_judges_it_declares(
    pytester: pytest.Pytester,
    model_server: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    listed: bool,
) -> None:
    for name, value in model_server.env().items():
        monkeypatch.setenv(name, value)
    rows = calc_rows([("What is 2 + 2?", "4")])
    write_workspace(pytester.path, rows=rows, rollout_source=JUDGING_ROLLOUT)
    if listed:
        pytester.makeini("[pytest]\nosmosis_judge_models =\n    openai/listed-judge\n")
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    judged = [b for b in model_server.bodies if b["model"] == "listed-judge"]
    if listed:
        result.assert_outcomes(passed=1)
        assert len(judged) == 1
    else:
        result.assert_outcomes(errors=1)
        result.stdout.fnmatch_lines(
            ["*judge model 'openai/listed-judge' is not declared by this session*"]
        )
        assert judged == []
