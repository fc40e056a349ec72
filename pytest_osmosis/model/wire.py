"""The wire format: a rollout's chat body in, LiteLLM's call kwargs out, and back again.

A body is forwarded as osmosis-ai 0.3.8's bridge forwards it (every inference field,
fields that would change the bridge's configuration refused); the answer goes back as
the chat.completion the SDK writes, with usage for the row's token count. An ``openai/*``
model at OpenAI is called through the Responses API, so chat bodies and Responses
results are converted here, in one place, both ways.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

from pytest_osmosis.model.routes import ModelRoute, _api_base, _official_openai

# A judge call (`RubricGrader`) is the rubric command's call made through the bridge: only
# these fields reach the judge, with ``drop_params`` as the rubric command sets it.
_JUDGE_FORWARDED = (
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "tools",
    "tool_choice",
    "max_completion_tokens",
    "stop",
    "response_format",
    "parallel_tool_calls",
    "reasoning_effort",
)

# A rollout's call is forwarded as osmosis-ai 0.3.8's bridge forwards it (its
# ``request_policy``): every inference field of the body, ``extra_body`` merged in; these
# belong to the bridge's envelope and are not forwarded...
_ENVELOPE = frozenset({"model", "messages", "stream", "stream_options", "n"})
# ...and a body naming one of these (or LiteLLM's own call settings) would change the
# model, the credentials, the endpoint or the accounting: refused, never run or dropped.
_CONTROL_NAMES = frozenset(
    {
        "base_url", "extra_headers", "deployment_id", "drop_params", "additional_drop_params",
        "callbacks", "success_callback", "failure_callback", "ssl_verify", "mock_delay",
        "mock_tool_calls", "initial_prompt_value", "original_function", "engine", "config",
        "user_api_key_end_user_id", "wx_credentials", "apikey", "url", "custom_endpoint",
        "deployment_url", "zen_api_key", "endpoint_url", "default_headers", "api_type",
        "model_id", "account_id", "predibase_tenant_id", "project_id", "space_id", "region",
        "workspace_id", "anthropic-workspace-id", "anthropic_workspace_id",
        "use_psc_endpoint_format", "method", "user_config", "user_agent",
        "databricks_user_agent", "braintrust_api_key", "braintrust_host",
        "braintrust_project", "lunary_public_key", "posthog_host", "slack_webhook_url",
        "models", "preset", "usage", "contents", "systemInstruction", "system_instruction",
        "system", "prompt", "input", "inputText",
    }
)  # fmt: skip
_CONTROL_PREFIXES = (
    "_", "litellm_", "aws_", "azure_", "vertex_", "watsonx_", "sagemaker_", "oci_", "wx_", "s3_",
)  # fmt: skip
_REASONING_FIELDS = ("reasoning_content", "thinking_blocks", "reasoning_details")


def _field(obj: Any, name: str, default: Any = None) -> Any:
    """An attribute of a LiteLLM object or a key of a converted (dict) response."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _plain(value: Any) -> Any:
    """JSON data from LiteLLM's pydantic objects (None fields left out), as the SDK sends it."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump(exclude_none=True))
    if hasattr(value, "__dict__"):
        return {k: _plain(v) for k, v in vars(value).items() if not k.startswith("_")}
    return value


def _message_of(choice: Any) -> Any:
    message = _field(choice, "message")
    return message if message is not None else _field(choice, "delta", {})


def _reasoning(choice: Any) -> dict[str, Any]:
    """Reasoning a provider returned (Anthropic thinking blocks, ...), to hand back to it."""
    message = _message_of(choice)
    provider_fields = _field(message, "provider_specific_fields")
    found: dict[str, Any] = {}
    for name in _REASONING_FIELDS:
        value = _field(message, name)
        if value is None:
            value = _field(provider_fields, name)
        if value is not None:
            found[name] = _plain(value)
    return found


def _usage(response: Any) -> dict[str, int] | None:
    usage = _field(response, "usage")
    if usage is None:
        return None
    prompt = _field(usage, "prompt_tokens")
    if prompt is None:
        prompt = _field(usage, "input_tokens", 0)
    completion = _field(usage, "completion_tokens")
    if completion is None:
        completion = _field(usage, "output_tokens", 0)
    total = _field(usage, "total_tokens")
    if total is None:
        total = int(prompt or 0) + int(completion or 0)
    return {
        "prompt_tokens": int(prompt or 0),
        "completion_tokens": int(completion or 0),
        "total_tokens": int(total or 0),
    }


def _call_metrics(response: Any, usage: dict[str, int] | None) -> dict[str, int]:
    """One call's entry for the trajectory, named as the SDK's ``LlmCallMetrics``."""
    if usage is None:
        return {}
    entry = {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
    }
    details = _field(_field(response, "usage"), "prompt_tokens_details")
    cached = _field(details, "cached_tokens")
    if isinstance(cached, int) and not isinstance(cached, bool):
        entry["cached_tokens"] = cached
    return entry


def _payload(
    response: Any, model: str, usage: dict[str, int] | None, *, stream: bool
) -> dict[str, Any]:
    """OpenAI chat.completion (or its single-chunk stream form), as osmosis-ai 0.3.8 writes it.

    Content is always a string; reasoning fields and a refusal travel with the message;
    a streamed delta carries no role, and its tool calls are indexed by position.
    """
    choices: list[dict[str, Any]] = []
    for index, choice in enumerate(_field(response, "choices", None) or []):
        message = _message_of(choice)
        content = str(_field(message, "content", "") or "")
        tool_calls = _field(message, "tool_calls")
        refusal = _field(message, "refusal")
        body: dict[str, Any] = {} if stream else {"role": "assistant"}
        body.update({"content": content, **_reasoning(choice)})
        if tool_calls:
            plain = _plain(tool_calls)
            if stream:
                plain = [
                    {**call, "index": position} if isinstance(call, dict) else call
                    for position, call in enumerate(plain if isinstance(plain, list) else [plain])
                ]
            body["tool_calls"] = plain
        if refusal is not None:
            body["refusal"] = str(refusal)
        choices.append(
            {
                "index": int(_field(choice, "index", index) or index),
                "delta" if stream else "message": body,
                "finish_reason": _field(choice, "finish_reason", "stop"),
            }
        )
    payload: dict[str, Any] = {
        "id": _field(response, "id", None) or "chatcmpl-osmosis",
        "object": "chat.completion.chunk" if stream else "chat.completion",
        "created": int(_field(response, "created", None) or time.time()),
        "model": model,
        "choices": choices,
    }
    if usage:
        payload["usage"] = usage
    return payload


class _BadRequest(Exception):
    """The rollout sent a body the bridge cannot forward (answered 400)."""


def _forwarded(body: dict[str, Any]) -> dict[str, Any]:
    """The request, checked for what every route needs; the call is built from it later."""
    if not isinstance(body.get("messages"), list):
        raise _BadRequest("'messages' must be a list")
    return body


def _judge_call(body: dict[str, Any]) -> dict[str, Any]:
    call: dict[str, Any] = {"drop_params": True}
    for key in _JUDGE_FORWARDED:
        value = body.get(key)
        if value is not None:
            call[key] = value
    return call


@functools.cache
def _control_names() -> frozenset[str]:
    """Names a body may not set: ours plus every LiteLLM call setting (metadata is data)."""
    import litellm
    from litellm.types.router import GenericLiteLLMParams
    from litellm.types.utils import all_litellm_params

    return (
        _CONTROL_NAMES
        | frozenset(all_litellm_params)
        | frozenset(GenericLiteLLMParams.model_fields)
        | frozenset(litellm.common_cloud_provider_auth_params["params"])
    ) - {"metadata"}


def _copied(value: Any) -> Any:
    """A copy of parsed JSON that LiteLLM may change in place (``copy.deepcopy``'s result for
    JSON data, at a fifth of its cost: a 60-message conversation is copied on every call)."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return value


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        previous = base.get(key)
        if isinstance(previous, dict) and isinstance(value, dict):
            base[key] = _merged(previous, value)
        else:
            base[key] = _copied(value)
    return base


