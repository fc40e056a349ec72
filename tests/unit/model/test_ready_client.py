"""``bridge_client()``: the attempt's URL and bearer, one connection pool per process."""

from __future__ import annotations

import asyncio

import pytest
from model_server import ModelServer

from pytest_osmosis.model.client import _POOLS, close_pools
from pytest_osmosis.rollout import RolloutContext, bridge_client


def _ask(text: str) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def test_each_attempt_gets_its_url_and_bearer_over_one_shared_pool(
    model_server: ModelServer,
) -> None:
    async def go() -> list[str]:
        answers = []
        for attempt in ("a", "b"):
            with RolloutContext(
                chat_completions_url=model_server.url, api_key=f"key-{attempt}", rollout_id=attempt
            ):
                async with bridge_client() as client:  # closing it leaves the pool open
                    assert client.base_url == model_server.url + "/"
                    assert client.headers["Authorization"] == f"Bearer key-{attempt}"
                    response = await client.post("chat/completions", json=_ask("What is 2 + 3?"))
                    response.raise_for_status()
                answers.append(response.json()["choices"][0]["message"]["content"])
        assert len(_POOLS) == 1
        await close_pools()
        assert not _POOLS
        return answers

    assert asyncio.run(go()) == ["5", "5"]
    assert model_server.requests_total == 2


def test_outside_a_rollout_it_says_where_to_call_it() -> None:
    async def go() -> None:
        bridge_client()

    with pytest.raises(RuntimeError, match=r"inside AgentWorkflow\.run or Grader\.grade"):
        asyncio.run(go())
