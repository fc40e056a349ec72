"""ATIF trajectories for ``rollout_trials/<rollout_id>/trajectory.json``.

Produces the document the Osmosis rollout server writes for a sample
(contract §7.6), so that ``osmosis eval upload`` accepts it and the platform
renders it like a run of the official CLI: roles become steps, ``tool`` messages
fold into the preceding agent step's observation, inline ``usage``/``model`` on
assistant messages become step metrics and model name, and platform context
lives under ``extra.osmosis``.
"""

from __future__ import annotations

import functools
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from pytest_osmosis.core.errors import RunDirectoryError
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.atif import FinalMetrics, Metrics, Step, ToolCall
from pytest_osmosis.results.atomic import atomic_write_bytes, write_all
from pytest_osmosis.results.index import (
    CANONICAL_TRAJECTORY_FILENAME,
    TRIALS_DIRNAME,
    WrittenTrajectory,
)
from pytest_osmosis.results.journal import is_single_path_segment

#: ``agent.name`` of every SDK-produced document; the platform keys on it.
PRODUCER_NAME = "osmosis-rollout-sdk"
HEALTH_CHECK_FILENAME = ".osmosis-health-check"
_HEALTH_CHECK_CONTENT = b"osmosis-health-check"

_SOURCES: dict[str, Literal["system", "user", "agent"]] = {
    "system": "system",
    "developer": "system",
    "assistant": "agent",
    "user": "user",
}


# --------------------------------------------------------------------------- #
# Trial directory
# --------------------------------------------------------------------------- #


def prepare_trial_dir(
    run_dir: Path, rollout_id: str, *, attempts: int = 3, backoff_s: float = 0.5
) -> Path | None:
    """Create ``rollout_trials/<id>/artifacts`` plus the writability marker.

    Returns the artifacts dir for ``ctx.artifacts_dir``, or ``None`` when it stays
    unusable after *attempts* tries (the SDK hands the rollout ``None`` then).
    """
    if not is_single_path_segment(rollout_id):
        raise RunDirectoryError(f"rollout_id must be a single path segment, got {rollout_id!r}")
    # os calls on strings: pathlib's mkdir(parents=True) and joins cost more than the
    # syscalls themselves, once per row.
    trial_dir = os.path.join(run_dir, TRIALS_DIRNAME, rollout_id)
    artifacts = os.path.join(trial_dir, "artifacts")
    marker = os.path.join(trial_dir, HEALTH_CHECK_FILENAME)
    for attempt in range(max(1, attempts)):
        try:
            try:
                os.mkdir(trial_dir)
            except FileExistsError:
                pass
            except FileNotFoundError:
                os.makedirs(trial_dir, exist_ok=True)
            try:
                os.mkdir(artifacts)
            except FileExistsError:
                if not os.path.isdir(artifacts):
                    raise
            _write_marker(marker)
            return Path(artifacts)
        except OSError:
            if attempt < attempts - 1:
                time.sleep(backoff_s * (2**attempt))
    return None