def _inference_fields(body: dict[str, Any], route: ModelRoute) -> dict[str, Any]:
    """Every field of the body the provider should see; the route's own settings win."""
    extra = body.get("extra_body")
    if extra is not None and not isinstance(extra, dict):
        raise _BadRequest("extra_body must be a JSON object")
    # The messages are the call's bulk and are dropped here: copied once, by the caller.
    fields = _merged(
        _copied({k: v for k, v in body.items() if k not in ("extra_body", "messages")}),
        extra or {},
    )
    if fields.get("n") not in (None, 1):
        raise _BadRequest("the bridge supports only n=1")
    for key in _ENVELOPE:
        fields.pop(key, None)
    blocked = sorted(
        key for key in fields if key in _control_names() or key.startswith(_CONTROL_PREFIXES)
    )
    if blocked:
        raise _BadRequest(
            "request fields cannot override the bridge's configuration: " + ", ".join(blocked)
        )
    if "extra_body" in fields:
        raise _BadRequest("extra_body cannot contain another extra_body")
    for key in route.kwargs:
        fields.pop(key, None)
    return fields


def _chat_call(litellm: Any, body: dict[str, Any], route: ModelRoute) -> dict[str, Any]:
    """``acompletion`` kwargs: an OpenAI-compatible endpoint gets the fields as JSON
    (``extra_body``); a native provider gets them as LiteLLM's parameters, never dropped."""
    from litellm.constants import openai_compatible_providers

    fields = _inference_fields(body, route)
    resolved, provider, _, _ = litellm.get_llm_provider(
        model=route.litellm_model, api_base=_api_base(route)
    )
    native_claude = provider in {"azure_ai", "vertex_ai"} and "claude" in resolved
    openai_wire = not native_claude and (
        provider == "openrouter"
        or provider in openai_compatible_providers
        or (provider == "openai" and not _official_openai(litellm, route))
    )
    call: dict[str, Any] = {"messages": _copied(body["messages"]), "drop_params": False}
    if openai_wire:
        if fields:
            call["extra_body"] = fields
    else:
        metadata = fields.pop("metadata", None)
        if metadata is not None:
            if provider in {"openai", "azure"}:
                call["extra_body"] = {"metadata": metadata}
            elif provider == "anthropic" or native_claude:
                if not isinstance(metadata, dict) or set(metadata) - {"user_id"}:
                    raise _BadRequest("Anthropic metadata supports only user_id")
                fields["metadata"] = metadata
            else:
                raise _BadRequest(
                    f"LiteLLM cannot forward metadata to {provider}; "
                    "use its provider-specific parameter"
                )
        call.update(fields)
    call.update(route.kwargs)
    return call


