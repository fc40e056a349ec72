"""Closing the bridge closes every connection it accepted: none is left to the collector.

A server-side transport collected after its asyncio server closed reported
``TypeError: 'NoneType' object is not iterable`` from ``Server._wakeup`` on Python 3.13.0
(CPython gh-109564), which pytest turned into a ``PytestUnraisableExceptionWarning`` at the
end of a ``-x`` session with rows in flight; on every version it leaked a descriptor until
the collector ran (a ``ResourceWarning``). These tests leave clients connected across
``Bridge.close()`` and check, with real sockets, that the bridge closed each of them.
"""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import socket
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from model_server import ModelServer
from workspaces import wait_until

from pytest_osmosis.model.bridge import Bridge
from pytest_osmosis.model.routes import ModelRoute

MODEL = "openai/osmosis-test"
HELD = "hold this call"


@pytest.fixture
def leftovers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What the collector reported while the test ran: unraisable exceptions (pytest's
    hook is set aside meanwhile) and ResourceWarnings of unclosed sockets or transports."""
    found: list[str] = []
    monkeypatch.setattr(
        sys, "unraisablehook", lambda u: found.append(f"{u.exc_type.__name__}: {u.exc_value}")
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield found
        gc.collect()
    found.extend(str(w.message) for w in caught if issubclass(w.category, ResourceWarning))


def _bridge(model_loop: Any, model_server: ModelServer) -> Bridge:
    route = ModelRoute(MODEL, MODEL, {"api_base": model_server.url, "api_key": "sk-test-close"})
    bridge = Bridge(route)
    model_loop.run(bridge.start())
    return bridge


def _port(bridge: Bridge) -> int:
    return int(bridge.base_url.rsplit(":", 1)[1])


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed this connection: it reads the end (or a reset), having
    been sent nothing more (a generous timeout only stops a hang)."""
    sock.settimeout(60)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def _open_transports(port: int) -> list[str]:
    """asyncio transports of the bridge's port whose socket is still open."""
    gc.collect()
    found = []
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.BaseTransport):
            sockname = obj.get_extra_info("sockname")
            sock = obj.get_extra_info("socket")
            if sockname and sockname[1] == port and sock is not None and sock.fileno() != -1:
                found.append(repr(obj))
    return found


def _request(conn: http.client.HTTPConnection, path: str, key: str, text: str) -> None:
    body = json.dumps({"model": "x", "messages": [{"role": "user", "content": text}]})
    conn.request(
        "POST",
        f"{path}/chat/completions",
        body=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )


def test_close_closes_served_in_flight_and_silent_connections(
    model_loop: Any, model_server: ModelServer, leftovers: list[str]
) -> None:
    bridge = _bridge(model_loop, model_server)
    port = _port(bridge)
    url, key = bridge.open_rollout("r1")
    path = url.split(str(port), 1)[1]
    # A keep-alive connection that was served and now waits idle for its next request.
    served = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    _request(served, path, key, "What is 2 + 2?")
    response = served.getresponse()
    assert response.status == 200 and "4" in response.read().decode()
    # A call in flight: the provider holds it while the bridge closes.
    model_server.hold = HELD
    in_flight = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    _request(in_flight, path, key, HELD)
    wait_until(lambda: model_server.holding == 1, "the provider holds the call")
    # A client that connected and sent nothing yet.
    silent = socket.create_connection(("127.0.0.1", port))

    async def close_as_the_session_does() -> None:
        # plugin/models.py gives the close 5 s; the loop's drain then cancels it.
        try:
            await asyncio.wait_for(bridge.close(), 5)
        except asyncio.TimeoutError:
            pass

    try:
        model_loop.run(close_as_the_session_does())
        assert served.sock is not None and in_flight.sock is not None
        assert _closed_by_server(served.sock)
        assert _closed_by_server(in_flight.sock)
        assert _closed_by_server(silent)
        assert _open_transports(port) == []
    finally:
        model_server.hold = ""
        served.close()
        in_flight.close()
        silent.close()
    assert leftovers == []


@pytest.mark.parametrize("passes", range(5))
def test_a_connection_accepted_as_the_bridge_closes_is_closed_not_collected(
    model_loop: Any, model_server: ModelServer, leftovers: list[str], passes: int
) -> None:
    """A client connects as the bridge closes: one of these pass counts closes it after the
    loop accepted the connection and before asyncio made its transport (the gh-109564
    window: with a blocking connect, two passes)."""
    bridge = _bridge(model_loop, model_server)
    port = _port(bridge)

    async def connect_then_close() -> socket.socket:
        client = socket.create_connection(("127.0.0.1", port))  # in the accept queue now
        for _ in range(passes):
            await asyncio.sleep(0)
        await bridge.close()
        return client

    client = model_loop.run(connect_then_close())
    try:
        assert _closed_by_server(client)
        assert _open_transports(port) == []
    finally:
        client.close()
    assert leftovers == []
