"""Read Osmosis run directories (contract §6–§7) into plain dicts.

Used by ``pytest-osmosis list/info/report``. It reads what the official SDK, the
platform's ``eval download`` and this plugin write, and it is tolerant: a run that was
killed half-way (no ``metrics.json`` yet, only ``events.jsonl``) or has a damaged file
still loads, with a warning instead of an exception. It never reads outside the run
directory (symlinks that leave it are ignored): the directory is already redacted,
anything else may not be. The one exception is :func:`find_dataset`, which looks for the
dataset file whose bytes the manifest's sha256 names (the report shows each row's input;
the report redacts what it embeds).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from pytest_osmosis.core.errors import RunDirectoryError
from pytest_osmosis.core.outcome import OUTCOMES, classify
from pytest_osmosis.dataset import RowSelectorError, readers
from pytest_osmosis.dataset import parse_row_selector as dataset_row_ranges
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.metrics import aggregate_metrics

DEFAULT_OUTPUT = Path(".osmosis") / "evals"
#: The run name that means "the newest run under the output root" (a run directory of
#: that very name wins, so an existing run is never shadowed).
LATEST = "latest"
RUN_MARKERS = ("manifest.json", "metrics.json", "index.jsonl", "events.jsonl")
DEFAULT_PASS_THRESHOLD = 1.0

_MAX_JSON_BYTES = 64 * 1024 * 1024
#: An index/journal row's cost in US dollars, when the session priced its model calls.
COST_KEY = "cost_usd"
_LOG_LINE = re.compile(r"^(\S+) ([A-Z]+) \[([^\]]+)\] (.*)$")


class RunNotFoundError(RunDirectoryError):
    """No run directory matches the name or path the user gave."""


# ----------------------------------------------------------------------------- files


def _inside(run_dir: Path, path: Path) -> bool:
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
    if not _inside(run_dir, path):
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _dict(value: Any) -> dict[str, Any]:
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


def parse_row_selector(selector: Any) -> list[int] | None:
    """``"0-9,12"`` (manifest ``selected_source_rows``) -> ``[0, ..., 9, 12]``; None: unreadable."""
    try:
        ranges = dataset_row_ranges(selector) if isinstance(selector, str) else None
    except RowSelectorError:
        return None
    if ranges is None or any(stop - start > MAX_RANGE_ROWS for start, stop in ranges):
        return None
    return [row for start, stop in ranges for row in range(start, stop + 1)]


# ----------------------------------------------------------------------------- discovery


def is_run_dir(path: Path) -> bool:
    """A directory holding at least one of the files a run directory always has."""
    try:
        if not path.is_dir():
            return False
    except OSError:
        return False
    return any(os.path.lexists(path / marker) for marker in RUN_MARKERS)


def find_output_root(start: Path | None = None) -> Path:
    """The output root a bare command means: ``./.osmosis/evals`` of the nearest workspace.

    Walks up from *start* (default: the current directory) to the first directory
    that has ``.osmosis/evals`` or looks like an Osmosis workspace (``configs/eval``);
    falls back to ``<start>/.osmosis/evals``.
    """
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / DEFAULT_OUTPUT).is_dir() or (directory / "configs" / "eval").is_dir():
            return directory / DEFAULT_OUTPUT
    return here / DEFAULT_OUTPUT


def discover_runs(root: Path) -> list[Path]:
    """Run directories directly under *root* (hidden entries such as ``.locks`` excluded)."""
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RunDirectoryError(f"{root}: cannot list run directories ({exc})") from exc
    return [entry for entry in entries if not entry.name.startswith(".") and is_run_dir(entry)]


def resolve_run(ref: str, root: Path | None = None, *, cwd: Path | None = None) -> Path:
    """A run given as a path (absolute or relative to *cwd*) or as a name under *root*.

    A path wins when it is a run directory, like ``osmosis eval upload``; otherwise
    the name is looked up under the output root.
    """
    base = cwd or Path.cwd()
    if not ref or "\0" in ref:
        raise RunNotFoundError(f"run {ref!r}: give a run name or a run directory path")
    candidate = Path(ref).expanduser()
    if not candidate.is_absolute():
        candidate = base / candidate
    if is_run_dir(candidate):
        return candidate
    output_root = root if root is not None else find_output_root(base)
    named = output_root / ref
    if "/" not in ref and os.sep not in ref and ref not in (".", "..") and is_run_dir(named):
        return named
    if ref == LATEST:
        newest = latest_run(output_root)
        if newest is not None:
            return newest
        raise RunNotFoundError(f"run {LATEST!r}: no runs under {output_root}")
    if candidate.is_dir():
        raise RunNotFoundError(f"{candidate}: not a run directory (no {', '.join(RUN_MARKERS)})")
    known = [p.name for p in discover_runs(output_root)] if output_root.is_dir() else []
    hint = f"; runs there: {', '.join(known[:8])}" if known else ""
    raise RunNotFoundError(f"run {ref!r} not found as a path or under {output_root}{hint}")


# ----------------------------------------------------------------------------- loading


def _normalize_row(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    row_index, run_index = raw.get("row_index"), raw.get("run_index")
    if not isinstance(row_index, int) or not isinstance(run_index, int):
        return None
    if isinstance(row_index, bool) or isinstance(run_index, bool) or min(row_index, run_index) < 0:
        return None
    row: dict[str, Any] = {"row_index": row_index, "run_index": run_index}
    rollout_id = raw.get("rollout_id")
    if (
        isinstance(rollout_id, str)
        and rollout_id
        and "/" not in rollout_id
        and rollout_id
        not in (
            ".",
            "..",
        )
    ):
        row["rollout_id"] = rollout_id
    for key in ("trajectory_filename", "status", "error_type"):
        value = raw.get(key)
        if isinstance(value, str) and value:
            row[key] = value
    for key in ("reward", "duration_ms"):
        if _is_number(raw.get(key)):
            row[key] = float(raw[key])
    cost = raw.get(COST_KEY)
    if _is_number(cost) and cost >= 0:
        row[COST_KEY] = float(cost)
    if _is_int(raw.get("tokens")):
        row["tokens"] = raw["tokens"]
    if _is_int(raw.get("source_row_index")):
        row["source_row_index"] = raw["source_row_index"]
    if raw.get("resumed") is True:
        row["resumed"] = True
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
    journal_sources: dict[tuple[int, int], int] = {}
    merged = 0
    for raw in events or []:
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
        if rollout_id and _inside(
            run_dir, run_dir / "rollout_trials" / rollout_id / "trajectory.json"
        ):
            record["trajectory_filename"] = "trajectory.json"
        by_key[key] = record
        merged += 1
    if merged:
        source = "events.jsonl" if index is None else "index.jsonl+events.jsonl"
    for key, source_row in journal_sources.items():
        if key in by_key:
            by_key[key].setdefault("source_row_index", source_row)
    return [by_key[key] for key in sorted(by_key)], source


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
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunNotFoundError(f"{run_dir}: no such run directory")
    warnings: list[str] = []
    manifest = _dict(_read_json(run_dir, "manifest.json", warnings))
    metrics = _dict(_read_json(run_dir, "metrics.json", warnings))
    progress = _dict(_read_json(run_dir, "progress.json", warnings))
    eval_run = _dict(metrics.get("eval_run"))
    summary = _dict(metrics.get("summary"))
    recorded_status = eval_run.get("status") if isinstance(eval_run.get("status"), str) else None
    rows_done: int | None = None
    rows: list[dict[str, Any]]
    if summary_only and recorded_status == "finished" and _is_int(summary.get("total_samples")):
        # ``list`` of many large runs: a finished run's metrics already count its rows.
        rows, rows_source, rows_done = [], "metrics.json", summary["total_samples"]
    else:
        rows, rows_source = _rows(
            run_dir, warnings, finished=recorded_status == "finished", journal=journal
        )
    threshold_value = summary.get("pass_threshold")
    if _is_number(threshold_value):
        threshold = float(threshold_value)
    else:
        threshold = DEFAULT_PASS_THRESHOLD
        if rows:
            warnings.append(
                f"pass_threshold is not recorded (no metrics.json); assuming {threshold:g}"
            )
    inputs = _dict(manifest.get("inputs"))
    selection = parse_row_selector(_dict(inputs.get("dataset")).get("selected_source_rows"))
    from pytest_osmosis.results.row_metrics import read_row_metrics

    row_metrics = read_row_metrics(run_dir)
    costs = _dict(row_metrics.get("cost_usd_by_rollout"))  # what the session priced
    for row in rows:
        row["outcome"] = classify(row, threshold)
        cost = costs.get(str(row.get("rollout_id")))
        if COST_KEY not in row and _is_number(cost) and cost >= 0:
            row[COST_KEY] = float(cost)
        if "source_row_index" not in row and selection and row["row_index"] < len(selection):
            row["source_row_index"] = selection[row["row_index"]]
    n = inputs.get("n") if _is_int(inputs.get("n")) else None
    total_runs: int | None = (
        progress.get("total_runs") if _is_int(progress.get("total_runs")) else None
    )
    if total_runs is None and n and selection is not None:
        total_runs = n * len(selection)
    if not summary or rows_source not in ("index.jsonl", "metrics.json"):
        recomputed = aggregate_metrics(rows, threshold)
        if summary and summary.get("total_samples") != recomputed["total_samples"]:
            warnings.append("metrics.json is older than the journal; numbers recomputed")
        summary = recomputed
    status = recorded_status or ("incomplete" if rows or manifest else "unknown")
    if rows_done is None:
        rows_done = len(rows)
    if status == "finished" and total_runs is not None and rows_done < total_runs:
        status = "incomplete"
    recorded_name = manifest.get("run_name")
    if not manifest:
        warnings.append("manifest.json is missing or unreadable")
    elif recorded_name != run_dir.name:
        warnings.append(
            f"manifest run_name {recorded_name!r} differs from the directory name "
            f"{run_dir.name!r}: `osmosis eval upload` refuses a renamed run"
        )
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
        "status": status,
        "total_runs": total_runs,
        "warnings": warnings,
    }


# ----------------------------------------------------------------------------- views


def started_at(run: Mapping[str, Any]) -> datetime | None:
    eval_run = _dict(_dict(run.get("metrics")).get("eval_run"))
    return parse_time(eval_run.get("started_at")) or parse_time(
        _dict(run.get("manifest")).get("created_at")
    )


def _sort_time(run: Mapping[str, Any]) -> float:
    when = started_at(run)
    if when is not None:
        return when.timestamp()
    try:
        return os.stat(str(run["path"])).st_mtime
    except OSError:
        return 0.0


def run_list_item(run: Mapping[str, Any]) -> dict[str, Any]:
    """One ``list`` entry: identity, status, what ran, progress, pass rate, timing."""
    manifest = _dict(run.get("manifest"))
    inputs = _dict(manifest.get("inputs"))
    eval_run = _dict(_dict(run.get("metrics")).get("eval_run"))
    summary = _dict(run.get("summary"))
    when = started_at(run)
    duration = eval_run.get("duration_ms")
    return {
        "name": run["name"],
        "path": run["path"],
        "status": run["status"],
        "rollout": eval_run.get("rollout_name") or _dict(inputs.get("rollout")).get("name"),
        "model": eval_run.get("model_name") or inputs.get("model_path"),
        "dataset": eval_run.get("dataset_name"),
        "rows_done": run.get("rows_done", len(run["rows"])),
        "rows_total": run.get("total_runs"),
        "pass_rate": summary.get("pass_rate", 0),
        "pass_threshold": run.get("pass_threshold"),
        "passed": summary.get("passed", 0),
        "completed_samples": summary.get("completed_samples", 0),
        "started_at": when.isoformat().replace("+00:00", "Z") if when else None,
        "duration_ms": float(duration) if _is_number(duration) else None,
        "warnings": list(run.get("warnings", [])),
    }


def list_runs(root: Path) -> list[dict[str, Any]]:
    """Every run under *root*, newest first (finished runs without their rows)."""
    runs = [load_run(path, summary_only=True) for path in discover_runs(root)]
    runs.sort(key=_sort_time, reverse=True)
    return runs


def latest_run(root: Path) -> Path | None:
    """The newest run directory under *root* (by its recorded start), or None."""
    runs = list_runs(root)
    return Path(str(runs[0]["path"])) if runs else None


# ----------------------------------------------------------------------------- its dataset

#: At most this many files are hashed while looking for a run's dataset.
MAX_DATASET_CANDIDATES = 64
#: The official SDK's content-addressed cache of platform datasets (contract §2).
SDK_DATASET_CACHE = Path("~/.cache/osmosis/datasets")


def dataset_sha256(run: Mapping[str, Any]) -> str | None:
    """The sha256 of the dataset file the run read, as its manifest records it."""
    inputs = _dict(_dict(run.get("manifest")).get("inputs"))
    sha = _dict(inputs.get("dataset")).get("sha256")
    return sha.lower() if isinstance(sha, str) and len(sha) == 64 else None


def _file_sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _dataset_candidates(run: Mapping[str, Any], hints: tuple[Path, ...], cwd: Path) -> list[Path]:
    """Files that may be the run's dataset, likeliest first (none of them is trusted yet)."""
    run_dir = Path(str(run["path"]))
    workspaces: list[Path] = []
    if run_dir.parent.name == DEFAULT_OUTPUT.name and run_dir.parent.parent.name == ".osmosis":
        workspaces.append(run_dir.parent.parent.parent)  # <workspace>/.osmosis/evals/<run>
    workspaces.append(find_output_root(cwd).parent.parent)
    name = _dict(_dict(run.get("metrics")).get("eval_run")).get("dataset_name")
    found: list[Path] = list(hints)
    for workspace in workspaces:
        data = workspace / "data"
        if isinstance(name, str) and name and "/" not in name:
            found += [data / f"{name}.{extension}" for extension in readers()]
        try:
            found += sorted(p for p in data.iterdir() if p.suffix.lstrip(".").lower() in readers())
        except OSError:
            pass
    sha = dataset_sha256(run)
    if sha:
        try:
            found += sorted(SDK_DATASET_CACHE.expanduser().glob(f"*/{sha}.*"))
        except (OSError, RuntimeError):
            pass
    unique: list[Path] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique[:MAX_DATASET_CANDIDATES]