def _responses_content(content: Any, *, role: Any) -> Any:
    if not isinstance(content, list):
        return content
    parts: list[Any] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text_kind = "output_text" if role == "assistant" else "input_text"
            parts.append({"type": text_kind, "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url")
            url, detail = (
                (image.get("url"), image.get("detail", "auto"))
                if isinstance(image, dict)
                else (image, "auto")
            )
            parts.append({"type": "input_image", "image_url": url, "detail": detail})
        elif kind == "file" and isinstance(part.get("file"), dict):
            keys = ("file_id", "file_data", "filename")
            parts.append(
                {"type": "input_file", **{k: part["file"][k] for k in keys if k in part["file"]}}
            )
        else:
            parts.append(part)
    return parts


def _responses_input(messages: Any) -> list[Any]:
    """Chat messages as Responses input items: tool calls and results become their own items."""
    items: list[Any] = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "tool":
            output = _responses_content(message.get("content", ""), role=role)
            if not isinstance(output, (str, list)):
                output = json.dumps(output, separators=(",", ":"))
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id", ""),
                    "output": output,
                }
            )
            continue
        calls = message.get("tool_calls")
        content = message.get("content")
        refusal = message.get("refusal") if role == "assistant" else None
        if content not in (None, ""):
            items.append({"role": role, "content": _responses_content(content, role=role)})
        elif isinstance(refusal, str) and refusal:
            items.append({"role": role, "content": [{"type": "refusal", "refusal": refusal}]})
        elif not calls:
            items.append({"role": role, "content": ""})
        if role != "assistant" or not isinstance(calls, list):
            continue
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            arguments = function.get("arguments", "")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, separators=(",", ":"))
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id", ""),
                    "name": function.get("name", ""),
                    "arguments": arguments,
                }
            )
    return items


