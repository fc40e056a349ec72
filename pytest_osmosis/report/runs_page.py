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
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pytest_osmosis import __version__
from pytest_osmosis.core.words import NO_RATE, PASS_RATE_BASIS, pass_rate_basis, percent
from pytest_osmosis.report.assets import CSS
from pytest_osmosis.report.stats import wilson_interval
from pytest_osmosis.report.svg import time_chart
from pytest_osmosis.report.templating import Markup, render
from pytest_osmosis.results.run_reader import parse_time
from pytest_osmosis.results.run_views import format_duration, run_list_item

INDEX_FILENAME = "runs.html"
REPORT_FILENAME = "report.html"
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'"


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


def _row(item: Mapping[str, Any], index_dir: Path) -> dict[str, Any]:
    """One table row's values (``templates/runs.html`` escapes them)."""
    report = Path(str(item["path"])) / REPORT_FILENAME
    counted = int(item["completed_samples"] or 0)
    rate = low = high = None
    if counted:
        low, high = wilson_interval(int(item["passed"]), counted)
        rate = percent(item["pass_rate"])
    total = item["rows_total"]
    when = parse_time(item["started_at"])
    return {
        "name": item["name"],
        "href": _link(report, index_dir) if report.is_file() else None,
        "status": item["status"],
        "started": f"{when:%Y-%m-%d %H:%M}" if when else "–",
        "rollout": item["rollout"] or "–",
        "model": item["model"] or "–",
        "dataset": item["dataset"] or "–",
        "done": f"{item['rows_done']}/{total if total is not None else '?'}",
        "basis": pass_rate_basis(int(item["passed"]), counted),
        "rate": rate,
        "low": percent(low) if rate else None,
        "high": percent(high) if rate else None,
        "duration": format_duration(item["duration_ms"]),
    }


#: The table's columns: (label, numeric).
COLUMNS = (
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


def render_index(runs: Sequence[Mapping[str, Any]], root: Path, index_dir: Path) -> str:
    """The page for *runs* (from ``list_runs``, newest first); links relative to *index_dir*."""
    items = [run_list_item(run) for run in runs]
    return render(
        "runs.html",
        csp=Markup(CSP),  # our constant, printed as it is (as before)
        css=Markup(CSS),
        root=root,
        rows=[_row(item, index_dir) for item in items],
        basis=PASS_RATE_BASIS,
        chart=Markup(_chart(items, index_dir)),
        columns=COLUMNS,
        no_rate=NO_RATE,
        version=__version__,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )
