"""``index.jsonl`` rows and the trajectory checks that decide ``trajectory_filename``.

The platform silently drops a malformed index line, so rows are valid by
construction: fixed key order, ``None`` never written (the key is omitted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.atomic import Signature

INDEX_FILENAME = "index.jsonl"
SUMMARY_FILENAME = "summary.jsonl"
PROGRESS_FILENAME = "progress.json"
METRICS_FILENAME = "metrics.json"
TRIALS_DIRNAME = "rollout_trials"
CANONICAL_TRAJECTORY_FILENAME = "trajectory.json"


def build_index_row(
    record: Mapping[str, Any],
    *,
    trajectory_filename: str | None = None,
    tokens: int | None = None,
    resumed: bool = False,
    reused: bool = False,
) -> dict[str, Any]:
    """Project one journal record into an index row (contract §7.3 key order).

    *tokens* overrides the record's (the trajectory fallback); ``resumed`` marks a
    result carried forward from an earlier invocation, ``reused`` one recorded from
    another run without running (``--osmosis-reuse``, results/reuse.py).
    """
    row = {
        "row_index": record["row_index"],
        "run_index": record["run_index"],
        "rollout_id": record["rollout_id"],
        "trajectory_filename": trajectory_filename,
        "status": record["status"],
        "reward": record.get("reward"),
        "tokens": record.get("tokens") if tokens is None else tokens,
        "duration_ms": record.get("duration_ms", 0.0),
        "error_type": record.get("error_type"),
        "resumed": True if resumed else None,
        "reused": True if reused else None,
    }
    return {key: value for key, value in row.items() if value is not None}


def render_index_line(row: Mapping[str, Any]) -> bytes:
    """One index line: the SDK's default separators, UTF-8, trailing newline."""
    return (json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def render_index(rows: Iterable[Mapping[str, Any]]) -> bytes:
    """All index lines sorted by ``(row_index, run_index)``; no blank lines."""
    ordered = sorted(rows, key=lambda row: (row["row_index"], row["run_index"]))
    return b"".join(render_index_line(row) for row in ordered)


def atif_rollout_identity(document: Mapping[str, Any]) -> str | None:
    """The rollout id the platform reads from an ATIF document (contract §7.6).

    ``extra.osmosis.rollout_id``, else ``session_id``, else the part of
    ``trajectory_id`` before the first ``/`` (a bare ``trajectory_id`` does not
    count: the platform drops such a document).
    """
    extra = document.get("extra")
    if isinstance(extra, Mapping):
        osmosis = extra.get("osmosis")
        if isinstance(osmosis, Mapping):
            candidate = osmosis.get("rollout_id")
            if isinstance(candidate, str) and candidate:
                return candidate
    session_id = document.get("session_id")
    if isinstance(session_id, str) and session_id:
        return session_id
    trajectory_id = document.get("trajectory_id")
    if isinstance(trajectory_id, str) and "/" in trajectory_id:
        prefix = trajectory_id.split("/", 1)[0]
        if prefix:
            return prefix
    return None


def atif_total_tokens(document: Mapping[str, Any]) -> int | None:
    """``total_prompt_tokens + total_completion_tokens`` when either is an int."""
    final = document.get("final_metrics")
    if not isinstance(final, Mapping):
        return None
    total = 0
    seen = False
    for key in ("total_prompt_tokens", "total_completion_tokens"):
        value = final.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            total += value
            seen = True
    return total if seen else None


def read_valid_trajectory(path: str | Path, *, rollout_id: str) -> dict[str, Any] | None:
    """The document at *path* if it is a JSON object identifying *rollout_id*, else None.

    Deliberately not schema-validated here (the SDK does not either); ``osmosis
    eval upload`` validates strictly.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return valid_trajectory(data, rollout_id=rollout_id)


def valid_trajectory(data: bytes, *, rollout_id: str) -> dict[str, Any] | None:
    """:func:`read_valid_trajectory` of a trajectory's bytes already read."""
    try:
        payload = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(payload, dict):
        return None
    if atif_rollout_identity(payload) != rollout_id:
        return None
    return payload


@dataclass(frozen=True, slots=True)
class WrittenTrajectory:
    """A ``trajectory.json`` as its writer left it, handed to the run directory (settle).

    ``data``: the bytes written; ``signature``: the file's as the rename left it;
    ``identity`` and ``tokens``: :func:`atif_rollout_identity` and :func:`atif_total_tokens`
    of the document those bytes encode. While the file on disk still has that signature,
    :func:`valid_trajectory` of it is ``identity == rollout_id`` (the writer wrote a JSON
    object) and its projection is a copy of ``data``: nothing is read or parsed again.
    A file changed since (another signature) is read and checked as any other.
    """

    data: bytes
    signature: Signature
    identity: str | None
    tokens: int | None

    @classmethod
    def of(
        cls, document: Mapping[str, Any], data: bytes, signature: Signature | None
    ) -> WrittenTrajectory | None:
        """What the writer of *document* as *data* hands over (None: no signature taken)."""
        if signature is None:
            return None
        return cls(data, signature, atif_rollout_identity(document), atif_total_tokens(document))
