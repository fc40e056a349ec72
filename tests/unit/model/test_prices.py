"""A call through LiteLLM is priced as ``litellm.cost_per_token`` prices it, by a dict lookup.

`cost_usd` prices ``openai/`` and ``anthropic/`` calls from the map entry's two token prices
(``cost_per_token`` costs ~0.15 ms of the rows' loop a call). That is only right where the
two agree: checked here for every entry of those providers in the installed LiteLLM, at
counts on both sides of every tier LiteLLM knows (128k, 200k, 272k prompt tokens).
"""

from __future__ import annotations

import math

import pytest

from pytest_osmosis.model.litellm import FLAT_PRICED_PROVIDERS, cost_usd
from pytest_osmosis.model.prices import flat_price

litellm = pytest.importorskip("litellm")
litellm.suppress_debug_info = True

COUNTS = [(1, 0), (0, 1), (1234, 567), (150_000, 3), (250_000, 9_000), (1_100_000, 70_000)]


def _litellms(model: str, prompt: int, completion: int) -> float:
    prompt_cost, completion_cost = litellm.cost_per_token(
        model=model, prompt_tokens=prompt, completion_tokens=completion
    )
    return float(prompt_cost) + float(completion_cost)


def _models() -> list[str]:
    return sorted(
        f"{entry['litellm_provider']}/{name}"
        for name, entry in litellm.model_cost.items()
        if isinstance(entry, dict) and entry.get("litellm_provider") in FLAT_PRICED_PROVIDERS
    )


def test_prices_are_litellms() -> None:
    models = _models()
    assert len(models) > 50  # the map was read: OpenAI's and Anthropic's models are there
    priced = 0
    for model in models:
        found = flat_price(litellm.model_cost, model)
        if found is None:
            continue  # tiered or no token price: cost_usd asks cost_per_token
        priced += 1
        for prompt, completion in COUNTS:
            want = _litellms(model, prompt, completion)
            got = cost_usd(model, prompt, completion)
            assert got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15), (
                model,
                prompt,
                completion,
                got,
                want,
            )
    assert priced > 50


def test_a_tiered_or_unmapped_model_is_priced_by_litellm_itself() -> None:
    tiered = [
        model
        for model in _models()
        if any("_above_" in field for field in litellm.model_cost[model.split("/", 1)[1]])
    ]
    assert tiered, "no tiered OpenAI or Anthropic model in this LiteLLM's map"
    for model in tiered:
        assert flat_price(litellm.model_cost, model) is None
        assert cost_usd(model, 250_000, 10) == pytest.approx(_litellms(model, 250_000, 10))
    assert cost_usd("openai/no-such-model-osmosis", 10, 2) is None


def test_a_price_a_rollout_registers_is_the_one_used() -> None:
    name = "osmosis-registered-test-model"
    litellm.register_model(
        {
            name: {
                "litellm_provider": "openai",
                "mode": "chat",
                "input_cost_per_token": 2e-6,
                "output_cost_per_token": 5e-6,
            }
        }
    )
    try:
        assert cost_usd(f"openai/{name}", 1000, 100) == pytest.approx(
            _litellms(f"openai/{name}", 1000, 100)
        )
        assert cost_usd(f"openai/{name}", 1000, 100) == pytest.approx(0.0025)
    finally:
        litellm.model_cost.pop(name, None)