def find_dataset(
    run: Mapping[str, Any], hints: tuple[Path, ...] = (), *, cwd: Path | None = None
) -> Path | None:
    """The dataset file the run read, found by content: its sha256 is the manifest's.

    Looked for among *hints* (``--dataset``, the session's own file), the ``data/`` folder
    of the run's workspace and of the current one, and the SDK's dataset cache. A file
    with other bytes is never used, so an edited dataset cannot put the wrong question
    beside a row. None when nothing matches (or the manifest records no sha256).
    """
    sha = dataset_sha256(run)
    if sha is None:
        return None
    for path in _dataset_candidates(run, hints, cwd or Path.cwd()):
        try:
            if not path.is_file():
                continue
        except OSError:
            continue
        if _file_sha256(path) == sha:
            return path
    return None


def error_messages(run_dir: Path, rollout_ids: set[str] | None = None) -> dict[str, dict[str, str]]:
    """Per rollout id, the error headline (and traceback) the run logged, from ``logs.txt``.

    This plugin logs ``ERROR [result] <headline> {"detail": ...}`` right after the
    ``[result] work item finished {...rollout_id...}`` line of the same item; a
    ``rollout_id`` in the error's own details wins. SDK logs carry no per-item
    headline, so SDK runs get none.
    """
    found: dict[str, dict[str, str]] = {}
    path = run_dir / "logs.txt"
    if not _inside(run_dir, path):
        return found
    last_id: str | None = None
    try:
        with path.open("rb") as handle:
            for raw in handle:
                if b"[result]" not in raw:
                    continue
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                match = _LOG_LINE.match(line)
                if match is None or match.group(3) != "result":
                    continue
                level, text = match.group(2), match.group(4)
                message, details = _split_details(text)
                rollout_id = details.get("rollout_id")
                if level == "ERROR":
                    target = rollout_id if isinstance(rollout_id, str) else last_id
                    if target and (rollout_ids is None or target in rollout_ids):
                        entry = {"message": message}
                        if isinstance(details.get("detail"), str):
                            entry["detail"] = details["detail"]
                        found[target] = entry
                    last_id = None
                else:
                    last_id = rollout_id if isinstance(rollout_id, str) else None
    except OSError:
        return found
    return found


