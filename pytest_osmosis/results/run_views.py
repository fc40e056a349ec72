"""What ``list`` and ``info`` show of a loaded run (:func:`~.run_reader.load_run`).

View models as plain data (``--json`` prints them as they are): one ``list`` entry
(:func:`run_list_item`) and the ``info`` sections (:func:`run_info`), each built by
its own function from the run's manifest, metrics and rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_osmosis.core.outcome import OUTCOMES
from pytest_osmosis.results.row_metrics import recorded_cost
from pytest_osmosis.results.run_reader import (
    dict_of,
    is_int,
    is_number,
    recorded_selection,
    started_at,
)
from pytest_osmosis.results.runs import error_messages


def run_list_item(run: Mapping[str, Any]) -> dict[str, Any]:
    """One ``list`` entry: identity, status, what ran, progress, pass rate, timing."""
    manifest = dict_of(run.get("manifest"))
    inputs = dict_of(manifest.get("inputs"))
    eval_run = dict_of(dict_of(run.get("metrics")).get("eval_run"))
    summary = dict_of(run.get("summary"))
    when = started_at(run)
    duration = eval_run.get("duration_ms")
    return {
        "name": run["name"],
        "path": run["path"],
        "status": run["status"],
        "rollout": eval_run.get("rollout_name") or dict_of(inputs.get("rollout")).get("name"),
        "model": eval_run.get("model_name") or inputs.get("model_path"),
        "dataset": eval_run.get("dataset_name"),
        "rows_done": run.get("rows_done", len(run["rows"])),
        "rows_total": run.get("total_runs"),
        "pass_rate": summary.get("pass_rate", 0),
        "pass_threshold": run.get("pass_threshold"),
        "passed": summary.get("passed", 0),
        "completed_samples": summary.get("completed_samples", 0),
        "started_at": when.isoformat().replace("+00:00", "Z") if when else None,
        "duration_ms": float(duration) if is_number(duration) else None,
        "warnings": list(run.get("warnings", [])),
    }


def run_info(run: Mapping[str, Any]) -> dict[str, Any]:
    """``info``: context, timing, progress, configuration, results (and the recorded cost),
    attempts not passed."""
    manifest = dict_of(run.get("manifest"))
    eval_run = dict_of(dict_of(run.get("metrics")).get("eval_run"))
    rows: list[dict[str, Any]] = list(run["rows"])
    git = _git(dict_of(manifest.get("provenance")))
    errors = error_messages(
        Path(str(run["path"])),
        {r["rollout_id"] for r in rows if r["outcome"] == "failed" and "rollout_id" in r},
    )
    return {
        "name": run["name"],
        "path": run["path"],
        "status": run["status"],
        "local_run_id": manifest.get("local_run_id") or eval_run.get("id"),
        "context": _context(manifest, eval_run, git),
        "timing": _timing(manifest, eval_run),
        "progress": _progress(run, rows),
        "configuration": _configuration(run, manifest),
        "results": dict(run["summary"]),
        "cost": recorded_cost(dict_of(run.get("row_metrics"))),
        "failed_rows": _briefs(rows, "failed", errors),
        "below_threshold_rows": _briefs(rows, "below_threshold", errors),
        "skipped_rows": _briefs(rows, "skipped", errors),
        "error_types": _error_type_counts(rows),
        "warnings": list(run.get("warnings", [])) + _git_warnings(git),
    }


def _git(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The workspace's commit, branch and dirtiness when the run started (what is recorded)."""
    fields = (("git_head", "commit"), ("git_branch", "branch"), ("git_dirty", "dirty"))
    return {field: provenance[key] for key, field in fields if key in provenance}


def _git_warnings(git: Mapping[str, Any]) -> list[str]:
    if git.get("dirty") is not True:
        return []
    return [
        "the workspace had uncommitted changes when this run started: "
        f"commit {str(git.get('commit', '?'))[:12]} does not fully describe the code"
    ]


