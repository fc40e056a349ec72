"""ATIF trajectories for ``rollout_trials/<rollout_id>/trajectory.json``.

Produces the document the Osmosis rollout server writes for a sample
(contract §7.6), so that ``osmosis eval upload`` accepts it and the platform
renders it like a run of the official CLI: roles become steps, ``tool`` messages
fold into the preceding agent step's observation, inline ``usage``/``model`` on
assistant messages become step metrics and model name, and platform context
lives under ``extra.osmosis``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_osmosis.core.errors import RunDirectoryError
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.atif import (
    Agent,
    FinalMetrics,
    Metrics,
    Observation,
    ObservationResult,
    Step,
    ToolCall,
    Trajectory,
)
from pytest_osmosis.results.atomic import atomic_write_bytes, write_all
from pytest_osmosis.results.index import CANONICAL_TRAJECTORY_FILENAME, TRIALS_DIRNAME
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


def write_trajectory(trial_dir: str | Path, doc: Mapping[str, Any]) -> None:
    """Atomically write *doc* as ``trial_dir/trajectory.json`` (no trailing newline).

    Not fsync'd, like the SDK's: the journal is the durable record, and a lost
    trajectory only drops ``trajectory_filename`` from the index. Raises
    ``ValueError`` for a non-finite number (the SDK then writes no trajectory).
    """
    data = format_trajectory_json(doc).encode("utf-8")
    # A string join: a Path here (and its str for the write) cost more than the join, per row.
    path = os.path.join(trial_dir, CANONICAL_TRAJECTORY_FILENAME)
    atomic_write_bytes(path, data, durable=False)


# --------------------------------------------------------------------------- #
# Conversion
# --------------------------------------------------------------------------- #


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
    calls = [_CallUsage.model_validate(dict(entry)) for entry in step_usage or ()]
    unmatched = _apply_call_usage(steps, calls)
    final_metrics = _final_metrics(calls) or FinalMetrics()
    final_metrics.total_steps = len(steps)
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
    trajectory = Trajectory(
        session_id=rollout_id,
        trajectory_id=rollout_id,
        agent=Agent(name=PRODUCER_NAME, version=sdk_version, model_name=model_name),
        steps=steps,
        final_metrics=final_metrics,
        extra={"osmosis": {k: v for k, v in osmosis.items() if v is not None}},
    )
    return trajectory.model_dump(mode="json", exclude_none=True)


def _messages_to_steps(messages: Sequence[Mapping[str, Any]]) -> list[Step]:
    steps: list[Step] = []
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
                extra["tool_calls"] = [call.model_dump(exclude_none=True) for call in tool_calls]
            reasoning = None
            tool_calls = None
        is_agent = source == "agent"
        metrics = _message_metrics(message) if is_agent else None
        steps.append(
            Step(
                step_id=len(steps) + 1,
                timestamp=_message_timestamp(message),
                source=source,
                message=_flatten_content(message.get("content")),
                reasoning_content=reasoning,
                tool_calls=tool_calls,
                model_name=_message_model(message) if is_agent else None,
                metrics=metrics,
                llm_call_count=1 if metrics is not None else None,
                extra=extra,
            )
        )
    return steps


def _fold_tool_result(steps: list[Step], message: Mapping[str, Any]) -> None:
    """Attach a ``tool``/``function`` message to the preceding agent step's observation."""
    call_id = message.get("tool_call_id")
    target = steps[-1] if steps and steps[-1].source == "agent" else None
    known = {call.tool_call_id for call in (target.tool_calls or ())} if target else set()
    matched = call_id in known
    result = ObservationResult(
        source_call_id=call_id if matched else None,
        content=_flatten_content(message.get("content")),
        extra=None if matched else {"tool_call_id": call_id},
    )
    if target is None:
        steps.append(
            Step(
                step_id=len(steps) + 1,
                source="system",
                message="",
                observation=Observation(results=[result]),
                extra={"original_role": str(message.get("role", "tool"))},
            )
        )
    elif target.observation is None:
        target.observation = Observation(results=[result])
    else:
        target.observation.results.append(result)


def _tool_calls(raw: Any) -> list[ToolCall] | None:
    if not raw or isinstance(raw, str) or not isinstance(raw, Sequence):
        return None
    calls: list[ToolCall] = []
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping):
            continue
        function = item.get("function")
        if not isinstance(function, Mapping):
            function = {}
        calls.append(
            ToolCall(
                tool_call_id=str(item.get("id") or f"call_{index}"),
                function_name=str(function.get("name") or "unknown"),
                arguments=_tool_arguments(function.get("arguments")),
            )
        )
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


def _message_metrics(message: Mapping[str, Any]) -> Metrics | None:
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
    try:
        metrics = Metrics(
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            cost_usd=usage.get("cost_usd"),
            extra=extra or None,
        )
    except ValidationError:
        return None
    return metrics if metrics.model_dump(exclude_none=True) else None


def _apply_call_usage(steps: list[Step], calls: list[_CallUsage]) -> list[dict[str, Any]] | None:
    """Overlay per-call metrics on agent steps when the counts match; else return them."""
    if not calls:
        return None
    agent_steps = [step for step in steps if step.source == "agent"]
    if len(agent_steps) != len(calls):
        return [call.model_dump(exclude_none=True) for call in calls]
    for step, call in zip(agent_steps, calls, strict=True):
        payload = call.model_dump(exclude={"model_name"}, exclude_none=True)
        if payload:
            reported = Metrics.model_validate(payload)
            step.metrics = (
                reported
                if step.metrics is None
                else step.metrics.model_copy(update=reported.model_dump(exclude_none=True))
            )
        step.model_name = call.model_name or step.model_name
        step.llm_call_count = 1
    return None


def _final_metrics(calls: list[_CallUsage]) -> FinalMetrics | None:
    if not calls:
        return None
    prompt = [c.prompt_tokens for c in calls if c.prompt_tokens is not None]
    completion = [c.completion_tokens for c in calls if c.completion_tokens is not None]
    cached = [c.cached_tokens for c in calls if c.cached_tokens is not None]
    cost = [c.cost_usd for c in calls if c.cost_usd is not None]
    totals = FinalMetrics(
        total_prompt_tokens=sum(prompt) if prompt else None,
        total_completion_tokens=sum(completion) if completion else None,
        total_cached_tokens=sum(cached) if cached else None,
        total_cost_usd=sum(cost) if cost else None,
    )
    return totals if totals.model_dump(exclude_none=True) else None


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