def _split_details(text: str) -> tuple[str, dict[str, Any]]:
    """``message {json}`` -> (message, json) as written by the run log."""
    start = text.find(" {")
    while start != -1:
        try:
            value = json.loads(text[start + 1 :])
        except json.JSONDecodeError:
            start = text.find(" {", start + 1)
            continue
        if isinstance(value, dict):
            return text[:start], value
        break
    return text, {}


def run_info(run: Mapping[str, Any]) -> dict[str, Any]:
    """``info``: context, timing, progress, configuration, results, failed rows."""
    manifest = _dict(run.get("manifest"))
    inputs = _dict(manifest.get("inputs"))
    provenance = _dict(manifest.get("provenance"))
    eval_run = _dict(_dict(run.get("metrics")).get("eval_run"))
    progress = _dict(run.get("progress"))
    rows: list[dict[str, Any]] = list(run["rows"])
    rollout = _dict(inputs.get("rollout"))
    dataset = _dict(inputs.get("dataset"))
    timeouts = _dict(inputs.get("timeouts"))
    counts = {outcome: 0 for outcome in OUTCOMES}
    for row in rows:
        counts[row["outcome"]] += 1
    total = run.get("total_runs")
    warnings = list(run.get("warnings", []))
    git: dict[str, Any] = {}
    for key, field in (("git_head", "commit"), ("git_branch", "branch"), ("git_dirty", "dirty")):
        if key in provenance:
            git[field] = provenance[key]
    if git.get("dirty") is True:
        warnings.append(
            "the workspace had uncommitted changes when this run started: "
            f"commit {str(git.get('commit', '?'))[:12]} does not fully describe the code"
        )
    selection = dataset.get("selected_source_rows")
    selected = parse_row_selector(selection)
    errors = error_messages(
        Path(str(run["path"])),
        {r["rollout_id"] for r in rows if r["outcome"] == "failed" and "rollout_id" in r},
    )

    def brief(row: Mapping[str, Any]) -> dict[str, Any]:
        item = {
            key: row[key]
            for key in (
                "row_index",
                "run_index",
                "source_row_index",
                "rollout_id",
                "reward",
                "error_type",
            )
            if key in row
        }
        error = errors.get(str(row.get("rollout_id")))
        if error:
            item["error_message"] = error["message"]
        return item

    return {
        "name": run["name"],
        "path": run["path"],
        "status": run["status"],
        "local_run_id": manifest.get("local_run_id") or eval_run.get("id"),
        "context": {
            "model": eval_run.get("model_name") or inputs.get("model_path"),
            "dataset": eval_run.get("dataset_name"),
            "dataset_sha256": dataset.get("sha256"),
            "rollout": eval_run.get("rollout_name") or rollout.get("name"),
            "entrypoint": rollout.get("entrypoint"),
            "rollout_source_digest": rollout.get("source_digest"),
            "config_path": provenance.get("config_path"),
            "sdk_version": provenance.get("sdk_version"),
            "git": git,
            "config_branch": provenance.get("config_branch"),
            "config_commit_sha": provenance.get("config_commit_sha"),
            "versions": _dict(inputs.get("versions")),
        },
        "timing": {
            "created_at": manifest.get("created_at"),
            "started_at": eval_run.get("started_at"),
            "completed_at": eval_run.get("completed_at"),
            "duration_ms": eval_run.get("duration_ms"),
        },
        "progress": {
            "done": len(rows),
            "total": total,
            "pending": (total - len(rows)) if isinstance(total, int) else None,
            "sampled_rows": progress.get("sampled_rows")
            if _is_int(progress.get("sampled_rows"))
            else (len(selected) if selected is not None else None),
            "total_dataset_rows": progress.get("total_dataset_rows"),
            **counts,
            "resumed": sum(1 for row in rows if row.get("resumed")),
            "source": run.get("rows_source"),
        },
        "configuration": {
            "n": inputs.get("n"),
            "selection": selection,
            "pass_threshold": run.get("pass_threshold"),
            "timeouts": {
                "agent_workflow_timeout_s": timeouts.get("agent_timeout_sec"),
                "grader_timeout_s": timeouts.get("grader_timeout_sec"),
            },
            "env_keys": sorted(_dict(inputs.get("env"))),
            "secret_names": [s for s in inputs.get("secret_names") or [] if isinstance(s, str)],
            "advanced": _dict(provenance.get("advanced")),
        },
        "results": dict(run["summary"]),
        "failed_rows": [brief(row) for row in rows if row["outcome"] == "failed"],
        "below_threshold_rows": [brief(row) for row in rows if row["outcome"] == "below_threshold"],
        "skipped_rows": [brief(row) for row in rows if row["outcome"] == "skipped"],
        "error_types": _error_type_counts(rows),
        "warnings": warnings,
    }


