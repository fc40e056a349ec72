"""Compare two runs of the same dataset: which rows regressed or improved, and by how much
the pass rate moved, with a 95% interval so a reviewer can tell noise from change."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_osmosis.report.stats import newcombe_difference, per_row_passes
from pytest_osmosis.results.runs import dataset_row
from pytest_osmosis.words import (
    ERRORED,
    PASS_RATE_BASIS,
    PASSED,
    SKIPPED,
    one_line,
    percent,
    points,
)


def _inputs(run: Mapping[str, Any]) -> dict[str, Any]:
    inputs = run.get("manifest", {}).get("inputs")
    return inputs if isinstance(inputs, dict) else {}


def _side(run: Mapping[str, Any]) -> dict[str, Any]:
    inputs = _inputs(run)
    raw_rollout = inputs.get("rollout")
    rollout: dict[str, Any] = raw_rollout if isinstance(raw_rollout, dict) else {}
    raw_eval_run = run.get("metrics", {}).get("eval_run")
    eval_run: dict[str, Any] = raw_eval_run if isinstance(raw_eval_run, dict) else {}
    summary = run["summary"]
    stats = summary.get("reward_stats") or {}
    return {
        "name": run["name"],
        "path": run["path"],
        "status": run["status"],
        "model": eval_run.get("model_name") or inputs.get("model_path"),
        "dataset": eval_run.get("dataset_name"),
        "rollout": eval_run.get("rollout_name") or rollout.get("name"),
        "source_digest": rollout.get("source_digest"),
        "n": inputs.get("n"),
        "pass_threshold": run["pass_threshold"],
        "passed": summary.get("passed", 0),
        "completed_samples": summary.get("completed_samples", 0),
        "pass_rate": summary.get("pass_rate", 0),
        "reward_mean": stats.get("mean"),
        "tokens_used": summary.get("tokens_used", 0),
        "duration_ms": eval_run.get("duration_ms"),
        "failed": summary.get("failed", 0),
        "skipped": summary.get("skipped", 0),
    }


def compare_runs(current: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """*current* against *baseline* (both from :func:`pytest_osmosis.results.runs.load_run`).

    A row regressed when its share of passing attempts fell, improved when it rose.
    The pass-rate change is ``current - baseline`` over attempts not skipped, with Newcombe's
    hybrid score interval; it treats attempts as independent, which is optimistic
    when n > 1 and rows differ in difficulty.
    """
    a, b = _side(current), _side(baseline)
    warnings: list[str] = []
    sha_a = (_inputs(current).get("dataset") or {}).get("sha256")
    sha_b = (_inputs(baseline).get("dataset") or {}).get("sha256")
    if sha_a and sha_b and sha_a != sha_b:
        warnings.append(
            "the two runs used different dataset files (sha256 "
            f"{str(sha_b)[:12]} vs {str(sha_a)[:12]}); rows are matched by their position "
            "in the file and may not be the same questions"
        )
    if a["pass_threshold"] != b["pass_threshold"]:
        warnings.append(
            f"pass_threshold differs ({float(b['pass_threshold'])!r} vs "
            f"{float(a['pass_threshold'])!r}): the pass rates measure different things"
        )
    for label, run in (("current", current), ("baseline", baseline)):
        if run["status"] != "finished":
            warnings.append(f"the {label} run is {run['status']}: some rows are missing")
    # Rows are matched by their dataset row, so two runs that selected different rows
    # (``--rows``, ``limit``) still line up.
    rows_a = [{**row, "row_index": dataset_row(row)} for row in current["rows"]]
    rows_b = [{**row, "row_index": dataset_row(row)} for row in baseline["rows"]]
    passes_a, passes_b = per_row_passes(rows_a), per_row_passes(rows_b)
    regressed: list[dict[str, Any]] = []
    improved: list[dict[str, Any]] = []
    unchanged = 0
    for source in sorted(set(passes_a) & set(passes_b)):
        (pa, na), (pb, nb) = passes_a[source], passes_b[source]
        if na == 0 or nb == 0:
            continue
        entry = {
            "source_row_index": source,
            "baseline": {"passes": pb, "attempts": nb},
            "current": {"passes": pa, "attempts": na},
            "change": pa / na - pb / nb,
        }
        if pa * nb < pb * na:
            regressed.append(entry)
        elif pa * nb > pb * na:
            improved.append(entry)
        else:
            unchanged += 1
    regressed.sort(key=lambda e: (e["change"], e["source_row_index"]))
    improved.sort(key=lambda e: (-e["change"], e["source_row_index"]))
    only_current = sorted(set(passes_a) - set(passes_b))
    only_baseline = sorted(set(passes_b) - set(passes_a))
    difference, low, high = newcombe_difference(
        int(a["passed"]), int(a["completed_samples"]), int(b["passed"]), int(b["completed_samples"])
    )
    return {
        "current": a,
        "baseline": b,
        "pass_rate_change": {
            "difference": difference,
            "ci95_low": low,
            "ci95_high": high,
            "method": "Newcombe hybrid score (Wilson) interval for a difference of proportions",
            "significant": low > 0 or high < 0,
        },
        "regressed": regressed,
        "improved": improved,
        "unchanged": unchanged,
        "only_in_current": only_current,
        "only_in_baseline": only_baseline,
        "warnings": warnings,
    }


#: What the side-by-side keeps of each attempt (the drawer shows these).
_ATTEMPT_FIELDS = ("n", "outcome", "reward", "ans", "expl", "err", "msg", "cost")


def side_by_side(
    comparison: Mapping[str, Any],
    current: Sequence[Mapping[str, Any]],
    baseline: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Per dataset row, both runs' attempts and answers (report records of each run).

    Regressed rows come first, then improved ones, then the rest by row; ``change`` is
    ``regressed``, ``improved``, ``unchanged``, ``only_current`` or ``only_baseline``.
    """
    change: dict[int, str] = {}
    for key in ("regressed", "improved"):
        for entry in comparison[key]:
            change[entry["source_row_index"]] = key
    for key in ("only_in_current", "only_in_baseline"):
        for row in comparison[key]:
            change[row] = key.replace("_in_", "_")
    sides: dict[int, dict[str, Any]] = {}
    for side, records in (("a", current), ("b", baseline)):
        for record in records:
            entry = sides.setdefault(
                record["r"], {"r": record["r"], "in": [], "lab": "", "a": [], "b": []}
            )
            entry[side].append({k: record[k] for k in _ATTEMPT_FIELDS if k in record})
            if not entry["in"] and record.get("in"):
                entry["in"] = record["in"]
            if not entry["lab"] and record.get("lab"):
                entry["lab"] = record["lab"]
    rank = {"regressed": 0, "improved": 1}
    ordered = sorted(sides, key=lambda row: (rank.get(change.get(row, ""), 2), row))
    return [{**sides[row], "change": change.get(row, "unchanged")} for row in ordered]


