"""Whether LiteLLM certainly knows no provider for a model id, decided without importing it.

Importing LiteLLM costs 2-4 s, and a session with ``model_path = "nosuchprovider/x"`` used
to pay it only to hear that the provider does not exist. LiteLLM decides from data it
ships: the ``LlmProviders`` enum, the JSON-configured providers (``providers.json``), the
cost map's model ids and routing rules (``fallback_generalizations``), and the literals
``get_llm_provider`` matches names against. We read those files as text (as
model/prices.py reads the cost map) and answer "unknown" only when nothing in them could
route the id; otherwise the caller is unsure and asks LiteLLM itself. The rule is one way:
a wrong "unsure" costs seconds, a wrong "unknown" would refuse a model LiteLLM accepts
(``tests/test_unknown_provider.py`` compares us with ``litellm.get_llm_provider``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys

from pytest_osmosis.model.prices import COST_MAP, cost_map_text, litellm_dir

__all__ = ["certainly_unknown", "unknown_by_files"]

_SOURCES = (
    "types/utils.py",  # LlmProviders: litellm.provider_list
    "llms/openai_like/providers.json",  # JSON-configured OpenAI-compatible providers
    "litellm_core_utils/get_llm_provider_logic.py",  # names matched in code
    "__init__.py",
    COST_MAP,  # model ids ("provider/name") and their litellm_provider
)
_LOGIC = "litellm_core_utils/get_llm_provider_logic.py"
_PLAIN_PREFIX = re.compile(r"[a-z0-9][a-z0-9_.\-]*")
_STRING = re.compile(r'"([^"\\\n]{2,})"')


@functools.cache
def _known() -> tuple[frozenset[str], frozenset[str], tuple[re.Pattern[str], ...]] | None:
    """(the sources' quoted names, lower-cased; the literals ``get_llm_provider`` matches
    names against; the routing rules), read once; None: unsure."""
    root = litellm_dir()
    if root is None:
        return None
    texts = []
    for name in _SOURCES:
        try:
            text = cost_map_text() if name == COST_MAP else (root / name).read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            text = None
        if text is None:
            return None  # another LiteLLM layout: ask LiteLLM
        texts.append(text)
    logic = texts[_SOURCES.index(_LOGIC)]
    literals = frozenset(literal.lower() for literal in _STRING.findall(logic))
    rules = _routing_rules(texts[-1])
    if rules is None:
        return None
    # Every run of text between two double quotes, and its part before a "/": a name is in
    # here exactly when '"name"' or '"name/' occurs in some file (a name has no quotes).
    quoted: set[str] = set()
    for text in texts:
        for segment in text.lower().split('"'):
            quoted.add(segment)
            if "/" in segment:
                quoted.add(segment.split("/", 1)[0])
    return frozenset(quoted), literals, rules


def _routing_rules(cost_map: str) -> tuple[re.Pattern[str], ...] | None:
    """The cost map's routing rules (regexes LiteLLM routes otherwise unknown ids by)."""
    needle = '\n    "fallback_generalizations": '
    at = cost_map.find(needle)
    if at < 0:
        return ()  # a LiteLLM without rules
    try:
        block, _ = json.JSONDecoder().raw_decode(cost_map, at + len(needle))
        patterns = [rule["pattern"] for rule in block.get("rules", []) if isinstance(rule, dict)]
        return tuple(re.compile(str(pattern), re.IGNORECASE) for pattern in patterns)
    except (ValueError, KeyError, TypeError, AttributeError, re.error):
        return None


def certainly_unknown(model: str, api_base: str | None = None) -> bool:
    """True only where ``litellm.get_llm_provider(model, api_base=...)`` must refuse ``model``.

    False means unsure, never "known": the caller asks LiteLLM. Unsure whenever LiteLLM is
    already imported (a rollout may have registered a provider), an ``api_base`` is given
    (LiteLLM infers providers from endpoints), the LiteLLM proxy or a remote cost map is
    configured, or the id is not ``provider/name`` with a plain provider name.
    """
    if "litellm" in sys.modules or api_base:
        return False
    if os.environ.get("USE_LITELLM_PROXY") or os.environ.get("LITELLM_MODEL_COST_MAP_URL"):
        return False
    if os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "").strip().lower() != "true":
        return False  # LiteLLM would fetch a newer map, which may know more
    return unknown_by_files(model)


def unknown_by_files(model: str) -> bool:
    """The files' half of `certainly_unknown`: nothing LiteLLM ships could route ``model``."""
    if "/" not in model or ":" in model:
        return False
    lowered = model.lower()
    prefix = lowered.split("/", 1)[0]
    if not _PLAIN_PREFIX.fullmatch(prefix):
        return False
    known = _known()
    if known is None:
        return False
    quoted, literals, rules = known
    if prefix in quoted:
        return False  # a provider, a JSON provider or a model id LiteLLM ships
    if any(lowered.startswith(literal) for literal in literals):
        return False  # a name LiteLLM's code matches by its start (e.g. "amazon_nova")
    return not any(rule.search(model) for rule in rules)
