"""Read one Osmosis run directory (contract §6–§7) into plain data: :func:`load_run`.

It reads what the official SDK, the platform's ``eval download`` and this plugin write,
and it is tolerant: a run that was killed half-way (no ``metrics.json`` yet, only
``events.jsonl``) or has a damaged file still loads, with a warning instead of an
exception. It never reads outside the run directory (symlinks that leave it are
ignored): the directory is already redacted, anything else may not be.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from pytest_osmosis.core.errors import RunDirectoryError
from pytest_osmosis.core.outcome import classify
from pytest_osmosis.dataset import RowSelectorError
from pytest_osmosis.dataset import parse_row_selector as dataset_row_ranges
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.metrics import aggregate_metrics

DEFAULT_PASS_THRESHOLD = 1.0


_MAX_JSON_BYTES = 64 * 1024 * 1024


#: An index/journal row's cost in US dollars, when the session priced its model calls.
COST_KEY = "cost_usd"


class RunNotFoundError(RunDirectoryError):
    """No run directory matches the name or path the user gave."""


# ----------------------------------------------------------------------------- files


def inside_run_dir(run_dir: Path, path: Path) -> bool:
    """True when *path* is a regular, non-symlink file that resolves inside *run_dir*."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    if stat.S_ISLNK(mode) or not stat.S_ISREG(mode):
        return False
    try:
        path.resolve().relative_to(run_dir.resolve())
    except (OSError, ValueError):
        return False
    return True


def read_bytes(
    run_dir: Path, rel: str | PurePosixPath, limit: int | None = _MAX_JSON_BYTES
) -> bytes:
    """Up to *limit* bytes (None: all) of ``run_dir/rel``; FileNotFoundError if unsafe/absent."""
    path = run_dir / rel
    if not inside_run_dir(run_dir, path):
        raise FileNotFoundError(str(path))
    with path.open("rb") as handle:
        return handle.read() if limit is None else handle.read(limit)


def _read_json(run_dir: Path, rel: str, warnings: list[str]) -> Any:
    try:
        raw = read_bytes(run_dir, rel)
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.append(f"{rel}: cannot read ({exc.strerror or exc})")
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        warnings.append(f"{rel}: invalid JSON ({getattr(exc, 'msg', None) or exc})")
        return None