def _num(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "–" if value is None else str(value)
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _threshold(value: Any) -> str:
    return repr(float(value)) if isinstance(value, (int, float)) else "–"


def escape_markdown(text: Any) -> str:
    """Text safe inside a Markdown table cell (no pipes, no HTML, no newlines)."""
    value = str(text if text is not None else "–")
    for char in ("\\", "|", "`", "*", "_", "<", ">", "[", "]"):
        value = value.replace(char, "\\" + char)
    return one_line(value)


def comparison_markdown(comparison: Mapping[str, Any], *, max_rows: int = 50) -> str:
    """The comparison as GitHub-flavoured Markdown, for a pull-request comment."""
    a, b = comparison["current"], comparison["baseline"]
    change = comparison["pass_rate_change"]
    verdict = "significant" if change["significant"] else "within noise"
    lines = [
        f"### Osmosis eval: {escape_markdown(a['name'])} vs {escape_markdown(b['name'])}",
        "",
        f"**Pass rate {percent(a['pass_rate'])}** (was {percent(b['pass_rate'])}): "
        f"**{points(change['difference'])}**, 95% CI {points(change['ci95_low'])} to "
        f"{points(change['ci95_high'])} ({verdict}).",
        "",
        f"| | baseline: {escape_markdown(b['name'])} | current: {escape_markdown(a['name'])} |",
        "|---|---|---|",
    ]
    for label, key, fmt in (
        ("status", "status", escape_markdown),
        ("model", "model", escape_markdown),
        ("rollout", "rollout", escape_markdown),
        ("dataset", "dataset", escape_markdown),
        ("n", "n", _num),
        ("pass threshold", "pass_threshold", _threshold),
        (f"{PASSED} / {PASS_RATE_BASIS}", None, None),
        ("pass rate", "pass_rate", percent),
        (ERRORED, "failed", _num),
        (SKIPPED, "skipped", _num),
        ("mean reward", "reward_mean", _num),
        ("tokens", "tokens_used", _num),
    ):
        if key is None:
            lines.append(
                f"| {label} | {b['passed']}/{b['completed_samples']} | "
                f"{a['passed']}/{a['completed_samples']} |"
            )
        else:
            assert fmt is not None
            lines.append(f"| {label} | {fmt(b[key])} | {fmt(a[key])} |")
    for warning in comparison["warnings"]:
        lines += ["", f"> **Warning:** {escape_markdown(warning)}"]
    for title, key in (("Regressed", "regressed"), ("Improved", "improved")):
        entries = comparison[key]
        lines += ["", f"#### {title} rows ({len(entries)})", ""]
        if not entries:
            lines.append("None.")
            continue
        lines += ["| row | baseline passes | current passes |", "|---:|---:|---:|"]
        for entry in entries[:max_rows]:
            lines.append(
                f"| {entry['source_row_index']} | "
                f"{entry['baseline']['passes']}/{entry['baseline']['attempts']} | "
                f"{entry['current']['passes']}/{entry['current']['attempts']} |"
            )
        if len(entries) > max_rows:
            lines.append(f"| … | {len(entries) - max_rows} more | |")
    extra = []
    if comparison["only_in_current"]:
        extra.append(f"{len(comparison['only_in_current'])} row(s) only in the current run")
    if comparison["only_in_baseline"]:
        extra.append(f"{len(comparison['only_in_baseline'])} row(s) only in the baseline")
    lines += [
        "",
        f"{comparison['unchanged']} row(s) unchanged" + "".join(f"; {e}" for e in extra) + ".",
    ]
    return "\n".join(lines) + "\n"
