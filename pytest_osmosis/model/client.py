"""The ready client a rollout reaches the bridge with: cheap per attempt, one pool per process.

Building an ``httpx.AsyncClient`` loads the CA certificates, 24-31 ms of CPU on this
machine, and a rollout that builds one per call spends it on the event loop every row
shares. `bridge_client` hands each attempt a client bound to its bridge URL and bearer
over one connection pool per event loop (0.1 ms to make), so the cheap way is also the
short one. The SDK's ``RolloutContext`` has no field for it and a rollout must run the
same under ``osmosis eval run``, so it is a function of the ambient context, not an
attribute added to the context object (contract §14 D78).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import httpx

DEFAULT_TIMEOUT_S = 600.0
"""A model call may take minutes (httpx's own default, 5 s, would cut it); the row's
budget, not the client, decides how long an attempt may take."""


class _SharedPool(httpx.AsyncBaseTransport):
    """One connection pool behind every attempt's client; closing a client leaves it open."""

    def __init__(self) -> None:
        # No cap on connections: rows in flight are already capped by the session, and a
        # pool cap would queue calls where no budget sees them.
        self.transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=None))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)

    async def aclose(self) -> None:
        """Nothing: the pool outlives the attempt (`close_pools` closes it)."""


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _SharedPool] = (
    weakref.WeakKeyDictionary()
)


def bridge_client(*, timeout: float | None = DEFAULT_TIMEOUT_S) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for this attempt's model endpoint.

    Its ``base_url`` is the rollout context's ``chat_completions_url`` and it sends the
    context's bearer, so ``await bridge_client().post("chat/completions", json=body)``
    is a whole call. Call it inside ``AgentWorkflow.run`` or ``Grader.grade`` (or any
    code running under a ``RolloutContext``); ``async with`` it or not, as you like.
    """
    from pytest_osmosis.workspace.rollout_api import get_rollout_context

    rollout: Any = get_rollout_context()
    if rollout is None or not rollout.chat_completions_url:
        raise RuntimeError(
            "bridge_client() needs a rollout context: call it inside AgentWorkflow.run "
            "or Grader.grade"
        )
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = _SharedPool()
    headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else None
    return httpx.AsyncClient(
        base_url=str(rollout.chat_completions_url).rstrip("/") + "/",
        headers=headers,
        timeout=timeout,
        transport=pool,
    )


async def close_pools() -> None:
    """Close the running loop's shared pool (the session does, at its end)."""
    pool = _POOLS.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        await pool.transport.aclose()