def _responses_call(body: dict[str, Any], route: ModelRoute) -> dict[str, Any]:
    """``aresponses`` kwargs from a chat body: Responses names for the chat parameters,
    function tools flattened, anything else in ``extra_body``."""
    fields = _inference_fields(body, route)
    call: dict[str, Any] = {"input": _responses_input(body.get("messages", []))}
    # The native name wins over the newer chat limit, which wins over max_tokens.
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if key in fields:
            call["max_output_tokens"] = fields.pop(key)
    if "reasoning_effort" in fields:
        effort = fields.pop("reasoning_effort")
        reasoning = fields.get("reasoning", {})
        mapped = effort if isinstance(effort, dict) else {"effort": effort}
        if not isinstance(reasoning, dict) or any(
            key in reasoning and reasoning[key] != value for key, value in mapped.items()
        ):
            raise _BadRequest("reasoning and reasoning_effort contain conflicting settings")
        fields["reasoning"] = {**mapped, **reasoning}
    if "response_format" in fields:
        form = fields.pop("response_format")
        if (
            isinstance(form, dict)
            and form.get("type") == "json_schema"
            and isinstance(form.get("json_schema"), dict)
        ):
            form = {**{k: v for k, v in form.items() if k != "json_schema"}, **form["json_schema"]}
        text = fields.get("text", {})
        if not isinstance(text, dict) or ("format" in text and text["format"] != form):
            raise _BadRequest("text.format and response_format contain conflicting settings")
        fields["text"] = {**text, "format": form}
    if "tool_choice" in fields:
        choice = fields.pop("tool_choice")
        if (
            isinstance(choice, dict)
            and choice.get("type") == "function"
            and isinstance(choice.get("function"), dict)
        ):
            choice = {"type": "function", "name": choice["function"].get("name", "")}
        call["tool_choice"] = choice
    if "tools" in fields:
        tools = fields.pop("tools")
        if isinstance(tools, list):
            tools = [
                {"type": "function", **tool["function"]}
                if isinstance(tool, dict)
                and tool.get("type") == "function"
                and isinstance(tool.get("function"), dict)
                else tool
                for tool in tools
            ]
        call["tools"] = tools
    for key in ("temperature", "top_p", "parallel_tool_calls"):
        if key in fields:
            call[key] = fields.pop(key)
    if fields:
        call["extra_body"] = fields  # merged into the request JSON by LiteLLM
    call.update(route.kwargs)
    return call


def _from_responses(response: Any) -> dict[str, Any]:
    """A Responses result as a chat completion; an unfinished one is an error."""
    status = _field(response, "status")
    reason = _field(_field(response, "incomplete_details"), "reason")
    if status == "incomplete":
        if reason not in {"max_output_tokens", "content_filter"}:
            raise RuntimeError(
                f"OpenAI Responses API returned an incomplete response with reason {reason!r}"
            )
    elif status != "completed":
        error = _field(response, "error")
        detail = ": ".join(
            str(value) for value in (_field(error, "code"), _field(error, "message")) if value
        )
        raise RuntimeError(
            f"OpenAI Responses API returned status {status!r}" + (f": {detail}" if detail else "")
        )
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in _field(response, "output", None) or []:
        kind = _field(item, "type")
        if kind == "message":
            for part in _field(item, "content", None) or []:
                if _field(part, "type") == "output_text":
                    texts.append(str(_field(part, "text", "") or ""))
                elif _field(part, "type") == "refusal":
                    refusals.append(str(_field(part, "refusal", "") or ""))
        elif kind == "function_call":
            calls.append(
                {
                    "id": _field(item, "call_id") or _field(item, "id"),
                    "type": "function",
                    "function": {
                        "name": _field(item, "name", ""),
                        "arguments": _field(item, "arguments", ""),
                    },
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    if refusals:
        message["refusal"] = "".join(refusals)
    finish = "tool_calls" if calls else "stop"
    if status == "incomplete":
        finish = "length" if reason == "max_output_tokens" else "content_filter"
    chat: dict[str, Any] = {
        "id": _field(response, "id", None) or "chatcmpl-osmosis",
        "created": int(_field(response, "created_at", None) or time.time()),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    usage = _field(response, "usage")
    if usage is not None:
        prompt = int(_field(usage, "input_tokens", 0) or 0)
        completion = int(_field(usage, "output_tokens", 0) or 0)
        chat["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": int(_field(usage, "total_tokens", prompt + completion) or 0),
        }
        cached = _field(_field(usage, "input_tokens_details"), "cached_tokens")
        if isinstance(cached, int) and not isinstance(cached, bool):
            chat["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    return chat
