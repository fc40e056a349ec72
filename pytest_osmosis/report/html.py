"""Render one run (optionally compared with another) as a self-contained HTML page.

Everything is inline: CSS, script, SVG plots and the data (as a JSON script block).
A Content-Security-Policy forbids every network fetch, so opening a report can never
call home or load a CDN, even if a run directory contained a hostile string.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from html import escape
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
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.row_metrics import per_row_passes
from pytest_osmosis.results.run_reader import dataset_row, parse_time
from pytest_osmosis.results.run_views import format_duration, run_info

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'"
)
PER_ROW_BARS_MAX = 120


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


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


def _header(info: Mapping[str, Any]) -> str:
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
    meta = "".join(f"<span>{_e(label)} <b>{_e(value)}</b></span>" for label, value in bits if value)
    return (
        f"<header><h1>{_e(info['name'])}</h1>"
        f'<span class="badge {_e(info["status"])}" id="run-status">{_e(info["status"])}</span>'
        f'<div class="meta">{meta}</div></header>'
    )


def _warnings(messages: Sequence[str]) -> str:
    return "".join(f'<div class="warn">{_e(message)}</div>' for message in messages)


def _card(label: str, value: str, sub: str = "", cls: str = "", extra: str = "") -> str:
    return (
        f'<div class="card"><div class="label">{_e(label)}</div>'
        f'<div class="value {cls}">{_e(value)}</div>{extra}'
        f'<div class="sub">{sub}</div></div>'
    )


def _cards(
    info: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    records: Sequence[Mapping[str, Any]],
) -> str:
    results = info["results"]
    progress = info["progress"]
    threshold = info["configuration"]["pass_threshold"]
    passed, scored = int(results.get("passed", 0)), int(results.get("completed_samples", 0))
    low, high = wilson_interval(passed, scored)
    cards = [
        _card(
            "Pass rate",
            percent(results.get("pass_rate", 0)) if scored else NO_RATE,
            f"{_e(pass_rate_basis(passed, scored))}; reward &ge; {_e(repr(float(threshold)))}"
            + (f"<br>95% CI {percent(low)} – {percent(high)}" if scored else ""),
            "good" if scored and passed == scored else ("bad" if scored and not passed else ""),
        )
    ]
    total = max(len(rows), 1)
    stack = "".join(
        f'<i class="{o}" style="width:{progress[o] / total * 100:.2f}%" '
        f'title="{OUTCOME_WORDS[o]}: {progress[o]}"></i>'
        for o in OUTCOMES
        if progress[o]
    )
    legend = "".join(
        f'<span><span class="dot stack-dot {o}" style="background:var(--{_VAR[o]})"></span>'
        f"{progress[o]} {OUTCOME_WORDS[o]}</span>"
        for o in OUTCOMES
    )
    done = f"{progress['done']}" + (f" / {progress['total']}" if progress.get("total") else "")
    cards.append(
        _card(
            "Outcomes",
            done,
            f'<div class="legend">{legend}</div>',
            extra=f'<div class="stack">{stack}</div>',
        )
    )
    tokens = int(results.get("tokens_used", 0))
    counted = [row["tokens"] for row in rows if isinstance(row.get("tokens"), int)]
    cards.append(
        _card(
            "Tokens",
            f"{tokens:,}",
            f"{tokens / len(counted):,.0f} per attempt on average" if counted else "not recorded",
        )
    )
    costs = [float(r["cost"]) for r in records if isinstance(r.get("cost"), (int, float))]
    # In the results table's words (an attempt without a priced model call: unknown, not $0).
    if costs:
        mean = _cost_text(math.fsum(costs) / len(costs))
        priced = f"{costs_text(r.get('cost') for r in records)}; {mean} per priced attempt"
        cards.append(_card("Cost", _cost_text(math.fsum(costs)), priced))
    else:
        cards.append(_card("Cost", "unknown", "no attempt had a priced model call"))
    durations = [float(row["duration_ms"]) for row in rows if "duration_ms" in row]
    sub = (
        f"per attempt: median {format_duration(quantile(durations, 0.5))}, "
        f"p95 {format_duration(quantile(durations, 0.95))}"
        if durations
        else ""
    )
    cards.append(_card("Duration", format_duration(info["timing"].get("duration_ms")), sub))
    points = results.get("pass_at_k") or []
    if points:
        best = points[-1]
        cards.append(
            _card(
                f"pass@{best['k']}",
                percent(best["value"]),
                " · ".join(f"pass@{p['k']} {percent(p['value'])}" for p in points),
            )
        )
    else:
        n = info["configuration"].get("n")
        cards.append(
            _card(
                "pass@k",
                percent(results.get("pass_rate", 0)) if scored else NO_RATE,
                f"pass@1 only: n = {_e(n)}; run with n &ge; 2 for pass@k",
            )
        )
    stats = results.get("reward_stats")
    if stats:
        cards.append(
            _card(
                "Mean reward",
                f"{stats['mean']:.3f}",
                f"std {stats['std']:.3f} · median {stats['median']:.3f} · "
                f"range {stats['min']:.3f} – {stats['max']:.3f}",
            )
        )
    return '<section class="cards" id="cards">' + "".join(cards) + "</section>"


_VAR = {"passed": "pass", "below_threshold": "below", "failed": "fail", "skipped": "skip"}


def _figure(title: str, note: str, svg: str) -> str:
    return f"<figure><figcaption>{_e(title)}<small>{_e(note)}</small></figcaption>{svg}</figure>"


def _plots(info: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
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
    return (
        '<section class="plots" id="plots">'
        + _figure(
            "Reward distribution", f"attempts with a reward; threshold {threshold!r}", reward_svg
        )
        + _figure("pass@k", "chance that at least one of k attempts passes", passk_svg)
        + _figure("Per-row pass count", f"{flaky} flaky row(s); " + per_row_note, per_row)
        + _figure("Duration distribution", "dispatch to result, per attempt", duration_svg)
        + "</section>"
    )


def _cost_text(value: Any) -> str:
    return f"${value:.4f}" if isinstance(value, (int, float)) else "–"


def _table(records: Sequence[Mapping[str, Any]]) -> str:
    error_types = sorted({str(r["err"]) for r in records if r.get("err")})
    explained = any("expl" in r for r in records)
    priced = any("cost" in r for r in records)
    options = "".join(f'<option value="{_e(t)}">{_e(t)}</option>' for t in error_types)
    filters = (
        '<div class="filters">'
        '<label>outcome <select id="f-outcome"><option value="">all</option>'
        + "".join(f'<option value="{o}">{OUTCOME_WORDS[o]}</option>' for o in OUTCOMES[:3])
        + '<option value="not_passed">not passed</option>'
        f'<option value="skipped">{SKIPPED}</option></select></label>'
        f'<label>error type <select id="f-error"><option value="">any</option>{options}'
        "</select></label>"
        '<label>reward &ge; <input type="number" id="f-min" step="any"></label>'
        '<label>&le; <input type="number" id="f-max" step="any"></label>'
        '<input type="search" id="f-search" '
        'placeholder="search input, label, answer, error, rollout id">'
        '<span id="count"></span></div>'
    )
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
    head = "".join(
        f'<th data-sort="{key}"' + (f' class="{css}"' if css else "") + f">{_e(label)}</th>"
        for key, label, css in columns
    )
    body = []
    for r in records:
        reward = f"{r['reward']:.3f}" if isinstance(r.get("reward"), float) else "–"
        cells = {
            "r": f'<td class="num">{r["r"]}</td>',
            "n": f'<td class="num">{r["n"]}</td>',
            "outcome": f'<td><span class="pill o-{_e(r["outcome"])}">'
            f"{_e(OUTCOME_WORDS.get(r['outcome'], r['outcome']))}</span></td>",
            "reward": f'<td class="num">{reward}</td>',
            "q_in": _clip_cell(input_text(r)),
            "lab": _clip_cell(r.get("lab", ""), "clip short"),
            "ans": _clip_cell(r.get("ans", "")),
            "expl": _clip_cell(r.get("expl", "")),
            "tokens": f'<td class="num">{_e(r.get("tokens", "–"))}</td>',
            "cost": f'<td class="num">{_cost_text(r.get("cost"))}</td>',
            "dur": f'<td class="num">{format_duration(r.get("dur"))}</td>',
            "err": f"<td>{_e(r.get('err', ''))}</td>",
            "rid": f'<td class="mono">{_e(str(r.get("rid", ""))[:8])}</td>',
        }
        body.append(
            f'<tr tabindex="0" data-i="{r["i"]}" data-key="{r["r"]}.{r["n"]}" '
            f'data-outcome="{_e(r["outcome"])}" data-status="{_e(r["status"])}">'
            + "".join(cells[key] for key, _, _ in columns)
            + "</tr>"
        )
    return (
        '<section id="attempts"><h2>Every attempt</h2>'
        + filters
        + f'<div class="tablewrap"><table id="rows"><thead><tr>{head}</tr></thead>'
        + f"<tbody>{''.join(body)}</tbody></table></div></section>"
    )


def _clip_cell(text: str, css: str = "clip") -> str:
    """A one-line cell cut to ``CELL_CHARS``; the drawer shows the whole text."""
    return f'<td class="{css}">{_e(one_line(text, CELL_CHARS))}</td>'


def _comparison(comparison: Mapping[str, Any], pairs: Sequence[Mapping[str, Any]]) -> str:
    a, b = comparison["current"], comparison["baseline"]
    change = comparison["pass_rate_change"]
    paired = comparison["paired"]
    cls = (
        "delta-up" if change["difference"] > 0 else "delta-down" if change["difference"] < 0 else ""
    )
    rows = [
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
    side = "".join(f"<tr><th>{_e(k)}</th><td>{_e(x)}</td><td>{_e(y)}</td></tr>" for k, x, y in rows)
    verdict = "significant at 95%" if change["significant"] else "within noise at 95%"

    def listing(title: str, key: str) -> str:
        entries = comparison[key]
        if not entries:
            return f"<h4>{_e(title)} (0)</h4><p class='muted'>None.</p>"
        items = "".join(
            f"<tr><td class='num'>{e['source_row_index']}</td>"
            f"<td class='num'>{e['baseline']['passes']}/{e['baseline']['attempts']}</td>"
            f"<td class='num'>{e['current']['passes']}/{e['current']['attempts']}</td></tr>"
            for e in entries[:500]
        )
        more = f"<p class='muted'>… {len(entries) - 500} more</p>" if len(entries) > 500 else ""
        return (
            f"<h4>{_e(title)} ({len(entries)})</h4><div class='tablewrap'>"
            f"<table class='cmp' id='{key}'><thead><tr><th>row</th><th>baseline passes</th>"
            f"<th>current passes</th></tr></thead><tbody>{items}</tbody></table></div>{more}"
        )

    return (
        '<section id="comparison"><h2>Compared with '
        + _e(b["name"])
        + "</h2>"
        + _warnings(comparison["warnings"])
        + '<div class="cards">'
        + _card(
            "Paired change",
            f"{paired['change'] * 100:+.1f} pp",
            f"{paired['worse']} rows worse, {paired['better']} better of {paired['rows']}: "
            f"p = {p_text(paired['p_value'])} (exact paired test / McNemar; "
            f"{'significant' if paired['p_value'] < ALPHA else 'within noise'} at {ALPHA:g})",
            cls,
        )
        + _card(
            "Pass-rate change",
            f"{change['difference'] * 100:+.1f} pp",
            f"95% CI {change['ci95_low'] * 100:+.1f} to {change['ci95_high'] * 100:+.1f} pp"
            f" ({verdict}; Newcombe, unpaired)",
            cls,
        )
        + _card(
            "Regressed rows",
            str(len(comparison["regressed"])),
            "fewer passing attempts",
            "bad" if comparison["regressed"] else "",
        )
        + _card(
            "Improved rows",
            str(len(comparison["improved"])),
            "more passing attempts",
            "good" if comparison["improved"] else "",
        )
        + _card(
            "Unchanged rows",
            str(comparison["unchanged"]),
            f"{len(comparison['only_in_current'])} only here, "
            f"{len(comparison['only_in_baseline'])} only in the baseline",
        )
        + "</div>"
        + "<div class='tablewrap' style='margin-top:12px'><table class='cmp' id='side-by-side'>"
        + f"<thead><tr><th></th><th>baseline: {_e(b['name'])}</th><th>current: {_e(a['name'])}"
        + f"</th></tr></thead><tbody>{side}</tbody></table></div>"
        + listing("Regressed rows", "regressed")
        + listing("Improved rows", "improved")
        + _row_by_row(pairs, b["name"], a["name"])
        + "</section>"
    )


_CHANGE_WORDS = {
    "regressed": "regressed",
    "improved": "improved",
    "unchanged": "unchanged",
    "only_current": "only in current",
    "only_baseline": "only in baseline",
}


def _answers_cell(attempts: Sequence[Mapping[str, Any]]) -> str:
    """``1/2 passed`` and the first attempt's answer (or error type), on one line."""
    if not attempts:
        return '<td class="muted">not run</td>'
    passes = sum(1 for a in attempts if a.get("outcome") == outcome.PASSED)
    counted = sum(1 for a in attempts if a.get("outcome") != outcome.SKIPPED)
    if not counted:
        return f'<td class="muted">every attempt {_e(SKIPPED)}</td>'
    first = attempts[0]
    said = first.get("ans") or (f"[{first['err']}]" if first.get("err") else "")
    return (
        f'<td class="clip"><b>{passes}/{counted}</b> {_e(PASSED)} '
        f'<span class="muted">·</span> {_e(one_line(str(said), CELL_CHARS))}</td>'
    )


