"""Compare two runs of the same dataset: which rows regressed or improved, and by how much
the pass rate moved, with a 95% interval so a reviewer can tell noise from change."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from pytest_osmosis.core.words import (
    ERRORED,
    PASS_RATE_BASIS,
    PASSED,
    SKIPPED,
    one_line,
    percent,
    points,
)
from pytest_osmosis.report.stats import (
    ALPHA,
    newcombe_difference,
    permutation_test,
)
from pytest_osmosis.results.row_metrics import per_row_passes
from pytest_osmosis.results.run_reader import dataset_row


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


def compare_runs(
    current: Mapping[str, Any],
    baseline: Mapping[str, Any],
    *,
    digests: tuple[Mapping[int, str] | None, Mapping[int, str] | None] | None = None,
    hints: tuple[Path, ...] = (),
) -> dict[str, Any]:
    """*current* against *baseline* (both from :func:`pytest_osmosis.results.run_reader.load_run`).

    Rows are matched by content (``baseline.match_rows``; *digests* are each run's, else
    read with ``baseline.run_row_digests``), by dataset row when a run's content is not
    known. A row regressed when its share of passing attempts fell, improved when it rose.
    Over the rows both runs scored: ``paired`` is the exact paired permutation test of the
    rows' changes (exact McNemar for n = 1), ``pass_rate_change`` Newcombe's hybrid score interval,
    which treats the two runs as independent samples (they are not: the same rows).
    """
    from pytest_osmosis.baseline import match_rows, run_row_digests

    a, b = _side(current), _side(baseline)
    warnings: list[str] = []
    if a["pass_threshold"] != b["pass_threshold"]:
        warnings.append(
            f"pass_threshold differs ({float(b['pass_threshold'])!r} vs "
            f"{float(a['pass_threshold'])!r}): the pass rates measure different things"
        )
    for label, run in (("current", current), ("baseline", baseline)):
        if run["status"] != "finished":
            warnings.append(f"the {label} run is {run['status']}: some rows are missing")
    passes_a = per_row_passes(current["rows"], key=dataset_row)
    passes_b = per_row_passes(baseline["rows"], key=dataset_row)
    keys_a, keys_b = digests or (run_row_digests(current, hints), run_row_digests(baseline, hints))
    matched_by = "content"
    if keys_a is None or keys_b is None:
        matched_by = "dataset row"
        keys_a = {row: f"row {row}" for row in passes_a}
        keys_b = {row: f"row {row}" for row in passes_b}
        sha_a = (_inputs(current).get("dataset") or {}).get("sha256")
        sha_b = (_inputs(baseline).get("dataset") or {}).get("sha256")
        if sha_a and sha_b and sha_a != sha_b:
            warnings.append(
                "the two runs used different dataset files (sha256 "
                f"{str(sha_b)[:12]} vs {str(sha_a)[:12]}) and their rows' content is not "
                "known; rows are matched by their position in the file and may not be the "
                "same questions"
            )
    match = match_rows(
        {row: key for row, key in keys_a.items() if row in passes_a},
        {row: key for row, key in keys_b.items() if row in passes_b},
    )
    regressed: list[dict[str, Any]] = []
    improved: list[dict[str, Any]] = []
    unchanged = 0
    totals = [0, 0, 0, 0]  # passes and attempts: current, baseline
    changes: list[Fraction] = []
    for mine, theirs in match.pairs:
        (pa, na), (pb, nb) = passes_a[mine], passes_b[theirs]
        if na == 0 or nb == 0:
            continue
        for at, value in enumerate((pa, na, pb, nb)):
            totals[at] += value
        changes.append(Fraction(pa, na) - Fraction(pb, nb))
        entry = {
            "source_row_index": mine,
            "baseline_row_index": theirs,
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
    difference, low, high = newcombe_difference(*totals)
    single = all(
        passes_a[mine][1] <= 1 and passes_b[theirs][1] <= 1 for mine, theirs in match.pairs
    )
    return {
        "current": a,
        "baseline": b,
        "rows": {
            "matched_by": matched_by,
            "compared": len(changes),
            "added": match.added,
            "removed": match.removed,
            "changed": match.changed,
            # [current row, baseline row] of the rows matched at another place in the file.
            "moved": [[mine, theirs] for mine, theirs in match.pairs if mine != theirs],
            "text": match.text() if matched_by == "content" else None,
        },
        "common": {
            "current": {"passed": totals[0], "attempts": totals[1]},
            "baseline": {"passed": totals[2], "attempts": totals[3]},
        },
        "paired": paired_test(changes, single),
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
        "only_in_current": sorted(match.added + match.changed),
        "only_in_baseline": sorted(match.removed + match.changed),
        "warnings": warnings,
    }


def paired_test(changes: Sequence[Fraction], single: bool) -> dict[str, Any]:
    """The paired test over the rows both runs scored, from each row's change in its share
    of passing attempts (current - baseline); *single*: one attempt a row on both sides."""
    return {
        "method": paired_method(single),
        "rows": len(changes),
        "worse": sum(1 for change in changes if change < 0),
        "better": sum(1 for change in changes if change > 0),
        "change": float(sum(changes, Fraction(0)) / len(changes)) if changes else 0.0,
        "p_value": permutation_test(changes),
    }


def paired_method(single: bool) -> str:
    """How the paired test is named wherever it is shown (one attempt per row, or more)."""
    if single:
        return "exact McNemar test on the rows whose verdict flipped"
    return "exact paired permutation test on the rows' change in passing attempts"


def paired_text(paired: Mapping[str, Any]) -> str:
    """``7 rows worse, 0 better of 27, two-sided p = 0.016 (exact McNemar ...)``."""
    worse = f"{paired['worse']} row{'' if paired['worse'] == 1 else 's'}"
    return (
        f"{worse} worse, {paired['better']} better of {paired['rows']}, "
        f"two-sided p = {p_text(paired['p_value'])} ({paired['method']})"
    )


def p_text(value: float) -> str:
    return f"{value:.3f}" if value >= 0.001 else "< 0.001"


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
    matched = comparison.get("rows") or {}
    moved = {theirs: mine for mine, theirs in matched.get("moved", [])}
    # A baseline row no current row matches is shown on its own (another question may sit
    # at its place in the current file): "9 (baseline)".
    alone = set(matched.get("removed", [])) | set(matched.get("changed", []))
    change: dict[int | str, str] = {}
    for key in ("regressed", "improved"):
        for entry in comparison[key]:
            change[entry["source_row_index"]] = key
    for added in comparison["only_in_current"]:
        change[added] = "only_current"
    for gone in alone:
        change[_baseline_only(gone)] = "only_baseline"
    sides: dict[int | str, dict[str, Any]] = {}
    for side, records in (("a", current), ("b", baseline)):
        for record in records:
            row: int | str = record["r"]
            if side == "b":
                row = _baseline_only(record["r"]) if row in alone else moved.get(record["r"], row)
            entry = sides.setdefault(row, {"r": row, "in": [], "lab": "", "a": [], "b": []})
            entry[side].append({k: record[k] for k in _ATTEMPT_FIELDS if k in record})
            if not entry["in"] and record.get("in"):
                entry["in"] = record["in"]
            if not entry["lab"] and record.get("lab"):
                entry["lab"] = record["lab"]
    rank = {"regressed": 0, "improved": 1}

    def order(row: int | str) -> tuple[int, int, bool]:
        return rank.get(change.get(row, ""), 2), int(str(row).split()[0]), isinstance(row, str)

    return [
        {**sides[row], "change": change.get(row, "unchanged")} for row in sorted(sides, key=order)
    ]


def _baseline_only(row: int) -> str:
    return f"{row} (baseline)"


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
    paired = comparison["paired"]
    verdict = "significant" if change["significant"] else "within noise"
    shown = "significant" if paired["p_value"] < ALPHA else "within noise"
    lines = [
        f"### Osmosis eval: {escape_markdown(a['name'])} vs {escape_markdown(b['name'])}",
        "",
        f"**Pass rate {percent(a['pass_rate'])}** (was {percent(b['pass_rate'])}): "
        f"**{points(float(a['pass_rate']) - float(b['pass_rate']))}**.",
        "",
        f"- **Paired** ({paired['rows']} rows both runs scored): "
        f"**{points(paired['change'])}**; {escape_markdown(paired_text(paired))}: "
        f"**{shown}** at {ALPHA:g}.",
        f"- Unpaired: {points(change['difference'])}, 95% CI {points(change['ci95_low'])} to "
        f"{points(change['ci95_high'])} ({verdict}; Newcombe, as if the runs were independent "
        "samples).",
    ]
    if comparison["rows"]["text"]:
        lines.append(f"- Rows: {escape_markdown(comparison['rows']['text'])}.")
    lines += [
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
