"""Which model a call goes to and what it needs: routes, providers, keys and API choice.

A configured model path (a LiteLLM id or ``osmosis/embedded``) becomes a `ModelRoute`;
a judge model named by a request is routed the same way and checked once (unknown id,
missing key) so a row fails in one line instead of at the provider. Whether a route uses
the Responses API is decided here too, as osmosis-ai 0.3.8 decides it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_osmosis.model.litellm import _litellm
from pytest_osmosis.model.provider_errors import _one_line
from pytest_osmosis.model.ratelimit import Backoff

__all__ = [
    "DEFAULT_API_KEY_ENV",
    "EMBEDDED_MODEL_PATH",
    "JUDGE_MISSING_API_KEY",
    "JUDGE_MODEL_NOT_ALLOWED",
    "JUDGE_MODEL_NOT_FOUND",
    "JUDGE_PROVIDER_ERROR",
    "ModelRoute",
    "is_openai_api",
    "not_a_model_id",
    "provider_of",
    "resolve_route",
]

EMBEDDED_MODEL_PATH = "osmosis/embedded"
# ``error.type`` of a failed judge call, so the grader can raise the matching JudgeError.
JUDGE_MISSING_API_KEY = "judge_missing_api_key"
JUDGE_MODEL_NOT_FOUND = "judge_model_not_found"
JUDGE_MODEL_NOT_ALLOWED = "judge_model_not_allowed"
JUDGE_PROVIDER_ERROR = "judge_provider_error"
_OPENAI_API_BASE = "https://api.openai.com/v1"
"""Where an ``openai/*`` model is served by OpenAI itself: its calls use the Responses API."""
_KEY_NAME = re.compile(r"KEY|TOKEN|CREDENTIAL", re.IGNORECASE)
# The SDK's table: the variable a missing key is reported under, per provider.
DEFAULT_API_KEY_ENV: Mapping[str, str] = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "xai": "XAI_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "google": "GEMINI_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "cerebras": "CEREBRAS_API_KEY",
    "azure": "AZURE_API_KEY",
    "bedrock": "AWS_ACCESS_KEY_ID",
    "vertex_ai": "GOOGLE_APPLICATION_CREDENTIALS",
}


@dataclass(frozen=True)
class ModelRoute:
    """How LiteLLM reaches the configured model."""

    model_path: str
    """What the user configured, e.g. ``openai/gpt-5-mini`` or ``osmosis/embedded``."""
    litellm_model: str
    """What is passed as ``model=`` to LiteLLM."""
    kwargs: dict[str, object] = field(default_factory=dict, hash=False)
    """Extra LiteLLM kwargs; they win over what a rollout sends (e.g. temperature 0)."""


@dataclass
class _Target:
    """A model the bridge forwards to, with its own shared 429 back-off."""

    route: ModelRoute
    backoff: Backoff
    judge: bool = False
    """Named by a request's judge header: its errors name the judge model."""


class _JudgeUnavailable(Exception):
    """The judge model named in a request cannot be called; one line, and a kind for clients."""

    def __init__(self, kind: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


def resolve_route(model_path: str) -> ModelRoute:
    """Map the configured model to a LiteLLM call; ``osmosis/embedded`` starts the local model."""
    if model_path == EMBEDDED_MODEL_PATH:
        from pytest_osmosis.model.embedded import embedded_route

        return embedded_route()
    return ModelRoute(model_path=model_path, litellm_model=model_path, kwargs={})


def not_a_model_id(model_path: str, detail: str) -> str:
    """The preflight's one line for a model id no LiteLLM provider serves.

    A ``$`` is a placeholder that a user expected to be expanded (``"${MODEL}"``): the eval
    TOML is read as written, by ``osmosis eval run`` too, so the line says where a model
    chosen at run time goes instead of repeating LiteLLM's provider list."""
    if "$" in model_path:
        return (
            f"model preflight failed for {model_path!r}: not a LiteLLM model id; "
            "it is read as written, never expanded from the environment (as `osmosis eval "
            "run` reads the eval TOML): choose the model at run time with --osmosis-model MODEL"
        )
    return (
        f"model preflight failed for {model_path!r}: not a LiteLLM model id; "
        "use 'provider/model' (e.g. openai/gpt-5-mini, anthropic/claude-sonnet-4-5) "
        f"or {EMBEDDED_MODEL_PATH!r} ({detail})"
    )


def _model_ids(models: Iterable[str]) -> set[str]:
    """Model ids as a judge header names them (`Bridge._target` strips the header too)."""
    return {model.strip() for model in models if model.strip()}


def _route_secrets(route: ModelRoute) -> tuple[str, ...]:
    return tuple(v for k, v in route.kwargs.items() if isinstance(v, str) and "key" in k.lower())


def _resolve_judge(model: str) -> _Target:
    """Route a judge model as the run's model is routed, and check it can be called."""
    from pytest_osmosis.core.errors import OsmosisError

    try:
        route = resolve_route(model)
    except OsmosisError as exc:
        raise _JudgeUnavailable(
            JUDGE_MODEL_NOT_FOUND, f"judge model {model!r} is unavailable: {_one_line(exc)}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - e.g. the embedded engine crashed while starting
        raise _JudgeUnavailable(
            JUDGE_MODEL_NOT_FOUND,
            f"judge model {model!r} is unavailable: {type(exc).__name__}: {_one_line(exc)}",
        ) from None
    litellm = _litellm()
    api_base = route.kwargs.get("api_base")
    try:
        litellm.get_llm_provider(
            model=route.litellm_model, api_base=api_base if isinstance(api_base, str) else None
        )
    except Exception:  # noqa: BLE001 - LiteLLM says "provider not provided" in many ways
        raise _JudgeUnavailable(
            JUDGE_MODEL_NOT_FOUND,
            f"unknown judge model {model!r}: not a LiteLLM model id; use provider/model "
            "(e.g. openai/gpt-5-mini, anthropic/claude-sonnet-4-5) "
            f"or {EMBEDDED_MODEL_PATH!r}",
        ) from None
    missing = _missing_judge_keys(litellm, route)
    if missing:
        raise _JudgeUnavailable(
            JUDGE_MISSING_API_KEY,
            f"missing API key: set {' and '.join(missing)} for judge model {model!r} "
            f"(or use the offline judge {EMBEDDED_MODEL_PATH})",
        )
    return _Target(route, Backoff(), judge=True)


def provider_of(model: str) -> str | None:
    """The provider prefix of ``model``, or the SDK's guess from well-known names."""
    if "/" in model:
        return model.split("/", 1)[0].lower().strip() or None
    name = model.lower().strip()
    if name.startswith(("gpt-", "o1-", "o3-", "o4-")):
        return "openai"
    if name.startswith("claude"):
        return "anthropic"
    if name.startswith("gemini"):
        return "gemini"
    if name.startswith("grok"):
        return "xai"
    return None


def _missing_judge_keys(litellm: Any, route: ModelRoute) -> list[str]:
    """The variables a judge's provider needs and lacks, as the rubric command reports them."""
    if route.kwargs.get("api_key"):
        return []
    env = DEFAULT_API_KEY_ENV.get(provider_of(route.litellm_model) or "")
    if env is not None:
        return [] if os.environ.get(env, "").strip() else [env]
    try:
        report = litellm.validate_environment(model=route.litellm_model)
    except Exception:  # noqa: BLE001 - no verdict: let the call itself tell
        return []
    names = report.get("missing_keys") if isinstance(report, dict) else None
    return [str(name) for name in names or [] if _KEY_NAME.search(str(name))]


def _api_base(route: ModelRoute) -> str | None:
    value = route.kwargs.get("api_base")
    return value if isinstance(value, str) else None


def _uses_responses_api(litellm: Any, route: ModelRoute) -> bool:
    """An ``openai/*`` model served by OpenAI itself is called through the Responses API.

    The endpoint is resolved LiteLLM's way (the route's ``api_base``, ``litellm.api_base``,
    ``OPENAI_BASE_URL``, ``OPENAI_API_BASE``), as osmosis-ai 0.3.8 decides it.
    """
    return route.litellm_model.startswith("openai/") and _official_openai(litellm, route)


def _official_openai(litellm: Any, route: ModelRoute) -> bool:
    return is_openai_api(litellm.OpenAIGPTConfig.get_api_base(_api_base(route)))


def is_openai_api(base: str | None) -> bool:
    """Whether an endpoint base is OpenAI's own API (whose calls use the Responses API)."""
    return str(base or "").rstrip("/") == _OPENAI_API_BASE