def _row_by_row(pairs: Sequence[Mapping[str, Any]], baseline: str, current: str) -> str:
    """Every dataset row with both runs' answers; a click opens them side by side."""
    body = "".join(
        f'<tr tabindex="0" data-cmp="{p["r"]}" data-change="{_e(p["change"])}">'
        f'<td class="num">{p["r"]}</td>'
        f'<td><span class="pill c-{_e(p["change"])}">{_e(_CHANGE_WORDS[p["change"]])}</span></td>'
        f"{_clip_cell(input_text(p))}{_answers_cell(p['b'])}{_answers_cell(p['a'])}</tr>"
        for p in pairs
    )
    return (
        f"<h4>Row by row ({len(pairs)})</h4>"
        '<div class="filters"><label>show <select id="f-change">'
        '<option value="">every row</option><option value="changed">changed rows</option>'
        "</select></label><span class='muted'>click a row to see both runs' answers side by "
        "side</span></div>"
        "<div class='tablewrap'><table id='row-by-row'><thead><tr><th class='num'>row</th>"
        f"<th>change</th><th>input</th><th>baseline: {_e(baseline)}</th>"
        f"<th>current: {_e(current)}</th></tr></thead><tbody>{body}</tbody></table></div>"
    )


def _inputs_note(inputs: DatasetInputs | None) -> str:
    if inputs is not None and inputs.path is not None:
        return f'<span id="inputs-from">Inputs from <code>{_e(inputs.path)}</code>.</span>'
    note = inputs.note if inputs is not None else "inputs are taken from trajectories"
    return f'<span id="inputs-from">{_e(note[:1].upper() + note[1:])}.</span>'


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
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="pytest-osmosis ' + _e(__version__) + '">',
        f"<title>{_e(info['name'])} · Osmosis eval report</title>",
        f"<style>{CSS}</style></head><body><main>",
        _header(info),
        _warnings(info["warnings"]),
        _cards(info, rows, records),
    ]
    if comparison is not None:
        parts.append(_comparison(comparison, pairs))
    parts += [
        "<h2>Plots</h2>",
        _plots(info, rows),
        _table(records),
        f"<footer>Generated by pytest-osmosis {_e(__version__)} on {generated} from "
        f"<code>{_e(info['path'])}</code>. Links open files of the run directory. "
        + _inputs_note(inputs)
        + "</footer>",
        "</main>",
        '<aside id="detail" hidden aria-label="attempt detail">'
        '<button type="button" id="close" title="close (Esc)">close</button>'
        '<div id="detail-body"></div></aside>',
    ]
    # After the table and the comparison are drawn: they read each record's own input.
    shared = share_inputs(records, pairs)
    data = {
        "rows": records,
        "inputs": shared,
        "words": OUTCOME_WORDS,
        "cmp": {"rows": pairs, "names": [comparison["baseline"]["name"], info["name"]]}
        if comparison is not None
        else None,
    }
    parts += [
        f'<script type="application/json" id="report-data">{_json_script(data)}</script>',
        f"<script>{JS}</script>",
        "</body></html>",
    ]
    return "\n".join(parts)
