"""An unknown provider is reported without importing LiteLLM, and never where LiteLLM would
accept the model (model/providers.py decides from LiteLLM's own files)."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from workspaces import calc_rows, write_workspace

from pytest_osmosis.model.prices import cost_map_text, litellm_dir
from pytest_osmosis.model.providers import certainly_unknown, unknown_by_files

litellm = pytest.importorskip("litellm")
litellm.suppress_debug_info = True  # no "Provider List" banner for each refusal


def _litellm_accepts(model: str) -> bool:
    try:
        litellm.get_llm_provider(model=model)
    except Exception:  # noqa: BLE001 - LiteLLM refuses in many ways
        return False
    return True


def _providers_litellm_lists() -> list[str]:
    """Provider names from LiteLLM's own lists: its enum, its JSON providers, its cost map."""
    names = {str(getattr(p, "value", p)) for p in litellm.provider_list}
    root = litellm_dir()
    assert root is not None
    names |= set(json.loads((root / "llms/openai_like/providers.json").read_text()))
    cost_map = json.loads(cost_map_text() or "{}")
    for key, entry in cost_map.items():
        if isinstance(entry, dict) and isinstance(entry.get("litellm_provider"), str):
            names.add(entry["litellm_provider"])
        if "/" in key:
            names.add(key.split("/", 1)[0])
    return sorted(names)


PROVIDERS = _providers_litellm_lists()
MODEL_NAMES = sorted(k.split("/")[-1] for k in json.loads(cost_map_text() or "{}"))
_word = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.",
    min_size=1,
    max_size=16,
)
_prefix = st.one_of(
    st.sampled_from(PROVIDERS),
    st.sampled_from(PROVIDERS).map(str.upper),
    st.sampled_from(PROVIDERS).flatmap(lambda p: st.sampled_from([p + "z", p[:-1], p + "_ai"])),
    _word,
)
_name = st.one_of(st.sampled_from(MODEL_NAMES), _word, st.text(max_size=24))


@settings(max_examples=300, deadline=None)
@given(prefix=_prefix, name=_name)
@example(prefix="nosuchprovider", name="x")
@example(prefix="amazon_nova_x", name="m")
@example(prefix="bedrockz", name="anthropic.claude-3-haiku")
@example(prefix="x", name="anthropic.claude-3-haiku")
def test_unknown_is_never_said_of_a_model_litellm_accepts(prefix: str, name: str) -> None:
    model = f"{prefix}/{name}"
    if unknown_by_files(model):
        assert not _litellm_accepts(model), f"we say unknown, LiteLLM accepts {model!r}"


@settings(max_examples=200, deadline=None)
@given(model=st.text(max_size=40))
def test_nor_of_any_string_litellm_accepts(model: str) -> None:
    if unknown_by_files(model):
        assert not _litellm_accepts(model), f"we say unknown, LiteLLM accepts {model!r}"


def test_a_made_up_provider_is_unknown_and_real_ones_are_not() -> None:
    assert unknown_by_files("nosuchprovider/x")
    for model in ("openai/gpt-5-mini", "anthropic/claude-sonnet-4-5", "publicai/x", "gpt-5"):
        assert not unknown_by_files(model)


def test_unsure_where_litellm_is_loaded_or_an_endpoint_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # LiteLLM is imported here: a rollout may have registered a custom provider.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    assert not certainly_unknown("nosuchprovider/x")
    monkeypatch.delitem(__import__("sys").modules, "litellm")
    assert certainly_unknown("nosuchprovider/x")
    assert not certainly_unknown("nosuchprovider/x", api_base="https://api.groq.com/openai/v1")
    monkeypatch.setenv("USE_LITELLM_PROXY", "True")
    assert not certainly_unknown("nosuchprovider/x")
    monkeypatch.delenv("USE_LITELLM_PROXY")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "False")  # a newer map may know it
    assert not certainly_unknown("nosuchprovider/x")


def test_a_session_reports_an_unknown_provider_without_importing_litellm(
    pytester: pytest.Pytester,
) -> None:
    """A fresh interpreter (LiteLLM not yet imported): one line, from the files' verdict."""
    write_workspace(
        pytester.path,
        rows=calc_rows([("What is 1 + 1?", "2")]),
        model_path="nosuchprovider/x",
    )
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider")
    assert result.ret == 4
    errors = [line for line in result.errlines + result.outlines if line.startswith("ERROR:")]
    assert errors == [
        "ERROR: model preflight failed for 'nosuchprovider/x': not a LiteLLM model id; use "
        "'provider/model' (e.g. openai/gpt-5-mini, anthropic/claude-sonnet-4-5) or "
        "'osmosis/embedded' (LiteLLM has no provider 'nosuchprovider')"
    ]
