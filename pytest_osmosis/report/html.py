"""Render one run (optionally compared with another) as a self-contained HTML page.

Everything is inline: CSS, script, SVG plots and the data (as a JSON script block).
A Content-Security-Policy forbids every network fetch, so opening a report can never
call home or load a CDN, even if a run directory contained a hostile string.
The markup is in ``templates/`` (autoescaped); this module computes what they print.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_osmosis import __version__
from pytest_osmosis.core import outcome
from pytest_osmosis.core.words import (
    ERRORED,
    NO_RATE,
    OUTCOME_WORDS,
    OUTCOMES,
    PASS_RATE_BASIS,
    PASSED,
    SKIPPED,
    costs_text,
    one_line,
    pass_rate_basis,
    percent,
)
from pytest_osmosis.report.assets import CSS, JS
from pytest_osmosis.report.compare import p_text, side_by_side
from pytest_osmosis.report.data import (
    CELL_CHARS,
    DatasetInputs,
    build_rows,
    input_text,
    share_inputs,
)
from pytest_osmosis.report.stats import (
    ALPHA,
    pass_at_k_curve,
    quantile,
    wilson_interval,
)
from pytest_osmosis.report.svg import bar_chart, histogram, line_chart
from pytest_osmosis.report.templating import Markup, render
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.row_metrics import per_row_passes
from pytest_osmosis.results.run_reader import dataset_row, parse_time
from pytest_osmosis.results.run_views import format_duration, run_info

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'"
)
PER_ROW_BARS_MAX = 120
LISTED_ROWS_MAX = 500  # rows a regressed/improved listing shows; the rest are counted


def _when(value: Any) -> str:
    parsed = parse_time(value)
    return parsed.strftime("%Y-%m-%d %H:%M:%S UTC") if parsed else ""


def _json_script(payload: Any) -> str:
    """JSON that cannot end the ``<script>`` block it sits in."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


# ----------------------------------------------------------------------------- pieces