def _context(
    manifest: Mapping[str, Any], eval_run: Mapping[str, Any], git: dict[str, Any]
) -> dict[str, Any]:
    """What ran: model, dataset, rollout, config and the code's provenance."""
    inputs = dict_of(manifest.get("inputs"))
    provenance = dict_of(manifest.get("provenance"))
    rollout = dict_of(inputs.get("rollout"))
    return {
        "model": eval_run.get("model_name") or inputs.get("model_path"),
        "dataset": eval_run.get("dataset_name"),
        "dataset_sha256": dict_of(inputs.get("dataset")).get("sha256"),
        "rollout": eval_run.get("rollout_name") or rollout.get("name"),
        "entrypoint": rollout.get("entrypoint"),
        "rollout_source_digest": rollout.get("source_digest"),
        "config_path": provenance.get("config_path"),
        "sdk_version": provenance.get("sdk_version"),
        "git": git,
        "config_branch": provenance.get("config_branch"),
        "config_commit_sha": provenance.get("config_commit_sha"),
        "versions": dict_of(inputs.get("versions")),
    }


def _timing(manifest: Mapping[str, Any], eval_run: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "created_at": manifest.get("created_at"),
        "started_at": eval_run.get("started_at"),
        "completed_at": eval_run.get("completed_at"),
        "duration_ms": eval_run.get("duration_ms"),
    }


def _progress(run: Mapping[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Attempts recorded of those planned, by outcome, and the rows selected."""
    progress = dict_of(run.get("progress"))
    total = run.get("total_runs")
    counts = {outcome: 0 for outcome in OUTCOMES}
    for row in rows:
        counts[row["outcome"]] += 1
    sampled = progress.get("sampled_rows")
    if not is_int(sampled):
        inputs = dict_of(dict_of(run.get("manifest")).get("inputs"))
        selected = recorded_selection(dict_of(inputs.get("dataset")).get("selected_source_rows"))
        sampled = len(selected) if selected is not None else None
    return {
        "done": len(rows),
        "total": total,
        "pending": (total - len(rows)) if isinstance(total, int) else None,
        "sampled_rows": sampled,
        "total_dataset_rows": progress.get("total_dataset_rows"),
        **counts,
        "resumed": sum(1 for row in rows if row.get("resumed")),
        "source": run.get("rows_source"),
    }


def _configuration(run: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """How the run was configured: n, rows, threshold, timeouts, env and secret names."""
    inputs = dict_of(manifest.get("inputs"))
    timeouts = dict_of(inputs.get("timeouts"))
    return {
        "n": inputs.get("n"),
        "selection": dict_of(inputs.get("dataset")).get("selected_source_rows"),
        "pass_threshold": run.get("pass_threshold"),
        "timeouts": {
            "agent_workflow_timeout_s": timeouts.get("agent_timeout_sec"),
            "grader_timeout_s": timeouts.get("grader_timeout_sec"),
        },
        "env_keys": sorted(dict_of(inputs.get("env"))),
        "secret_names": [s for s in inputs.get("secret_names") or [] if isinstance(s, str)],
        "advanced": dict_of(dict_of(manifest.get("provenance")).get("advanced")),
    }


_BRIEF_KEYS = ("row_index", "run_index", "source_row_index", "rollout_id", "reward", "error_type")


def _briefs(
    rows: list[dict[str, Any]], outcome: str, errors: Mapping[str, Mapping[str, str]]
) -> list[dict[str, Any]]:
    """The attempts of one *outcome*, each with its logged error headline when there is one."""
    briefs = []
    for row in rows:
        if row["outcome"] != outcome:
            continue
        item = {key: row[key] for key in _BRIEF_KEYS if key in row}
        error = errors.get(str(row.get("rollout_id")))
        if error:
            item["error_message"] = error["message"]
        briefs.append(item)
    return briefs


def _error_type_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        if row["outcome"] == "failed":
            key = str(row.get("error_type") or "unknown")
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


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
