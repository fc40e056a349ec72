"""Prices from LiteLLM's bundled cost map, read without importing LiteLLM.

Rows called directly (model/direct.py) never import LiteLLM (2-5 s), yet their model may
have a price: ``openai/gpt-4o-mini`` at an OpenAI-compatible endpoint costs what LiteLLM
says it costs. LiteLLM ships its map as ``model_prices_and_context_window_backup.json``
(what ``LITELLM_LOCAL_MODEL_COST_MAP=True`` makes it use); we read one model's entry from
that file, the way ``litellm.cost_per_token`` looks it up for a plain chat call: the full
model id, else the name after the provider prefix when the entry is that provider's.
A model whose price depends on more than the token counts (tiers above a prompt size)
gets no price here: ``unknown`` beats a wrong number.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

COST_MAP = "model_prices_and_context_window_backup.json"


@functools.cache
def litellm_dir() -> Path | None:
    """The installed LiteLLM package's directory, found without importing it; None without it."""
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        return None
    for location in list(spec.submodule_search_locations or []) if spec is not None else []:
        return Path(location)
    return None


def cost_map_text() -> str | None:
    """The bundled map's text, or None without LiteLLM.

    Read when asked and not kept (3.4 MB): what is taken from it is (a model's price, the
    provider names), and each model's price is read once per process (`price`)."""
    root = litellm_dir()
    if root is None:
        return None
    try:
        return (root / COST_MAP).read_text(encoding="utf-8")
    except OSError:
        return None


def _entry(text: str, key: str) -> dict[str, Any] | None:
    """One top-level entry, decoded alone (the whole map is 3 MB of JSON: ~0.3 s to parse)."""
    needle = f"\n    {json.dumps(key)}: "
    at = text.find(needle)
    if at < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text, at + len(needle))
    except ValueError:
        return None
    return value if isinstance(value, dict) and "litellm_provider" in value else None


@functools.cache
def price(model: str) -> tuple[float, float] | None:
    """(dollars per prompt token, per completion token) of ``model``; None: no flat price."""
    text = cost_map_text()
    if text is None:
        return None
    return _flat(_lookup(lambda key: _entry(text, key), model))


def flat_price(cost_map: Mapping[str, Any], model: str) -> tuple[float, float] | None:
    """The same as `price`, from a loaded map (``litellm.model_cost``, models a rollout
    registered included): a dict lookup instead of ``litellm.cost_per_token``'s ~0.15 ms."""

    def get(key: str) -> dict[str, Any] | None:
        value = cost_map.get(key)
        return value if isinstance(value, dict) and "litellm_provider" in value else None

    return _flat(_lookup(get, model))


def _lookup(get: Callable[[str], dict[str, Any] | None], model: str) -> dict[str, Any] | None:
    """The map entry ``litellm.cost_per_token`` prices a plain chat call of ``model`` by: the
    full id, else the name after the provider prefix when the entry is that provider's."""
    provider, _, name = model.partition("/")
    entry = get(model)
    if entry is None and name:
        entry = get(name)
        if entry is not None and entry.get("litellm_provider") != provider:
            entry = None
    return entry


def _flat(entry: dict[str, Any] | None) -> tuple[float, float] | None:
    """An entry's two token prices; None where the price depends on more than the counts."""
    if entry is None or any("_above_" in field for field in entry):
        return None
    prompt, completion = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
    if not all(isinstance(v, (int, float)) and v >= 0 for v in (prompt, completion)):
        return None
    return float(prompt), float(completion)  # type: ignore[arg-type]


def bundled_cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """What a call cost in dollars by the bundled map; None when the model has no price."""
    found = price(model)
    if found is None:
        return None
    return prompt_tokens * found[0] + completion_tokens * found[1]