def _header_meta(info: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The header's (label, value) pairs, those with a value."""
    ctx, timing = info["context"], info["timing"]
    git = ctx.get("git") or {}
    bits = [
        ("model", ctx.get("model")),
        ("dataset", ctx.get("dataset")),
        ("rollout", f"{ctx.get('rollout') or '–'} / {ctx.get('entrypoint') or '–'}"),
        ("started", _when(timing.get("started_at") or timing.get("created_at"))),
        ("duration", format_duration(timing.get("duration_ms"))),
    ]
    if git.get("commit"):
        commit = str(git["commit"])[:10]
        branch = f" ({git['branch']})" if git.get("branch") else ""
        bits.append(
            ("commit", f"{commit}{branch}" + (" + uncommitted changes" if git.get("dirty") else ""))
        )
    return [(label, str(value)) for label, value in bits if value]


def _cards(
    info: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    records: Sequence[Mapping[str, Any]],
) -> Markup:
    """The headline cards (``templates/cards.html``)."""
    results = info["results"]
    progress = info["progress"]
    threshold = info["configuration"]["pass_threshold"]
    passed, scored = int(results.get("passed", 0)), int(results.get("completed_samples", 0))
    low, high = wilson_interval(passed, scored)
    rate = {
        "value": percent(results.get("pass_rate", 0)) if scored else NO_RATE,
        "basis": pass_rate_basis(passed, scored),
        "threshold": repr(float(threshold)),
        "ci": (percent(low), percent(high)) if scored else None,
        "cls": "good" if scored and passed == scored else ("bad" if scored and not passed else ""),
    }
    total = max(len(rows), 1)
    outcomes = {
        "done": f"{progress['done']}"
        + (f" / {progress['total']}" if progress.get("total") else ""),
        "parts": [
            {
                "key": o,
                "var": _VAR[o],
                "word": OUTCOME_WORDS[o],
                "count": progress[o],
                "width": f"{progress[o] / total * 100:.2f}",
            }
            for o in OUTCOMES
        ],
    }
    tokens = int(results.get("tokens_used", 0))
    counted = [row["tokens"] for row in rows if isinstance(row.get("tokens"), int)]
    plain = [
        _plain_card(
            "Tokens",
            f"{tokens:,}",
            f"{tokens / len(counted):,.0f} per attempt on average" if counted else "not recorded",
        )
    ]
    costs = [float(r["cost"]) for r in records if isinstance(r.get("cost"), (int, float))]
    # In the results table's words (an attempt without a priced model call: unknown, not $0).
    if costs:
        mean = _cost_text(math.fsum(costs) / len(costs))
        priced = f"{costs_text(r.get('cost') for r in records)}; {mean} per priced attempt"
        plain.append(_plain_card("Cost", _cost_text(math.fsum(costs)), priced))
    else:
        plain.append(_plain_card("Cost", "unknown", "no attempt had a priced model call"))
    durations = [float(row["duration_ms"]) for row in rows if "duration_ms" in row]
    sub = (
        f"per attempt: median {format_duration(quantile(durations, 0.5))}, "
        f"p95 {format_duration(quantile(durations, 0.95))}"
        if durations
        else ""
    )
    plain.append(_plain_card("Duration", format_duration(info["timing"].get("duration_ms")), sub))
    points = results.get("pass_at_k") or []
    passk = None
    if points:
        best = points[-1]
        passk = _plain_card(
            f"pass@{best['k']}",
            percent(best["value"]),
            " · ".join(f"pass@{p['k']} {percent(p['value'])}" for p in points),
        )
    stats = results.get("reward_stats")
    reward = (
        _plain_card(
            "Mean reward",
            f"{stats['mean']:.3f}",
            f"std {stats['std']:.3f} · median {stats['median']:.3f} · "
            f"range {stats['min']:.3f} – {stats['max']:.3f}",
        )
        if stats
        else None
    )
    return _fragment(
        "cards.html",
        rate=rate,
        outcomes=outcomes,
        plain=plain,
        passk=passk,
        n=_blank_none(info["configuration"].get("n")),
        reward=reward,
    )


def _plain_card(label: str, value: str, sub: str, cls: str = "") -> dict[str, str]:
    """A card whose every part is text (``fragments.html``'s ``card`` escapes it)."""
    return {"label": label, "value": value, "sub": sub, "cls": cls}


def _blank_none(value: Any) -> Any:
    """A missing value prints as nothing, not ``None``."""
    return "" if value is None else value


def _fragment(template: str, **context: Any) -> Markup:
    """A template's HTML, to print inside another page as it is."""
    return Markup(render(template, **context))


_VAR = {"passed": "pass", "below_threshold": "below", "failed": "fail", "skipped": "skip"}


def _plots(info: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> Markup:
    """The four charts (``templates/plots.html``)."""
    threshold = float(info["configuration"]["pass_threshold"])
    rewards = [float(r["reward"]) for r in rows if r.get("outcome") != "skipped" and "reward" in r]
    reward_svg = histogram(
        "reward", "Reward distribution", rewards, x_label="reward", threshold=threshold
    )
    curve = pass_at_k_curve(rows)
    note = None
    if curve and len(curve) == 1:
        note = "one attempt per row: run with n ≥ 2 to see pass@k grow"
    passk_svg = line_chart(
        "pass-at-k", "pass@k against k", curve, x_label="k (attempts)", y_label="pass@k", note=note
    )
    counts = per_row_passes(rows, key=dataset_row)
    max_attempts = max((a for _, a in counts.values()), default=0)
    if len(counts) <= PER_ROW_BARS_MAX:
        bars = []
        for row_index in sorted(counts):
            passes, attempts = counts[row_index]
            css = (
                "none"
                if attempts == 0
                else "pass"
                if passes == attempts
                else "fail"
                if passes == 0
                else "mixed"
            )
            share = passes / attempts if attempts else 0.0
            hover = (
                f"row {row_index}: {passes}/{attempts} attempts passed"
                if attempts
                else f"row {row_index}: every attempt skipped"
            )
            bars.append((str(row_index), share, css, hover))
        per_row = bar_chart(
            "per-row",
            "Passing attempts per row",
            bars,
            x_label="row",
            y_label="attempts passed",
            pct=True,
            every=max(1, len(bars) // 20),
        )
        per_row_note = "green: always passes · amber: flaky · red: never passes"
    else:
        buckets = [0] * (max_attempts + 1)
        for passes, attempts in counts.values():
            if attempts:
                buckets[passes] += 1
        bars = [
            (
                str(p),
                float(c),
                "fail" if p == 0 else "pass" if p == max_attempts else "mixed",
                f"{c} rows with {p} of {max_attempts} attempts passing",
            )
            for p, c in enumerate(buckets)
        ]
        per_row = bar_chart(
            "per-row",
            "Rows by number of passing attempts",
            bars,
            x_label=f"passing attempts (of {max_attempts})",
            y_label="rows",
        )
        per_row_note = f"{len(counts)} rows; amber bars are flaky rows"
    durations = [float(r["duration_ms"]) / 1000 for r in rows if "duration_ms" in r]
    duration_svg = histogram(
        "duration", "Duration per attempt", durations, x_label="seconds per attempt", unit=" s"
    )
    flaky = sum(1 for p, a in counts.values() if 0 < p < a)
    figures = [
        ("Reward distribution", f"attempts with a reward; threshold {threshold!r}", reward_svg),
        ("pass@k", "chance that at least one of k attempts passes", passk_svg),
        ("Per-row pass count", f"{flaky} flaky row(s); " + per_row_note, per_row),
        ("Duration distribution", "dispatch to result, per attempt", duration_svg),
    ]
    return _fragment(
        "plots.html",
        figures=[{"title": t, "note": n, "svg": Markup(svg)} for t, n, svg in figures],
    )


def _cost_text(value: Any) -> str:
    return f"${value:.4f}" if isinstance(value, (int, float)) else "–"


def _table(records: Sequence[Mapping[str, Any]]) -> Markup:
    """Every attempt, with its filters (``templates/attempts.html``)."""
    explained = any("expl" in r for r in records)
    priced = any("cost" in r for r in records)
    columns = [
        ("r", "row", "num"),
        ("n", "attempt", "num"),
        ("outcome", "outcome", ""),
        ("reward", "reward", "num"),
        ("q_in", "input", "clip"),
        ("lab", "label", "clip short"),
        ("ans", "final answer", "clip"),
        *([("expl", "grader's explanation", "clip")] if explained else []),
        ("tokens", "tokens", "num"),
        *([("cost", "cost", "num")] if priced else []),
        ("dur", "duration", "num"),
        ("err", "error type", ""),
        ("rid", "rollout id", ""),
    ]
    rows = [
        {
            "i": r["i"],
            "key": f"{r['r']}.{r['n']}",
            "outcome": r["outcome"],
            "status": r["status"],
            "cells": {
                "r": r["r"],
                "n": r["n"],
                "outcome": OUTCOME_WORDS.get(r["outcome"], r["outcome"]),
                "reward": f"{r['reward']:.3f}" if isinstance(r.get("reward"), float) else "–",
                "q_in": one_line(input_text(r), CELL_CHARS),
                "lab": one_line(r.get("lab", ""), CELL_CHARS),
                "ans": one_line(r.get("ans", ""), CELL_CHARS),
                "expl": one_line(r.get("expl", ""), CELL_CHARS),
                "tokens": r.get("tokens", "–"),
                "cost": _cost_text(r.get("cost")),
                "dur": format_duration(r.get("dur")),
                "err": r.get("err", ""),
                "rid": str(r.get("rid", ""))[:8],
            },
        }
        for r in records
    ]
    return _fragment(
        "attempts.html",
        outcome_options=[(o, OUTCOME_WORDS[o]) for o in OUTCOMES[:3]],
        skipped=SKIPPED,
        error_types=sorted({str(r["err"]) for r in records if r.get("err")}),
        columns=columns,
        rows=rows,
    )


def _comparison(comparison: Mapping[str, Any], pairs: Sequence[Mapping[str, Any]]) -> Markup:
    """The comparison with a baseline run (``templates/comparison.html``)."""
    a, b = comparison["current"], comparison["baseline"]
    change = comparison["pass_rate_change"]
    paired = comparison["paired"]
    cls = (
        "delta-up" if change["difference"] > 0 else "delta-down" if change["difference"] < 0 else ""
    )
    side = [
        ("status", b["status"], a["status"]),
        ("model", b["model"], a["model"]),
        ("rollout", b["rollout"], a["rollout"]),
        ("dataset", b["dataset"], a["dataset"]),
        ("n", b["n"], a["n"]),
        ("pass threshold", b["pass_threshold"], a["pass_threshold"]),
        (
            f"{PASSED} / {PASS_RATE_BASIS}",
            f"{b['passed']}/{b['completed_samples']}",
            f"{a['passed']}/{a['completed_samples']}",
        ),
        ("pass rate", percent(b["pass_rate"]), percent(a["pass_rate"])),
        (ERRORED, b["failed"], a["failed"]),
        ("mean reward", _fmt3(b["reward_mean"]), _fmt3(a["reward_mean"])),
        ("tokens", b["tokens_used"], a["tokens_used"]),
        ("duration", format_duration(b["duration_ms"]), format_duration(a["duration_ms"])),
    ]
    verdict = "significant at 95%" if change["significant"] else "within noise at 95%"
    cards = [
        _plain_card(
            "Paired change",
            f"{paired['change'] * 100:+.1f} pp",
            f"{paired['worse']} rows worse, {paired['better']} better of {paired['rows']}: "
            f"p = {p_text(paired['p_value'])} (exact paired test / McNemar; "
            f"{'significant' if paired['p_value'] < ALPHA else 'within noise'} at {ALPHA:g})",
            cls,
        ),
        _plain_card(
            "Pass-rate change",
            f"{change['difference'] * 100:+.1f} pp",
            f"95% CI {change['ci95_low'] * 100:+.1f} to {change['ci95_high'] * 100:+.1f} pp"
            f" ({verdict}; Newcombe, unpaired)",
            cls,
        ),
        _plain_card(
            "Regressed rows",
            str(len(comparison["regressed"])),
            "fewer passing attempts",
            "bad" if comparison["regressed"] else "",
        ),
        _plain_card(
            "Improved rows",
            str(len(comparison["improved"])),
            "more passing attempts",
            "good" if comparison["improved"] else "",
        ),
        _plain_card(
            "Unchanged rows",
            str(comparison["unchanged"]),
            f"{len(comparison['only_in_current'])} only here, "
            f"{len(comparison['only_in_baseline'])} only in the baseline",
        ),
    ]
    return _fragment(
        "comparison.html",
        baseline=b["name"],
        current=a["name"],
        messages=comparison["warnings"],
        cards=cards,
        side=[(k, _blank_none(x), _blank_none(y)) for k, x, y in side],
        regressed=comparison["regressed"],
        improved=comparison["improved"],
        shown=LISTED_ROWS_MAX,
        pairs=[_pair_view(p) for p in pairs],
        passed=PASSED,
        skipped=SKIPPED,
    )


_CHANGE_WORDS = {
    "regressed": "regressed",
    "improved": "improved",
    "unchanged": "unchanged",
    "only_current": "only in current",
    "only_baseline": "only in baseline",
}


def _pair_view(pair: Mapping[str, Any]) -> dict[str, Any]:
    """One row of the row-by-row table: its input and both runs' answers, on one line."""
    return {
        "r": pair["r"],
        "change": pair["change"],
        "word": _CHANGE_WORDS[pair["change"]],
        "input": one_line(input_text(pair), CELL_CHARS),
        "b": _answers_view(pair["b"]),
        "a": _answers_view(pair["a"]),
    }


def _answers_view(attempts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``1/2 passed`` and the first attempt's answer (or error type); ``None``: not run."""
    if not attempts:
        return None
    passes = sum(1 for a in attempts if a.get("outcome") == outcome.PASSED)
    counted = sum(1 for a in attempts if a.get("outcome") != outcome.SKIPPED)
    first = attempts[0]
    said = first.get("ans") or (f"[{first['err']}]" if first.get("err") else "")
    return {"passes": passes, "counted": counted, "said": one_line(str(said), CELL_CHARS)}


def _inputs_note(inputs: DatasetInputs | None) -> str:
    """Where the rows' inputs came from, when not from a dataset file."""
    note = inputs.note if inputs is not None else "inputs are taken from trajectories"
    return note[:1].upper() + note[1:]


def _fmt3(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "–"


def render_html(
    run: Mapping[str, Any],
    report_dir: Path,
    comparison: Mapping[str, Any] | None = None,
    inputs: DatasetInputs | None = None,
    baseline: Mapping[str, Any] | None = None,
) -> str:
    """The report page for *run* (from ``load_run``); links are relative to *report_dir*.

    *inputs* gives rows their dataset input (a row that failed before producing a
    sample has no other); without it, inputs come from trajectories. With a
    *comparison*, *baseline* (the compared run) gives the row-by-row answers.
    """
    info = run_info(run)
    records = build_rows(run, report_dir, inputs)
    pairs: list[dict[str, Any]] = []
    if comparison is not None and baseline is not None:
        pairs = side_by_side(comparison, records, build_rows(baseline, report_dir, embed=False))
    rows: Sequence[Mapping[str, Any]] = run["rows"]
    # After the table and the comparison are drawn: they read each record's own input.
    comparison_html = _comparison(comparison, pairs) if comparison is not None else Markup()
    table = _table(records)
    shared = share_inputs(records, pairs)
    data = {
        "rows": records,
        "inputs": shared,
        "words": OUTCOME_WORDS,
        "cmp": {"rows": pairs, "names": [comparison["baseline"]["name"], info["name"]]}
        if comparison is not None
        else None,
    }
    return render(
        "report.html",
        csp=Markup(CSP),  # our constants and our own fragments, printed as they are
        css=Markup(CSS),
        js=Markup(JS),
        version=__version__,
        name=info["name"],
        status=info["status"],
        path=info["path"],
        meta=_header_meta(info),
        warnings=info["warnings"],
        cards=_cards(info, rows, records),
        comparison=comparison_html,
        plots=_plots(info, rows),
        table=table,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        inputs_path=inputs.path if inputs is not None else None,
        inputs_note=_inputs_note(inputs),
        data=Markup(_json_script(data)),
    )
