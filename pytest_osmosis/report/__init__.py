"""Reports of a run directory: one self-contained HTML page, or Markdown for a PR comment.

Public API:

- :func:`write_report_for_run` — what ``pytest --osmosis-report`` calls at session end;
- :func:`write_report` — the ``pytest-osmosis report`` command (HTML or Markdown,
  optionally compared with a baseline run);
- :func:`write_index` — ``runs.html``, every run under an output root
  (``pytest-osmosis report --index``, and refreshed by ``--osmosis-report``);
- :func:`run_markdown`, :func:`compare_runs`, :func:`comparison_markdown`.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import RunDirectoryError
from pytest_osmosis.core.words import ATTEMPTS, ERRORED, outcomes_text, pass_rate_basis, rate_text
from pytest_osmosis.report.compare import compare_runs, comparison_markdown, escape_markdown
from pytest_osmosis.report.data import DatasetInputs
from pytest_osmosis.report.html import render_html
from pytest_osmosis.report.runs_page import INDEX_FILENAME, REPORT_FILENAME, render_index
from pytest_osmosis.results.run_reader import dataset_row, load_run
from pytest_osmosis.results.run_views import run_info
from pytest_osmosis.results.runs import list_runs

__all__ = [
    "INDEX_FILENAME",
    "REPORT_FILENAME",
    "compare_runs",
    "comparison_markdown",
    "default_report_path",
    "render_html",
    "run_markdown",
    "write_index",
    "write_report",
    "write_report_for_run",
]


def default_report_path(
    run_dir: Path, baseline: Mapping[str, Any] | None = None, fmt: str = "html"
) -> Path:
    """``<run_dir>/report.html`` (``report-vs-<baseline>.<ext>`` when comparing).

    Inside the run directory so relative artifact links keep working when the
    directory is moved or zipped; ``osmosis eval upload`` ignores the extra file.
    """
    suffix = "md" if fmt == "markdown" else "html"
    if baseline is not None:
        safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in str(baseline["name"]))
        return run_dir / f"report-vs-{safe}.{suffix}"
    return run_dir / f"report.{suffix}"


def _writable(directory: Path) -> bool:
    """Write bits, not ``os.access``: root may write anywhere, but a run directory someone
    made read-only (an archived or shared run) should stay untouched."""
    try:
        mode = directory.stat().st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) and os.access(
        directory, os.W_OK
    )


def _write_text(path: Path, text: str) -> None:
    """Atomic replace, so a browser tab reloading the report never sees half a file."""
    from pytest_osmosis.core.words import safe_text

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(safe_text(text))  # a lone surrogate in a row cannot fail it
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        raise RunDirectoryError(f"{path}: cannot write the report ({exc.strerror or exc})") from exc


def run_markdown(run: Mapping[str, Any], *, max_rows: int = 50) -> str:
    """A run's headline numbers and failed rows as Markdown."""
    info = run_info(run)
    results, ctx = info["results"], info["context"]
    progress = info["progress"]
    passed, counted = int(results.get("passed", 0)), int(results.get("completed_samples", 0))
    lines = [
        f"### Osmosis eval: {escape_markdown(info['name'])} ({escape_markdown(info['status'])})",
        "",
        f"**Pass rate {rate_text(passed, counted)}** "
        f"({pass_rate_basis(passed, counted)}), "
        f"pass_threshold {float(info['configuration']['pass_threshold'])!r}",
        "",
        "| | |",
        "|---|---|",
        f"| model | {escape_markdown(ctx.get('model'))} |",
        f"| rollout | {escape_markdown(ctx.get('rollout'))} |",
        f"| dataset | {escape_markdown(ctx.get('dataset'))} |",
        f"| {ATTEMPTS} | {progress['done']}"
        + (f" / {progress['total']}" if progress.get("total") else "")
        + f": {outcomes_text(progress)} |",
        f"| tokens | {results.get('tokens_used', 0)} |",
    ]
    points = results.get("pass_at_k") or []
    if points:
        lines.append(
            "| pass@k | "
            + ", ".join(f"pass@{p['k']} {p['value'] * 100:.1f}%" for p in points)
            + " |"
        )
    for warning in info["warnings"]:
        lines += ["", f"> **Warning:** {escape_markdown(warning)}"]
    failed = info["failed_rows"]
    if failed:
        lines += [
            "",
            f"#### {ERRORED.capitalize()} {ATTEMPTS} ({len(failed)})",
            "",
            "| row | attempt | error type | message |",
            "|---:|---:|---|---|",
        ]
        for row in failed[:max_rows]:
            error_type = escape_markdown(row.get("error_type"))
            message = escape_markdown(str(row.get("error_message", ""))[:200])
            lines.append(f"| {dataset_row(row)} | {row['run_index']} | {error_type} | {message} |")
        if len(failed) > max_rows:
            lines.append(f"| … | {len(failed) - max_rows} more | | |")
    return "\n".join(lines) + "\n"


