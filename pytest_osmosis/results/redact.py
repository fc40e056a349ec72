"""Secret values out of text: the :class:`Redactor`, and :func:`scrub` for messages.

A value is replaced in its plain, ``repr`` and JSON-escaped forms (:func:`secret_forms`).
What a session redacts from its output is a :class:`Redactor` the pytest plugin fills
(``plugin/redaction.py``) and names here (:func:`use_for_messages`), so a library building a
message from provider or rollout text scrubs it without knowing about pytest.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pytest_osmosis.results import stdjson as json

REDACTED = "[REDACTED]"
#: Names whose values are secrets wherever they are set (provider error text).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
#: Shorter values are not redacted from output (the SDK's rule for ambient keys).
MIN_REDACTED_LENGTH = 8

#: Provider and platform keys that often sit in the environment without being
#: listed in ``[secrets]``; osmosis-ai 0.3.8 scrubs them from logs.txt on upload.
AMBIENT_SECRET_ENV_NAMES: frozenset[str] = frozenset(
    {
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "XAI_API_KEY",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "OPENROUTER_API_KEY",
        "CEREBRAS_API_KEY",
        "AZURE_API_KEY",
        "TOGETHER_API_KEY",
        "FIREWORKS_API_KEY",
        "GROQ_API_KEY",
        "MISTRAL_API_KEY",
        "COHERE_API_KEY",
        "DEEPSEEK_API_KEY",
        "HUGGINGFACE_API_KEY",
        "HF_TOKEN",
        "WANDB_API_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "OSMOSIS_TOKEN",
        "OSMOSIS_API_KEY",
        "DAYTONA_API_KEY",
        "CURSOR_API_KEY",
        "MSWEA_API_KEY",
    }
)


def ambient_secret_values(env: Mapping[str, str], *, min_length: int = 8) -> list[str]:
    """Values of :data:`AMBIENT_SECRET_ENV_NAMES` in *env* that are long enough to redact."""
    return [
        value
        for name in sorted(AMBIENT_SECRET_ENV_NAMES)
        if (value := env.get(name)) and len(value) >= min_length
    ]


def _py_repr(value: str) -> str:
    return repr(value)[1:-1]


def _py_repr_single(value: str) -> str:
    # repr() of a string holding both quotes: single-quoted, so ' is escaped too.
    return repr(value + "\"'")[1:-4]


def _json_ascii(value: str) -> str:
    return json.dumps(value)[1:-1]


def _json_unicode(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)[1:-1]


def _json_script(value: str) -> str:
    # How report.html embeds its JSON (report/html.py::_json_script).
    return (
        _json_unicode(value).replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    )


_ESCAPES: tuple[Callable[[str], str], ...] = (
    _py_repr,
    _py_repr_single,
    _json_ascii,
    _json_unicode,
    _json_script,
    html.escape,
)


def secret_forms(value: str) -> list[str]:
    """*value* as it may be written: plain, and escaped once or twice.

    A ``repr()`` of a dict or an exception, a JSON document, an HTML page (and a JSON
    file holding a ``repr``) write a value holding a quote, a backslash or a non-ASCII
    character in another form; each form is a secret too. For most values every
    form is the value itself.
    """
    once = {escape(value) for escape in _ESCAPES}
    twice = {escape(form) for form in once for escape in _ESCAPES}
    return sorted({value} | once | twice, key=len, reverse=True)


class Redactor:
    """Replaces known secret values with ``[REDACTED]``, longest first.

    Substring replacement keeps the rest of the line (the status code, the frame)
    that made it worth logging. Values shorter than *min_length* are ignored so a
    short value cannot shred unrelated text. Each value is also redacted in its
    escaped forms (:func:`secret_forms`).
    """

    def __init__(self, secrets: Iterable[str] = (), min_length: int = 8) -> None:
        self.min_length = min_length
        self._values: list[str] = []
        self.extend(secrets)

    def extend(self, secrets: Iterable[str]) -> None:
        """Add more values (e.g. secrets resolved after the log was opened).

        The list is replaced, never sorted in place: another thread redacting at the
        same moment must see the old or the new values, not an empty list mid-sort.
        """
        values = list(self._values)
        for value in secrets:
            if value and len(value) >= self.min_length:
                values.extend(form for form in secret_forms(value) if form not in values)
        # Longest first, so a value that contains another is redacted whole.
        values.sort(key=len, reverse=True)
        self._values = values

    def redact(self, text: str) -> str:
        """*text* with every known value replaced.

        Markers already in *text* are left alone, so redacting twice changes nothing and
        a one-character value cannot shred the ``[REDACTED]`` that replaced a longer one.
        """
        values = self._values
        if not any(value in text for value in values):
            return text
        parts: list[str | None] = []  # None: a marker
        for index, piece in enumerate(text.split(REDACTED)):
            if index:
                parts.append(None)
            parts.append(piece)
        for value in values:
            replaced: list[str | None] = []
            for part in parts:
                if part is None or value not in part:
                    replaced.append(part)
                    continue
                for index, chunk in enumerate(part.split(value)):
                    if index:
                        replaced.append(None)
                    replaced.append(chunk)
            parts = replaced
        return "".join(REDACTED if part is None else part for part in parts)

    def contains(self, text: str) -> bool:
        """Whether *text* holds any known value (a check after redacting in place)."""
        return any(value in text for value in self._values)

    def holdback(self, text: str) -> int:
        """Length of the longest tail of *text* that could be the start of a value.

        A stream that is written piecewise keeps that tail until the next write, so a
        value split across two writes is still seen whole.
        """
        keep = 0
        size = len(text)
        for value in self._values:
            # A tail can start a value only where the value's first character is: find
            # those (in C) instead of slicing at every position (a stream writes often).
            first = value[0]
            start = text.find(first, max(0, size - len(value) + 1), size - keep)
            while start != -1:
                if value.startswith(text[start:]):
                    keep = size - start
                    break
                start = text.find(first, start + 1, size - keep)
        return keep

    def __len__(self) -> int:
        return len(self._values)

    @property
    def generation(self) -> object:
        """Another object once values are added: text redacted in the same generation
        needs no second pass."""
        return self._values


def redact_json(value: Any, redactor: Redactor) -> Any:
    """A copy of a JSON-like *value* with every string (and mapping key) redacted.

    Numbers, booleans and ``None`` are kept as they are; tuples become lists.
    """
    if not len(redactor):
        return value
    if isinstance(value, str):
        return redactor.redact(value)
    if isinstance(value, Mapping):
        return {
            (redactor.redact(key) if isinstance(key, str) else key): redact_json(item, redactor)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_json(item, redactor) for item in value]
    return value


#: ATIF fields that identify the document or hold an enumeration: the upload planner
#: checks them, and a short secret (values of any length are redacted) must not turn
#: ``"source": "agent"`` into something it refuses.
_ATIF_KEEP = frozenset(
    {
        "schema_version",
        "session_id",
        "trajectory_id",
        "name",
        "version",
        "step_id",
        "source",
        "timestamp",
        "type",
        "media_type",
        "rollout_id",
        "request_extra_fields",
    }
)
#: Tool-call ids: a rollout chooses them, so one may hold a value. Such an id is replaced
#: by a placeholder numbered per document, the same for the call and its result, so the
#: observation still names its call (what the upload planner checks).
_ATIF_CALL_IDS = frozenset({"tool_call_id", "source_call_id"})
#: ATIF fields whose content is free-form JSON: keys are data there, so they are
#: redacted too.
_ATIF_FREE = frozenset(
    {
        "extra",
        "arguments",
        "tool_definitions",
        "label",
        "request_metadata",
        "sample_metrics",
        "sample_extra_fields",
        "unmatched_llm_call_metrics",
    }
)


def redact_trajectory(document: Mapping[str, Any], redactor: Redactor) -> dict[str, Any]:
    """*document* (an ATIF trajectory) with secret values replaced in its free text.

    Messages, reasoning, tool arguments and observations, labels, metadata and metrics
    are redacted (keys of free-form objects too); the schema's own keys and the
    identity and enumeration fields the upload planner checks are kept.
    """
    if not len(redactor):
        return dict(document)
    return _redact_schema(document, redactor, top=True, ids={})


def _redacted_call_id(value: Any, redactor: Redactor, ids: dict[str, str]) -> Any:
    if not isinstance(value, str) or not redactor.contains(value):
        return value
    if value not in ids:
        ids[value] = f"call_redacted_{len(ids) + 1}"
    return ids[value]


def _redact_schema(
    node: Mapping[str, Any], redactor: Redactor, *, top: bool, ids: dict[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _ATIF_KEEP:
            out[key] = value
        elif key in _ATIF_CALL_IDS:
            out[key] = _redacted_call_id(value, redactor, ids)
        elif top and key == "extra" and isinstance(value, Mapping):
            # extra.osmosis is ours (identity the planner checks); the rest is the user's.
            out[key] = {
                (k if k == "osmosis" else redactor.redact(str(k))): (
                    _redact_schema(v, redactor, top=False, ids=ids)
                    if k == "osmosis" and isinstance(v, Mapping)
                    else redact_json(v, redactor)
                )
                for k, v in value.items()
            }
        elif key in _ATIF_FREE:
            out[key] = redact_json(value, redactor)
        else:
            out[key] = _redact_schema_value(value, redactor, ids)
    return out


def _redact_schema_value(value: Any, redactor: Redactor, ids: dict[str, str]) -> Any:
    if isinstance(value, Mapping):
        return _redact_schema(value, redactor, top=False, ids=ids)
    if isinstance(value, (list, tuple)):
        return [_redact_schema_value(item, redactor, ids) for item in value]
    if isinstance(value, str):
        return redactor.redact(value)
    return value


_FOR_MESSAGES: list[Redactor] = []  # what this process's latest session redacts from output


def use_for_messages(redactor: Redactor) -> None:
    """Make :func:`scrub` redact what *redactor* redacts (the session's output redactor)."""
    _FOR_MESSAGES[:] = [redactor]


def scrub(text: str, extra: Iterable[str] = (), *, extra_min_length: int = 4) -> str:
    """*text* with every secret this process knows replaced: the rule for messages.

    Error text from providers, judges and rollouts goes through here: the values the
    session redacts from output (``[secrets]``, ambient provider keys:
    :func:`use_for_messages`), the values of environment variables named like secrets
    (:data:`SECRET_NAME`, 8 characters or more) and *extra* (e.g. a route's ``api_key``),
    each in its plain, ``repr`` and JSON forms. Call it before cutting *text* short, so no
    prefix of a value survives the cut.
    """
    if _FOR_MESSAGES:
        text = _FOR_MESSAGES[0].redact(text)
    redactor = Redactor(min_length=extra_min_length)
    redactor.extend(extra)
    redactor.extend(
        value
        for name, value in os.environ.items()
        if len(value) >= MIN_REDACTED_LENGTH and SECRET_NAME.search(name)
    )
    return redactor.redact(text)
