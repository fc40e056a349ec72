"""The one lazy LiteLLM import, for every module that calls a model (bridge, judge, preflight).

Importing LiteLLM costs ~3 s of CPU and plain pytest runs must not pay it, so nothing
imports it at module level: callers take it from `_litellm()` when they call, and a
session imports it once, up front and off its loop (`import_litellm`).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from typing import Any

from pytest_osmosis.core.errors import ModelPreflightError
from pytest_osmosis.model.prices import bundled_cost, flat_price

__all__ = ["import_litellm", "start_import"]


def _litellm() -> Any:
    import litellm

    # Stops LiteLLM printing "Give Feedback / Get Help" banners on every error.
    litellm.suppress_debug_info = True
    return litellm


_LITELLM_READY = threading.Event()
_background: threading.Thread | None = None
_background_error: list[ModelPreflightError] = []


def start_import() -> None:
    """Import LiteLLM on a thread of its own while the session's start-up goes on.

    `import_litellm` then waits for it (and raises its error). The thread is a daemon: a
    session that stops early (a failed preflight) does not wait seconds for an unused import.
    """
    global _background
    if _background is not None or _LITELLM_READY.is_set():
        return

    def run() -> None:
        try:
            import_litellm()
        except ModelPreflightError as exc:
            _background_error.append(exc)

    _background = threading.Thread(target=run, name="osmosis-litellm-import", daemon=True)
    _background.start()


def litellm_ready() -> bool:
    return _LITELLM_READY.is_set()


def import_litellm() -> None:
    """Import LiteLLM with the cyclic GC paused, then freeze what it made.

    Its ~3 s import builds a heap of long-lived objects that the collector would walk
    again and again while it grows, after it, and at exit (this halves the import).
    A LiteLLM that cannot be imported (e.g. a rollout's install replaced it) raises
    :class:`ModelPreflightError` with one line: no model call can work in this session.
    """
    background = _background
    if background is not None and background is not threading.current_thread():
        background.join()
        if _background_error:
            raise _background_error[0]
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


FLAT_PRICED_PROVIDERS = frozenset({"openai", "anthropic"})
"""Providers whose ``cost_per_token`` for a chat call is its map entry's two token prices
wherever the entry has no tier (``test_prices_are_litellms`` checks every such entry of the
installed LiteLLM): their calls are priced by a dict lookup, not its ~0.15 ms a call."""


def cost_usd(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """What a call cost in US dollars by LiteLLM's cost map; None when the model has no price.

    The map is LiteLLM's bundled copy (the session sets ``LITELLM_LOCAL_MODEL_COST_MAP``):
    pricing never reaches the network. A session whose rows skip LiteLLM
    (``osmosis/embedded``, model/direct.py) must not import it here, on the rows' loop:
    it reads the same bundled file instead (model/prices.py).
    """
    if "litellm" not in sys.modules:
        return bundled_cost(model, prompt_tokens, completion_tokens)
    if model.partition("/")[0] in FLAT_PRICED_PROVIDERS:
        found = flat_price(_litellm().model_cost, model)
        if found is not None:
            return prompt_tokens * found[0] + completion_tokens * found[1]
    try:
        prompt_cost, completion_cost = _litellm().cost_per_token(
            model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
        total = float(prompt_cost) + float(completion_cost)
    except Exception:  # noqa: BLE001 - LiteLLM raises its own errors for an unmapped model
        return None
    return total if total == total and total >= 0 else None  # NaN, negative: no price


def has_price(model: str) -> bool:
    """Whether LiteLLM's local cost map prices ``model`` (``--osmosis-max-cost`` needs it)."""
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import_litellm()
    return bool(cost_usd(model, 1_000_000, 1_000_000))
