"""``runs.html``: every local run under an output root, with its pass rate over time.

One self-contained page beside the run directories (``<output root>/runs.html``), so
its links to each run's ``report.html`` stay relative and the folder can be zipped or
served as it is. Runs are read with ``summary_only`` (a finished run's ``metrics.json``
already counts its rows), so an index of many large runs stays quick.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pytest_osmosis import __version__
from pytest_osmosis.core.words import NO_RATE, PASS_RATE_BASIS, pass_rate_basis, percent
from pytest_osmosis.report.assets import CSS
from pytest_osmosis.report.stats import wilson_interval
from pytest_osmosis.report.svg import time_chart
from pytest_osmosis.results.run_reader import parse_time
from pytest_osmosis.results.run_views import format_duration, run_list_item

INDEX_FILENAME = "runs.html"
REPORT_FILENAME = "report.html"
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'"


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


def _link(target: Path, index_dir: Path) -> str:
    relative = os.path.relpath(os.path.abspath(target), os.path.abspath(index_dir))
    return quote(Path(relative).as_posix(), safe="/._-~")


def _series_key(item: Mapping[str, Any]) -> str:
    """Runs of the same rollout on the same dataset and as many work items share a line
    (models differ per point); a 4-attempt smoke run and an incomplete run get lines of
    their own, so a full run's trend is not read through them."""
    key = f"{item['rollout'] or '?'} on {item['dataset'] or '?'}"
    total = item.get("rows_total")
    if total:
        key += f", {total} attempt{'' if total == 1 else 's'}"
    return key if item.get("status") == "finished" else f"{key} (incomplete)"


def _chart(items: Sequence[Mapping[str, Any]], index_dir: Path) -> str:
    series: dict[str, list[tuple[float, float, str, str | None]]] = {}
    for item in items:
        when = parse_time(item["started_at"])
        counted = int(item["completed_samples"] or 0)
        if when is None or not counted:
            continue
        report = Path(str(item["path"])) / REPORT_FILENAME
        hover = (
            f"{item['name']} · {when:%Y-%m-%d %H:%M} UTC · {item['model'] or '?'} · "
            f"{percent(item['pass_rate'])} ({pass_rate_basis(int(item['passed']), counted)})"
        )
        href = _link(report, index_dir) if report.is_file() else None
        series.setdefault(_series_key(item), []).append(
            (when.timestamp(), float(item["pass_rate"]), hover, href)
        )
    return time_chart(
        "runs-over-time",
        "Pass rate over time",
        sorted(series.items()),
        y_label="pass rate",
    )


def _row(item: Mapping[str, Any], index_dir: Path) -> str:
    report = Path(str(item["path"])) / REPORT_FILENAME
    name = _e(item["name"])
    if report.is_file():
        name = f'<a href="{_e(_link(report, index_dir))}">{name}</a>'
    counted = int(item["completed_samples"] or 0)
    rate = NO_RATE
    if counted:
        low, high = wilson_interval(int(item["passed"]), counted)
        rate = (
            f"<b>{percent(item['pass_rate'])}</b> "
            f'<span class="muted">{percent(low)} – {percent(high)}</span>'
        )
    total = item["rows_total"]
    when = parse_time(item["started_at"])
    return (
        f'<tr data-run="{_e(item["name"])}"><td>{name}</td>'
        f'<td><span class="badge {_e(item["status"])}">{_e(item["status"])}</span></td>'
        f"<td>{_e(f'{when:%Y-%m-%d %H:%M}' if when else '–')}</td>"
        f"<td>{_e(item['rollout'] or '–')}</td><td>{_e(item['model'] or '–')}</td>"
        f"<td>{_e(item['dataset'] or '–')}</td>"
        f'<td class="num">{item["rows_done"]}/{total if total is not None else "?"}</td>'
        f'<td class="num" title="{_e(pass_rate_basis(int(item["passed"]), counted))}">'
        f"{rate}</td>"
        f'<td class="num">{_e(format_duration(item["duration_ms"]))}</td></tr>'
    )


def render_index(runs: Sequence[Mapping[str, Any]], root: Path, index_dir: Path) -> str:
    """The page for *runs* (from ``list_runs``, newest first); links relative to *index_dir*."""
    items = [run_list_item(run) for run in runs]
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    head = "".join(
        f"<th{' class=num' if numeric else ''}>{_e(label)}</th>"
        for label, numeric in (
            ("run", False),
            ("status", False),
            ("started (UTC)", False),
            ("rollout", False),
            ("model", False),
            ("dataset", False),
            ("done", True),
            ("pass rate (95% CI)", True),
            ("duration", True),
        )
    )
    body = "".join(_row(item, index_dir) for item in items)
    empty = "" if items else "<p class='muted'>No runs yet: `pytest --osmosis-eval` makes one.</p>"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>Osmosis eval runs · {_e(root)}</title>",
            f"<style>{CSS}</style></head><body><main>",
            f"<header><h1>Eval runs</h1><div class='meta'><span>{len(items)} run(s) in "
            f"<code>{_e(root)}</code></span></div></header>",
            "<h2>Pass rate over time</h2>",
            f"<figure id='over-time'><figcaption>Pass rate per run<small>over "
            f"{_e(PASS_RATE_BASIS)}; one line per rollout and dataset; a point opens the "
            f"run's report</small></figcaption>{_chart(items, index_dir)}</figure>",
            "<h2>Every run</h2>",
            empty,
            f"<div class='tablewrap'><table id='runs'><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>",
            f"<footer>Generated by pytest-osmosis {_e(__version__)} on {generated}. "
            "A run's name links to its report.html when one was written "
            "(<code>pytest-osmosis report NAME</code>, or <code>--osmosis-report</code>)."
            "</footer>",
            "</main></body></html>",
        ]
    )
