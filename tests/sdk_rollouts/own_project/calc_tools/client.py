from typing import Any

import httpx
from osmosis_ai.rollout.context import get_rollout_context


async def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One chat completion through the rollout's endpoint; returns the assistant message."""
    rollout = get_rollout_context()
    assert rollout is not None
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            rollout.chat_completions_url + "/chat/completions",
            headers={"Authorization": f"Bearer {rollout.api_key}"},
            json={"model": "osmosis-rollout", "messages": messages},
        )
        response.raise_for_status()
    body = response.json()
    return {**body["choices"][0]["message"], "usage": body["usage"]}