def _error_type_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        if row["outcome"] == "failed":
            key = str(row.get("error_type") or "unknown")
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


# ----------------------------------------------------------------------------- one item


def projection_stem(row: Mapping[str, Any]) -> str:
    return f"row_{row['row_index']}_run_{row['run_index']}"


def read_trajectory(run_dir: Path, row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The row's ATIF document: the canonical trial copy, else the projection."""
    candidates: list[str] = []
    rollout_id = row.get("rollout_id")
    filename = row.get("trajectory_filename")
    if isinstance(rollout_id, str) and isinstance(filename, str) and "/" not in filename:
        candidates.append(f"rollout_trials/{rollout_id}/{filename}")
    if filename or not rollout_id:
        candidates.append(f"trajectories/{projection_stem(row)}.json")
    for rel in candidates:
        try:
            document = json.loads(read_bytes(run_dir, rel))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(document, dict):
            document["_path"] = rel
            return document
    return None


def _walk_files(run_dir: Path, rel_root: str) -> Iterator[PurePosixPath]:
    root = run_dir / rel_root
    try:
        if os.path.islink(root) or not root.is_dir():
            return
    except OSError:
        return
    pending = [(root, PurePosixPath())]
    while pending:
        directory, prefix = pending.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            rel = prefix / entry.name
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                pending.append((Path(entry.path), rel))
            elif entry.is_file(follow_symlinks=False):
                yield rel


def list_artifacts(
    run_dir: Path, row: Mapping[str, Any], *, inline_limit: int = 16 * 1024, max_files: int = 50
) -> list[dict[str, Any]]:
    """The row's artifacts: ``path`` (relative to the run dir), ``size``, and ``text`` when
    the file is small UTF-8 text. Reads the projection, else the trial's own directory."""
    stem = projection_stem(row)
    roots = [f"artifacts/{stem}"]
    rollout_id = row.get("rollout_id")
    if isinstance(rollout_id, str):
        roots.append(f"rollout_trials/{rollout_id}/artifacts")
    for rel_root in roots:
        files = sorted(_walk_files(run_dir, rel_root), key=lambda p: p.parts)
        if not files:
            continue
        found: list[dict[str, Any]] = []
        for rel in files[:max_files]:
            path = f"{rel_root}/{rel}"
            full = run_dir / path
            if not _inside(run_dir, full):
                continue
            try:
                size = os.lstat(full).st_size
            except OSError:
                continue
            item: dict[str, Any] = {"name": str(rel), "path": path, "size": size}
            if size <= inline_limit:
                try:
                    data = read_bytes(run_dir, path, limit=inline_limit + 1)
                    text = data.decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    text = None
                if text is not None and "\x00" not in text:
                    item["text"] = text
            found.append(item)
        if len(files) > max_files:
            found.append(
                {
                    "name": f"... {len(files) - max_files} more",
                    "path": rel_root,
                    "size": 0,
                    "more": True,
                }
            )
        return found
    return []


def format_duration(ms: Any) -> str:
    """``830 ms``, ``12.5 s``, ``3m 07s``, ``1h 02m``; a dash when unknown."""
    if not isinstance(ms, (int, float)) or isinstance(ms, bool):
        return "–"
    seconds = float(ms) / 1000
    if seconds < 1:
        return f"{ms:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {sec:02d}s"