def _write_marker(marker: str) -> None:
    """The marker, unless it exists: one ``O_EXCL`` create (a buffered ``open`` after an
    ``exists`` check cost four more system calls a row, each a GIL hand-off)."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return
    try:
        write_all(fd, _HEALTH_CHECK_CONTENT)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- #
# Formatting
# --------------------------------------------------------------------------- #

_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"
_MULTILINE_NUMBER_ARRAY = re.compile(
    r"\[\s*\n\s*" + _NUMBER + r"(?:\s*,\s*\n\s*" + _NUMBER + r")*\s*\n\s*\]"
)
_NUMBER_TOKEN = re.compile(_NUMBER)


def format_trajectory_json(document: Mapping[str, Any]) -> str:
    """Indent-2 JSON with arrays of plain numbers kept on one line (the SDK's layout).

    Token-id and logprob arrays would otherwise take one line per element.
    """
    text = json.dumps(document, indent=2, allow_nan=False)
    return _MULTILINE_NUMBER_ARRAY.sub(
        lambda match: "[" + ", ".join(_NUMBER_TOKEN.findall(match.group(0))) + "]", text
    )


def write_trajectory(trial_dir: str | Path, doc: Mapping[str, Any]) -> WrittenTrajectory | None:
    """Atomically write *doc* as ``trial_dir/trajectory.json`` (no trailing newline).

    Not fsync'd, like the SDK's: the journal is the durable record, and a lost
    trajectory only drops ``trajectory_filename`` from the index. Raises
    ``ValueError`` for a non-finite number (the SDK then writes no trajectory).
    Returns what was written, for the run directory to check and copy without reading
    the file again (None when the file was replaced at once).
    """
    data = format_trajectory_json(doc).encode("utf-8")
    # A string join: a Path here (and its str for the write) cost more than the join, per row.
    path = os.path.join(trial_dir, CANONICAL_TRAJECTORY_FILENAME)
    signature = atomic_write_bytes(path, data, durable=False, identify=True)
    return WrittenTrajectory.of(doc, data, signature)


# --------------------------------------------------------------------------- #
# Conversion
# --------------------------------------------------------------------------- #
#
# The document is built as plain dicts in the schema's field order (atif.py), None fields
# left out, and made JSON-ready by one pydantic-core pass: what building the pydantic
# models and dumping them gave, byte for byte, at a fraction of the cost per row. The
# models still decide every value that is not already of its field's exact type (a
# token count given as "12", a bool, a non-finite cost, a non-string argument name): such
# a value goes through the model, which coerces it or raises its ValidationError.

_METRICS_FIELDS = (
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cost_usd",
    "prompt_token_ids",
    "completion_token_ids",
    "logprobs",
    "extra",
)
_CALL_FIELDS = (*_METRICS_FIELDS[:-1], "model_name", "extra")
_INT_FIELDS = frozenset(("prompt_tokens", "completion_tokens", "cached_tokens"))
_STEP_FIELDS = tuple(Step.model_fields)  # a step's keys, in the written order


class _CallUsage(BaseModel):
    """One LLM call's metrics reported by the caller, in dispatch order."""

    model_config: ClassVar[ConfigDict] = ConfigDict(extra="ignore")

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    model_name: str | None = None
    extra: dict[str, Any] | None = None


def _exact(name: str, value: Any, *, finite: bool) -> bool:
    """Whether *value* is already what field *name* holds (the model would keep it as is)."""
    if name in _INT_FIELDS:
        return type(value) is int
    if name == "cost_usd":
        return type(value) is float and (not finite or math.isfinite(value))
    if name == "model_name":
        return type(value) is str
    return False  # token ids, logprobs, extra: rare; the model checks them


def _call_usage(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One reported call as ``_CallUsage`` dumps it (None fields left out)."""
    values = {name: entry.get(name) for name in _CALL_FIELDS}
    if all(v is None or _exact(k, v, finite=False) for k, v in values.items()):
        return {k: v for k, v in values.items() if v is not None}
    return _CallUsage.model_validate(dict(entry)).model_dump(exclude_none=True)


def _metrics(values: Mapping[str, Any]) -> dict[str, Any]:
    """``Metrics`` of *values* as dumped (None left out); raises ``ValidationError``."""
    if all(v is None or k == "extra" or _exact(k, v, finite=True) for k, v in values.items()):
        return {k: values[k] for k in _METRICS_FIELDS if values.get(k) is not None}
    return Metrics.model_validate(dict(values)).model_dump(exclude_none=True)


def build_trajectory(
    *,
    rollout_id: str,
    messages: Sequence[Mapping[str, Any]],
    label: str | None,
    reward: float | None,
    sample_metrics: Mapping[str, Any] | None,
    sample_extra_fields: Mapping[str, Any] | None,
    request_metadata: Mapping[str, Any] | None,
    request_extra_fields: Mapping[str, Any] | None,
    sdk_version: str,
    model_name: str | None = None,
    step_usage: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ATIF v1.7 document for one sample, as a JSON-ready dict.

    *messages* is ``sample.trajectory_messages`` (OpenAI chat shape). *step_usage*
    optionally gives per-call metrics (one mapping per agent step, in order); when
    its length differs from the agent-step count it is kept under
    ``extra.osmosis.unmatched_llm_call_metrics`` instead of being mis-attributed.
    Raises ``ValueError`` when no valid document can be formed (e.g. no
    messages); the SDK then writes no trajectory.
    """
    steps = _messages_to_steps(messages)
    calls = [_call_usage(entry) for entry in step_usage or ()]
    unmatched = _apply_call_usage(steps, calls)
    final_metrics = _final_metrics(calls)
    if not steps:
        raise ValueError("the sample has no messages: a trajectory needs at least one step")
    final_metrics["total_steps"] = len(steps)
    osmosis: dict[str, Any] = {
        "rollout_id": rollout_id,
        "label": label,
        "reward": None if reward is None else float(reward),
        "sample_metrics": dict(sample_metrics) if sample_metrics else None,
        "sample_extra_fields": dict(sample_extra_fields) if sample_extra_fields else None,
        "request_metadata": None if request_metadata is None else dict(request_metadata),
        "request_extra_fields": (
            None if request_extra_fields is None else dict(request_extra_fields)
        ),
        "unmatched_llm_call_metrics": unmatched,
    }
    agent = {"name": PRODUCER_NAME, "version": sdk_version}
    if model_name is not None:
        agent["model_name"] = model_name
    return {
        "schema_version": "ATIF-v1.7",
        "session_id": rollout_id,
        "trajectory_id": rollout_id,
        "agent": agent,
        "steps": [_step_document(step) for step in steps],
        "final_metrics": final_metrics,
        "extra": _free_form(
            {"osmosis": {k: v for k, v in osmosis.items() if v is not None}}, "extra"
        ),
    }


def _step_document(step: dict[str, Any]) -> dict[str, Any]:
    """A step as written: its set fields in order, its free-form objects JSON-ready."""
    document: dict[str, Any] = {}
    for name in _STEP_FIELDS:
        value = step.get(name)
        if value is None:
            continue
        if name == "extra":
            value = _free_form(value, "extra", step)
        elif name == "tool_calls":
            value = [
                {
                    **call,
                    "arguments": _free_form(
                        call["arguments"], f"tool_calls.{index}.arguments", step
                    ),
                }
                for index, call in enumerate(value)
            ]
        elif name == "observation":
            value = {
                "results": [
                    {**result, "extra": _free_form(result["extra"], "observation.extra", step)}
                    if "extra" in result
                    else result
                    for result in value["results"]
                ]
            }
        elif name == "metrics" and "extra" in value:
            value = {**value, "extra": _free_form(value["extra"], "metrics.extra", step)}
        document[name] = value
    return document


def _free_form(
    fields: dict[str, Any], field: str, step: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``dict[str, Any]`` field's value (``extra``, tool arguments) as the models' JSON dump
    wrote it: the user's tuples, datetimes or models made JSON, None kept, and the same
    nesting limit (measured: a model's field counts one level, as the object as ``Any`` does).
    A value it cannot serialize raises ``PydanticSerializationError`` (a ``ValueError``); a
    key no UTF-8 file can hold (a lone surrogate) a ``ValueError`` naming where, *field* (of
    *step*) and the keys below it, as the model's errors name theirs."""
    try:
        return cast("dict[str, Any]", _any().dump_python(fields, mode="json", exclude_none=True))
    except UnicodeEncodeError as exc:
        location = [field] if step is None else [f"steps.{step['step_id'] - 1}", field]
        key = _unencodable_key(fields, location)
        what = (
            exc if key is None else f"the key {key!r} is not valid Unicode text (a lone surrogate)"
        )
        raise ValueError(f"{'.'.join(location)}: {what}") from None


def _unencodable_key(value: Any, location: list[str]) -> str | None:
    """The first key under *value* UTF-8 cannot encode; the keys above it appended to
    *location*. None if there is none."""
    items = value.items() if isinstance(value, Mapping) else enumerate(value)
    for key, child in items:
        if isinstance(key, str):
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                return key
        if isinstance(child, (Mapping, list, tuple)):
            location.append(str(key))
            found = _unencodable_key(child, location)
            if found is not None:
                return found
            location.pop()
    return None


@functools.cache
def _any() -> TypeAdapter[Any]:
    return TypeAdapter(Any)


def _messages_to_steps(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Steps as dicts keyed by ``Step``'s fields (None: not set)."""
    steps: list[dict[str, Any]] = []
    for message in messages:
        role = str(message.get("role", ""))
        if role in ("tool", "function"):
            _fold_tool_result(steps, message)
            continue
        source = _SOURCES.get(role)
        extra: dict[str, Any] | None = None
        if source is None:
            source = "user"
            extra = {"original_role": role}
        reasoning = message.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            reasoning = json.dumps(reasoning, ensure_ascii=False, default=str)
        tool_calls = _tool_calls(message.get("tool_calls"))
        if source != "agent" and (reasoning is not None or tool_calls):
            # Agent-only in ATIF: keep them under extra rather than fail the document.
            extra = dict(extra or {})
            if reasoning is not None:
                extra["reasoning_content"] = reasoning
            if tool_calls:
                extra["tool_calls"] = tool_calls
            reasoning = None
            tool_calls = None
        is_agent = source == "agent"
        metrics = _message_metrics(message) if is_agent else None
        steps.append(
            {
                "step_id": len(steps) + 1,
                "timestamp": _message_timestamp(message),
                "source": source,
                "model_name": _message_model(message) if is_agent else None,
                "message": _flatten_content(message.get("content")),
                "reasoning_content": reasoning,
                "tool_calls": tool_calls,
                "observation": None,
                "metrics": metrics,
                "llm_call_count": 1 if metrics is not None else None,
                "extra": extra,
            }
        )
    return steps


def _fold_tool_result(steps: list[dict[str, Any]], message: Mapping[str, Any]) -> None:
    """Attach a ``tool``/``function`` message to the preceding agent step's observation."""
    call_id = message.get("tool_call_id")
    target = steps[-1] if steps and steps[-1]["source"] == "agent" else None
    known = {call["tool_call_id"] for call in (target["tool_calls"] or ())} if target else set()
    result: dict[str, Any]
    if call_id in known:
        result = {"source_call_id": call_id, "content": _flatten_content(message.get("content"))}
    else:
        result = {"content": _flatten_content(message.get("content"))}
        result["extra"] = {"tool_call_id": call_id}
    if target is None:
        steps.append(
            {
                "step_id": len(steps) + 1,
                "source": "system",
                "message": "",
                "observation": {"results": [result]},
                "extra": {"original_role": str(message.get("role", "tool"))},
            }
        )
    elif target["observation"] is None:
        target["observation"] = {"results": [result]}
    else:
        target["observation"]["results"].append(result)


def _tool_calls(raw: Any) -> list[dict[str, Any]] | None:
    if not raw or isinstance(raw, str) or not isinstance(raw, Sequence):
        return None
    calls: list[dict[str, Any]] = []
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping):
            continue
        function = item.get("function")
        if not isinstance(function, Mapping):
            function = {}
        call = {
            "tool_call_id": str(item.get("id") or f"call_{index}"),
            "function_name": str(function.get("name") or "unknown"),
            "arguments": _tool_arguments(function.get("arguments")),
        }
        if not all(type(name) is str for name in call["arguments"]):
            # An argument name that is not a string: ToolCall coerces it or says why not.
            call = ToolCall.model_validate(call).model_dump(exclude_none=True)
        calls.append(call)
    return calls or None


def _tool_arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str) and raw:
        try:
            parsed = json.loads(raw)
        except ValueError:
            return {"_raw": raw}
        return parsed if isinstance(parsed, dict) else {"_raw": raw}
    return {}


def _flatten_content(content: Any) -> str:
    """Text as is; a list of text parts joined by newlines; anything else as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [part for part in content if isinstance(part, Mapping)]
        if parts and all(part.get("type") == "text" for part in parts):
            return "\n".join(str(part.get("text", "")) for part in parts)
    return json.dumps(content, ensure_ascii=False, default=str)


def _iso(value: Any) -> str | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, tz=timezone.utc).isoformat()
        except (OSError, OverflowError, ValueError):
            return None
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).isoformat()
        except ValueError:
            return None
    return None


def _message_timestamp(message: Mapping[str, Any]) -> str | None:
    for name in ("created_at", "timestamp", "completed_at"):
        stamp = _iso(message.get(name))
        if stamp:
            return stamp
    extra = message.get("extra")
    return _iso(extra.get("timestamp")) if isinstance(extra, Mapping) else None


def _raw_response(message: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A raw completion response kept under ``extra.response`` (Harbor's convention)."""
    extra = message.get("extra")
    response = extra.get("response") if isinstance(extra, Mapping) else None
    return response if isinstance(response, Mapping) else None


def _message_model(message: Mapping[str, Any]) -> str | None:
    model = message.get("model") or message.get("model_name")
    if not model:
        response = _raw_response(message)
        model = response.get("model") if response else None
    return str(model) if model else None


def _message_metrics(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """Step metrics from inline ``usage`` (chat-completions or Responses API names)."""
    usage = message.get("usage")
    if not isinstance(usage, Mapping):
        response = _raw_response(message)
        usage = response.get("usage") if response else None
        if not isinstance(usage, Mapping):
            return None
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    cached = usage.get("cached_tokens")
    if cached is None and isinstance(details, Mapping):
        cached = details.get("cached_tokens")
    extra: dict[str, Any] = {}
    for key in (
        "prompt_tokens_details",
        "input_tokens_details",
        "completion_tokens_details",
        "output_tokens_details",
    ):
        value = usage.get(key)
        if isinstance(value, Mapping) and value:
            extra[key] = dict(value)
    # `is None`, not `or`: a real 0 must not fall through to the other API's name.
    prompt = usage.get("prompt_tokens")
    if prompt is None:
        prompt = usage.get("input_tokens")
    completion = usage.get("completion_tokens")
    if completion is None:
        completion = usage.get("output_tokens")
    values = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_tokens": cached,
        "cost_usd": usage.get("cost_usd"),
        "extra": extra or None,
    }
    try:
        metrics = _metrics(values)
    except ValidationError:  # usage the schema cannot hold: the step has no metrics
        return None
    return metrics or None


def _apply_call_usage(
    steps: list[dict[str, Any]], calls: list[dict[str, Any]]
) -> list[dict[str, Any]] | None:
    """Overlay per-call metrics on agent steps when the counts match; else return them."""
    if not calls:
        return None
    agent_steps = [step for step in steps if step["source"] == "agent"]
    if len(agent_steps) != len(calls):
        return [dict(call) for call in calls]
    for step, call in zip(agent_steps, calls, strict=True):
        payload = {k: v for k, v in call.items() if k != "model_name"}
        if payload:
            reported = _metrics(payload)
            inline = step["metrics"]
            step["metrics"] = (
                reported
                if inline is None
                else {
                    k: reported[k] if k in reported else inline[k]
                    for k in _METRICS_FIELDS
                    if k in reported or k in inline
                }
            )
        step["model_name"] = call.get("model_name") or step["model_name"]
        step["llm_call_count"] = 1
    return None


_TOTALS = (
    ("total_prompt_tokens", "prompt_tokens"),
    ("total_completion_tokens", "completion_tokens"),
    ("total_cached_tokens", "cached_tokens"),
    ("total_cost_usd", "cost_usd"),
)


def _final_metrics(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """``FinalMetrics`` totals of the reported calls (none reported: empty)."""
    totals: dict[str, Any] = {}
    for total, name in _TOTALS:
        values = [call[name] for call in calls if name in call]
        if values:
            totals[total] = sum(values)
    cost = totals.get("total_cost_usd")
    if cost is not None and not math.isfinite(cost):
        FinalMetrics(**totals)  # raises the schema's ValidationError (finite floats only)
    return totals


def trial_dir_of(run_dir: Path, rollout_id: str) -> Path:
    """``<run_dir>/rollout_trials/<rollout_id>``."""
    return run_dir / TRIALS_DIRNAME / rollout_id


# --------------------------------------------------------------------------- #
# Back to messages (regrade)
# --------------------------------------------------------------------------- #

_ROLES = {"system": "system", "user": "user", "agent": "assistant"}


def trajectory_messages(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages a trajectory was built from, as far as ATIF kept them.

    The inverse of :func:`build_trajectory` for a regrade, which grades the sample the
    run recorded: steps become messages again (an agent step an ``assistant`` message
    with its ``tool_calls``, arguments as JSON text), an observation's results become
    the ``tool`` messages after it, and a role ATIF has no source for comes back from
    ``extra.original_role``. What ATIF does not keep stays lost: content parts other than
    text were written as JSON text, ``developer`` reads ``system``, and inline usage is
    not put back.
    """
    messages: list[dict[str, Any]] = []
    steps = document.get("steps")
    for step in steps if isinstance(steps, Sequence) else ():
        if not isinstance(step, Mapping):
            continue
        extra = _mapping(step.get("extra"))
        original = extra.get("original_role")
        orphan_tools = original in ("tool", "function") and not step.get("message")
        if not orphan_tools:
            role = original if isinstance(original, str) and original else None
            message: dict[str, Any] = {
                "role": role or _ROLES.get(str(step.get("source")), "user"),
                "content": _message_content(step.get("message")),
            }
            reasoning = step.get("reasoning_content", extra.get("reasoning_content"))
            if isinstance(reasoning, str):
                message["reasoning_content"] = reasoning
            calls = step.get("tool_calls") or extra.get("tool_calls")
            if isinstance(calls, Sequence) and calls:
                message["tool_calls"] = [
                    _openai_tool_call(call) for call in calls if isinstance(call, Mapping)
                ]
            messages.append(message)
        observation = step.get("observation")
        results = observation.get("results") if isinstance(observation, Mapping) else None
        for result in results if isinstance(results, Sequence) else ():
            if not isinstance(result, Mapping):
                continue
            call_id = result.get("source_call_id") or _mapping(result.get("extra")).get(
                "tool_call_id"
            )
            tool: dict[str, Any] = {
                "role": "tool",
                "content": _message_content(result.get("content")),
            }
            if call_id is not None:
                tool["tool_call_id"] = call_id
            messages.append(tool)
    return messages


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _message_content(value: Any) -> Any:
    """ATIF message text as chat content; a list of ATIF parts as chat parts."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, Sequence):
        parts: list[dict[str, Any]] = []
        for part in value:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append({"type": "text", "text": part.get("text", "")})
            elif isinstance(part, Mapping):
                parts.append(dict(part))
        return parts
    return json.dumps(value, ensure_ascii=False, default=str)


def _openai_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    arguments = call.get("arguments")
    if isinstance(arguments, Mapping) and set(arguments) == {"_raw"}:
        text = str(arguments["_raw"])
    else:
        text = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {
        "id": call.get("tool_call_id"),
        "type": "function",
        "function": {"name": call.get("function_name"), "arguments": text},
    }
