"""Row normalisation (contract §3.2), shared by every format: a raw mapping to a row."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import DatasetError
from pytest_osmosis.core.words import one_line as fold

METADATA = "metadata"
CONTRACT_COLUMNS = ("system_prompt", "user_prompt", "ground_truth", "label", METADATA)
"""The only columns a reader needs to keep; the others never reach a row."""
MAX_METADATA_DEPTH = 255
"""Deeper metadata is refused at open. 255 is the deepest the SDK's own client sends: its
``RolloutInitRequest.model_dump(mode="json")`` fails at 256 levels (pydantic's serialization
depth limit; measured with osmosis-ai 0.3.8), so a deeper row runs nowhere. Copying it into
a workflow context (and writing it into results) recurses once per level: past Python's
recursion limit that is a traceback on every run and resume instead of a result."""


@dataclass(frozen=True, slots=True)
class EvalDatasetRow:
    """One normalised row; `row_index` is its position in the selection (platform-visible)."""

    row_index: int
    source_row_index: int
    initial_messages: list[dict[str, str]]
    label: str | None
    metadata: dict[str, Any] | None


class RowProblem(Exception):
    """A row breaks §3.2; the caller adds where it is (file, row, line)."""


def short(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def one_line(exc: BaseException) -> str:
    """Library messages may span lines; ours are one line."""
    return fold(str(exc))


_JSON_KINDS = {bool: "boolean", int: "number", float: "number", str: "string", list: "array"}


def json_kind(value: Any) -> str:
    return "null" if value is None else _JSON_KINDS.get(type(value), type(value).__name__)


def row_place(path: Path, source: int, line: int | None) -> str:
    return f"{path}: row {source}" + (f" (line {line})" if line is not None else "")


def _text(raw: Mapping[str, Any], column: str) -> str | None:
    value = raw.get(column)
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    try:
        return str(value)
    except (ValueError, TypeError, RecursionError) as exc:
        raise RowProblem(f"{column} cannot be turned into text ({one_line(exc)})") from None


def _too_deep(value: Any) -> bool:
    """Whether `value` nests containers more than `MAX_METADATA_DEPTH` levels (no recursion)."""
    level = [value]
    for _ in range(MAX_METADATA_DEPTH):
        inner: list[Any] = []
        for node in level:
            children = node.values() if isinstance(node, Mapping) else node
            inner.extend(child for child in children if isinstance(child, (Mapping, list)))
        if not inner:
            return False
        level = inner
    return True


_TOO_DEEP = (
    f"metadata is nested more than {MAX_METADATA_DEPTH} levels deep; flatten it "
    f"(a row this deep cannot be handed to a workflow)"
)


def _metadata(value: Any) -> dict[str, Any] | None:
    # An empty object counts as absent so the "no prompt and no metadata" rule can fire.
    if value is None:
        return None
    if isinstance(value, Mapping):
        if _too_deep(value):
            raise RowProblem(_TOO_DEEP)
        return dict(value) or None
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            decoded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RowProblem(f"metadata is not valid JSON ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:
            raise RowProblem(f"metadata is not valid JSON ({one_line(exc)})") from None
        if not isinstance(decoded, dict):
            raise RowProblem(f"metadata must be a JSON object, got a JSON {json_kind(decoded)}")
        if _too_deep(decoded):
            raise RowProblem(_TOO_DEEP)
        return decoded or None
    raise RowProblem(f"metadata must be a JSON object, got {type(value).__name__}")


def normalise(
    raw: Mapping[str, Any],
) -> tuple[list[dict[str, str]], str | None, dict[str, Any] | None]:
    """§3.2 without row identity, so validation at open builds no dataclass."""
    metadata_mode = METADATA in raw
    metadata = _metadata(raw[METADATA]) if metadata_mode else None
    system_prompt = _text(raw, "system_prompt")
    user_prompt = _text(raw, "user_prompt")
    if user_prompt is None and not metadata_mode:
        raise RowProblem(
            "user_prompt is required for a row with no 'metadata' column "
            "(give a non-empty user_prompt, or a metadata object)"
        )
    label = _text(raw, "ground_truth")
    if label is None:
        label = _text(raw, "label")
    if label is None and not metadata_mode:
        raise RowProblem("ground_truth (or label) is required for a row with no 'metadata' column")
    messages: list[dict[str, str]] = []
    if system_prompt is not None:
        messages.append({"role": "system", "content": system_prompt})
    if user_prompt is not None:
        messages.append({"role": "user", "content": user_prompt})
    if not messages and metadata is None:
        raise RowProblem(
            "has no prompt and no metadata; a row needs at least a user_prompt or a "
            "non-empty 'metadata' object"
        )
    return messages, label, metadata


def normalize_row(raw: Mapping[str, Any], source_row_index: int, row_index: int) -> EvalDatasetRow:
    """Normalise one raw row exactly as the official local reader does (§3.2)."""
    try:
        messages, label, metadata = normalise(raw)
    except RowProblem as problem:
        raise DatasetError(f"row {source_row_index}: {problem}") from None
    return EvalDatasetRow(row_index, source_row_index, messages, label, metadata)


def row_digest(row: EvalDatasetRow) -> str:
    """A row's identity by content: its prompt messages, label and metadata (not its place).

    Two runs' rows are compared when their digests are equal, so a row moved, added or
    removed in an edited dataset is matched by what it asks, not by its position.
    """
    text = json.dumps(
        [row.initial_messages, row.label, row.metadata],
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