def write_report(
    run_dir: Path,
    output: Path | None = None,
    *,
    baseline_dir: Path | None = None,
    fmt: str = "html",
    dataset_hints: tuple[Path, ...] = (),
) -> tuple[Path, dict[str, Any] | None]:
    """Write the report of *run_dir* (compared with *baseline_dir* when given).

    *dataset_hints* are files that may be the run's dataset (used only when their
    sha256 is the manifest's; see ``results/runs.py::find_dataset``). Returns the written
    path and the comparison (``None`` without a baseline).
    """
    if fmt not in ("html", "markdown"):
        raise ValueError(f"unknown report format {fmt!r}")
    run = load_run(run_dir)
    baseline = load_run(baseline_dir) if baseline_dir is not None else None
    comparison = compare_runs(run, baseline) if baseline is not None else None
    if output is None and not _writable(Path(run_dir)):
        raise RunDirectoryError(
            f"{run_dir}: the run directory is read-only; write the report elsewhere"
        )
    target = output if output is not None else default_report_path(Path(run_dir), baseline, fmt)
    if fmt == "markdown":
        text = comparison_markdown(comparison) if comparison is not None else run_markdown(run)
    else:
        inputs = DatasetInputs(run, dataset_hints)
        text = render_html(run, target.parent, comparison, inputs, baseline)
    _write_text(target, redacted(text, run))
    return target, comparison


def redacted(text: str, *runs: Mapping[str, Any]) -> str:
    """*text* without secrets: the report embeds artifacts, messages and errors verbatim.

    Besides what this process knows (a session's ``[secrets]``, provider keys), the
    values the environment holds for the *runs*' ``[secrets]`` names are redacted, so a
    later ``pytest-osmosis report`` hides them too.
    """
    from pytest_osmosis.results.redact import MIN_REDACTED_LENGTH, scrub

    names = {
        name
        for run in runs
        for name in _dict_of(_dict_of(run.get("manifest")).get("inputs")).get("secret_names") or ()
        if isinstance(name, str)
    }
    values = [os.environ[name] for name in sorted(names) if os.environ.get(name)]
    return scrub(text, values, extra_min_length=MIN_REDACTED_LENGTH)


def write_index(root: Path, output: Path | None = None) -> Path:
    """Write ``<root>/runs.html`` (or *output*): every run under *root*, newest first,
    with the pass rate over time; returns its path."""
    runs = list_runs(Path(root))
    target = output if output is not None else Path(root) / INDEX_FILENAME
    _write_text(target, redacted(render_index(runs, Path(root), target.parent), *runs))
    return target


def _dict_of(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def write_report_for_run(
    run_dir: Path, output: Path | None = None, *, dataset: Path | None = None
) -> Path:
    """Write ``<run_dir>/report.html`` (or *output*) and return its path.

    Called by the plugin at the end of a session with ``--osmosis-report``, with the
    session's *dataset* file (its rows' inputs; used only if its sha256 is the run's).
    """
    path, _ = write_report(
        Path(run_dir), output, dataset_hints=(dataset,) if dataset is not None else ()
    )
    return path