def _read_jsonl(run_dir: Path, rel: str, warnings: list[str]) -> list[dict[str, Any]] | None:
    """Objects of a JSON-lines file; bad lines are skipped with a warning, a torn tail dropped."""
    try:
        raw = read_bytes(run_dir, rel, limit=None)
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.append(f"{rel}: cannot read ({exc.strerror or exc})")
        return None
    rows: list[dict[str, Any]] = []
    lines = raw.split(b"\n")
    bad = 0
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            if lineno == len(lines):
                continue  # a final fragment without newline: a write in progress or a crash
            bad += 1
            continue
        if isinstance(value, dict):
            rows.append(value)
        else:
            bad += 1
    if bad:
        warnings.append(f"{rel}: skipped {bad} line(s) that are not JSON objects")
    return rows


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def dict_of(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def parse_time(value: Any) -> datetime | None:
    """An ISO-8601 UTC timestamp as written by the SDK (``...Z``), else None."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed


#: Rows one range of a manifest's selector may name before it is taken for unreadable
#: (the list is built in memory; a run holds at most 10,000,000 work items anyway).
MAX_RANGE_ROWS = 10_000_000


def recorded_selection(selector: Any) -> list[int] | None:
    """``"0-9,12"`` (manifest ``selected_source_rows``) -> ``[0, ..., 9, 12]``; None: unreadable."""
    try:
        ranges = dataset_row_ranges(selector) if isinstance(selector, str) else None
    except RowSelectorError:
        return None
    if ranges is None or any(stop - start > MAX_RANGE_ROWS for start, stop in ranges):
        return None
    return [row for start, stop in ranges for row in range(start, stop + 1)]


# ----------------------------------------------------------------------------- rows


def _is_text(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value)


def _is_cost(value: Any) -> bool:
    return is_number(value) and value >= 0


def _kept(value: Any) -> Any:
    return value


#: What a row keeps of a recorded field, in this order: its check and its conversion.
_ROW_FIELDS: tuple[tuple[str, Callable[[Any], bool], Callable[[Any], Any]], ...] = (
    ("trajectory_filename", _is_text, _kept),
    ("status", _is_text, _kept),
    ("error_type", _is_text, _kept),
    ("reward", is_number, float),
    ("duration_ms", is_number, float),
    (COST_KEY, _is_cost, float),
    ("tokens", is_int, _kept),
    ("source_row_index", is_int, _kept),
    ("resumed", lambda value: value is True, _kept),
)


def _normalize_row(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """An index or journal row as the reader trusts it: None without a valid work key."""
    row_index, run_index = raw.get("row_index"), raw.get("run_index")
    if not (is_int(row_index) and is_int(run_index)) or min(row_index, run_index) < 0:
        return None
    row: dict[str, Any] = {"row_index": row_index, "run_index": run_index}
    rollout_id = raw.get("rollout_id")
    if _is_text(rollout_id) and "/" not in rollout_id and rollout_id not in (".", ".."):
        row["rollout_id"] = rollout_id
    for key, check, convert in _ROW_FIELDS:
        if check(raw.get(key)):
            row[key] = convert(raw[key])
    return row


def dataset_row(row: Mapping[str, Any]) -> int:
    """The dataset row a user reads for an index row: its ``source_row_index``.

    ``row_index`` is the position in the selection (what the contract's file names and
    ``index.jsonl`` use); node ids, progress and every report name the dataset row.
    ``load_run`` fills the source in from the manifest's selection when the journal has
    none; a run with neither falls back to ``row_index``.
    """
    source = row.get("source_row_index")
    if isinstance(source, int) and not isinstance(source, bool):
        return source
    return int(row["row_index"])


def _rows(
    run_dir: Path, warnings: list[str], finished: bool, journal: bool = False
) -> tuple[list[dict[str, Any]], str]:
    """Index rows, merged with the journal when the index is missing or behind it
    (*journal*: the journal's rows alone, as a gate reads a baseline)."""
    index = None if journal else _read_jsonl(run_dir, "index.jsonl", warnings)
    events = (
        None if finished and index is not None else _read_jsonl(run_dir, "events.jsonl", warnings)
    )
    by_key: dict[tuple[int, int], dict[str, Any]] = {}
    for raw in index or []:
        row = _normalize_row(raw)
        if row is not None:
            by_key[(row["row_index"], row["run_index"])] = row
    source = "index.jsonl" if index is not None else "none"
    if _merge_journal(run_dir, by_key, events or []):
        source = "events.jsonl" if index is None else "index.jsonl+events.jsonl"
    return [by_key[key] for key in sorted(by_key)], source


def _merge_journal(
    run_dir: Path, by_key: dict[tuple[int, int], dict[str, Any]], events: list[dict[str, Any]]
) -> int:
    """Put the journal's records the index lacks (or has another rollout for) into *by_key*;
    every row keeps the journal's dataset row. Returns how many records were taken."""
    journal_sources: dict[tuple[int, int], int] = {}
    merged = 0
    for raw in events:
        record = _normalize_row(raw)
        if record is None:
            continue
        key = (record["row_index"], record["run_index"])
        if "source_row_index" in record:
            journal_sources[key] = record["source_row_index"]
        known = by_key.get(key)
        if known is not None and known.get("rollout_id") == record.get("rollout_id"):
            continue
        record.pop("resumed", None)
        rollout_id = record.get("rollout_id")
        if rollout_id and inside_run_dir(
            run_dir, run_dir / "rollout_trials" / rollout_id / "trajectory.json"
        ):
            record["trajectory_filename"] = "trajectory.json"
        by_key[key] = record
        merged += 1
    for key, source_row in journal_sources.items():
        if key in by_key:
            by_key[key].setdefault("source_row_index", source_row)
    return merged


# ----------------------------------------------------------------------------- one run


def load_run(run_dir: Path, *, summary_only: bool = False, journal: bool = False) -> dict[str, Any]:
    """Everything ``list``/``info``/``report`` need about one run, as plain data.

    Keys: ``name`` (the directory name: what ``info NAME`` takes), ``path``,
    ``manifest``, ``metrics``, ``progress``, ``row_metrics`` (our ``osmosis_metrics.json``:
    pass^k, flaky rows, cost, whose per-attempt costs become the rows' ``cost_usd``) (each
    ``{}`` when absent or unreadable),
    ``rows`` (index rows sorted by row then run, each with an ``outcome``; empty for a
    finished run when *summary_only*), ``rows_done``, ``rows_source``, ``summary``
    (``metrics.json``'s, or recomputed from the rows when absent), ``pass_threshold``,
    ``status``, ``total_runs``, ``warnings``. With *journal* the rows and the summary come
    from ``events.jsonl`` alone (``metrics`` still holds ``metrics.json`` as written).
    """
    from pytest_osmosis.results.row_metrics import read_row_metrics

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunNotFoundError(f"{run_dir}: no such run directory")
    warnings: list[str] = []
    manifest = dict_of(_read_json(run_dir, "manifest.json", warnings))
    metrics = dict_of(_read_json(run_dir, "metrics.json", warnings))
    progress = dict_of(_read_json(run_dir, "progress.json", warnings))
    summary = dict_of(metrics.get("summary"))
    status = dict_of(metrics.get("eval_run")).get("status")
    recorded_status = status if isinstance(status, str) else None
    rows: list[dict[str, Any]]
    if summary_only and recorded_status == "finished" and is_int(summary.get("total_samples")):
        # ``list`` of many large runs: a finished run's metrics already count its rows.
        rows, rows_source, rows_done = [], "metrics.json", summary["total_samples"]
    else:
        rows, rows_source = _rows(
            run_dir, warnings, finished=recorded_status == "finished", journal=journal
        )
        rows_done = len(rows)
    threshold = _pass_threshold(summary, rows, warnings)
    inputs = dict_of(manifest.get("inputs"))
    selection = recorded_selection(dict_of(inputs.get("dataset")).get("selected_source_rows"))
    row_metrics = read_row_metrics(run_dir)
    _annotate_rows(rows, threshold, dict_of(row_metrics.get("cost_usd_by_rollout")), selection)
    total_runs = _total_runs(progress, inputs, selection)
    if not summary or rows_source not in ("index.jsonl", "metrics.json"):
        summary = _recomputed_summary(summary, rows, threshold, warnings)
    warnings += _manifest_warnings(manifest, run_dir)
    return {
        "name": run_dir.name,
        "path": str(run_dir.resolve()),
        "manifest": manifest,
        "metrics": metrics,
        "row_metrics": row_metrics,
        "progress": progress,
        "rows": rows,
        "rows_done": rows_done,
        "rows_source": rows_source,
        "summary": summary,
        "pass_threshold": threshold,
        "status": _status(recorded_status, bool(rows or manifest), rows_done, total_runs),
        "total_runs": total_runs,
        "warnings": warnings,
    }


def _pass_threshold(
    summary: Mapping[str, Any], rows: list[dict[str, Any]], warnings: list[str]
) -> float:
    """``metrics.json``'s threshold; the SDK's default, with a warning, when it is not recorded."""
    value = summary.get("pass_threshold")
    if is_number(value):
        return float(value)
    if rows:
        warnings.append(
            f"pass_threshold is not recorded (no metrics.json); assuming {DEFAULT_PASS_THRESHOLD:g}"
        )
    return DEFAULT_PASS_THRESHOLD


def _annotate_rows(
    rows: list[dict[str, Any]],
    threshold: float,
    costs: Mapping[str, Any],
    selection: list[int] | None,
) -> None:
    """Each row's outcome, its cost when only the session priced it, and its dataset row."""
    for row in rows:
        row["outcome"] = classify(row, threshold)
        cost = costs.get(str(row.get("rollout_id")))
        if COST_KEY not in row and is_number(cost) and cost >= 0:
            row[COST_KEY] = float(cost)
        if "source_row_index" not in row and selection and row["row_index"] < len(selection):
            row["source_row_index"] = selection[row["row_index"]]


def _total_runs(
    progress: Mapping[str, Any], inputs: Mapping[str, Any], selection: list[int] | None
) -> int | None:
    """The attempts the run was to make: ``progress.json``'s, else ``n`` x the selected rows."""
    total = progress.get("total_runs")
    if is_int(total):
        return total
    n = inputs.get("n")
    if is_int(n) and n and selection is not None:
        return n * len(selection)
    return None


def _recomputed_summary(
    recorded: Mapping[str, Any], rows: list[dict[str, Any]], threshold: float, warnings: list[str]
) -> dict[str, Any]:
    """The summary counted again from the rows (``metrics.json`` absent or behind them)."""
    recomputed = aggregate_metrics(rows, threshold)
    if recorded and recorded.get("total_samples") != recomputed["total_samples"]:
        warnings.append("metrics.json is older than the journal; numbers recomputed")
    return recomputed


def _status(recorded: str | None, has_records: bool, rows_done: int, total_runs: int | None) -> str:
    """The recorded status, except that a "finished" run missing attempts is incomplete."""
    status = recorded or ("incomplete" if has_records else "unknown")
    if status == "finished" and total_runs is not None and rows_done < total_runs:
        return "incomplete"
    return status


def _manifest_warnings(manifest: Mapping[str, Any], run_dir: Path) -> list[str]:
    if not manifest:
        return ["manifest.json is missing or unreadable"]
    recorded_name = manifest.get("run_name")
    if recorded_name != run_dir.name:
        return [
            f"manifest run_name {recorded_name!r} differs from the directory name "
            f"{run_dir.name!r}: `osmosis eval upload` refuses a renamed run"
        ]
    return []


def started_at(run: Mapping[str, Any]) -> datetime | None:
    eval_run = dict_of(dict_of(run.get("metrics")).get("eval_run"))
    return parse_time(eval_run.get("started_at")) or parse_time(
        dict_of(run.get("manifest")).get("created_at")
    )
