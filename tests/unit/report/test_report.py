"""The HTML/Markdown report and its statistics, without a browser (see test_report_browser)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from reference_paths import REFERENCE_RUN, REFERENCE_WORKSPACE

from pytest_osmosis.report import (
    INDEX_FILENAME,
    compare_runs,
    comparison_markdown,
    render_html,
    write_index,
    write_report,
    write_report_for_run,
)
from pytest_osmosis.report import data as report_data
from pytest_osmosis.report.compare import escape_markdown
from pytest_osmosis.report.stats import (
    newcombe_difference,
    pass_at_k_curve,
    wilson_interval,
)
from pytest_osmosis.report.svg import time_chart
from pytest_osmosis.results.metrics import aggregate_metrics
from pytest_osmosis.results.run_reader import load_run

REFERENCE = REFERENCE_RUN
needs_reference = pytest.mark.skipif(not REFERENCE.is_dir(), reason="reference run not available")


def copy_run(source: Path, destination: Path) -> Path:
    shutil.copytree(source, destination)
    for path in [destination, *destination.rglob("*")]:
        mode = os.lstat(path).st_mode
        extra = stat.S_IWUSR | stat.S_IRUSR | (stat.S_IXUSR if path.is_dir() else 0)
        os.chmod(path, mode | extra)
    return destination


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    if not REFERENCE.is_dir():
        pytest.skip("reference run not available")
    return copy_run(REFERENCE, tmp_path / "evals" / "reference-run")


def index_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]


class Page(HTMLParser):
    """Every tag with its attributes, the text of scripts, and the embedded data."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._script: dict[str, str | None] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._script = dict(attrs)
            self.scripts.append((self._script, ""))

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._script = None

    def find(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [
            a
            for t, a in self.tags
            if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    @property
    def data(self) -> dict[str, Any]:
        [text] = [text for attrs, text in self.scripts if attrs.get("id") == "report-data"]
        loaded: dict[str, Any] = json.loads(text)
        return loaded


# ----------------------------------------------------------------------------- statistics


def test_wilson_interval_matches_published_values() -> None:
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", 81/263.
    low, high = wilson_interval(81, 263)
    assert (round(low, 4), round(high, 4)) == (0.2553, 0.3662)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_newcombe_difference_matches_the_paper() -> None:
    # Newcombe (1998), "Interval estimation for the difference between independent
    # proportions: comparison of eleven methods", Table II, method 10.
    published = {
        (56, 70, 48, 80): (0.0524, 0.3339),
        (9, 10, 3, 10): (0.1705, 0.8090),
        (5, 56, 0, 29): (-0.0381, 0.1926),
        (0, 10, 0, 20): (-0.1611, 0.2775),
        (10, 10, 0, 20): (0.6791, 1.0),
        (10, 10, 0, 10): (0.6075, 1.0),
    }
    for counts, interval in published.items():
        difference, low, high = newcombe_difference(*counts)
        assert difference == pytest.approx(counts[0] / counts[1] - counts[2] / counts[3])
        assert (round(low, 4), round(high, 4)) == interval, counts
    # Swapping the runs mirrors the interval.
    d, low, high = newcombe_difference(48, 80, 56, 70)
    assert (d, low, high) == pytest.approx((-0.2, -0.3339, -0.0524), abs=1e-4)


def test_pass_at_k_curve_agrees_with_metrics_json() -> None:
    rows = []
    pattern = {0: [1, 1, 1, 1], 1: [0, 1, 0, 0], 2: [0, 0, 0, 0], 3: [1, 0, 1, 0]}
    for row_index, rewards in pattern.items():
        for run_index, reward in enumerate(rewards):
            rows.append(
                {
                    "row_index": row_index,
                    "run_index": run_index,
                    "status": "success",
                    "reward": float(reward),
                    "outcome": "passed" if reward else "below_threshold",
                }
            )
    rows.append({"row_index": 4, "run_index": 0, "status": "failed", "outcome": "failed"})
    curve = dict(pass_at_k_curve(rows))
    expected = {p["k"]: p["value"] for p in aggregate_metrics(rows, 1.0)["pass_at_k"]}
    assert set(expected) == {1, 2, 4}
    for k, value in expected.items():
        assert curve[k] == pytest.approx(value)
    assert set(curve) == {1, 2, 3, 4}  # every k, not only powers of two


# ----------------------------------------------------------------------------- the page


@needs_reference
def test_report_is_self_contained(run_dir: Path) -> None:
    path = write_report_for_run(run_dir)
    assert path == run_dir / "report.html"
    text = path.read_text()
    page = Page(text)
    [csp] = page.find("meta", http_equiv="Content-Security-Policy")
    assert "default-src 'none'" in str(csp["content"])
    assert not page.find("link")  # no external stylesheet
    assert all("src" not in attrs for attrs, _ in page.scripts)  # no external script
    for _tag, attrs in page.tags:
        for name in ("src", "href", "action", "data", "poster"):
            value = attrs.get(name) or ""
            assert not re.match(r"^\s*(https?:|//|ftp:)", value), (name, value)
    assert not re.search(r"url\(\s*['\"]?(https?:|//)", text)
    assert "@import" not in text


@needs_reference
def test_report_has_the_plots_cards_and_every_attempt(run_dir: Path) -> None:
    page = Page(write_report_for_run(run_dir).read_text())
    plots = [a["data-plot"] for t, a in page.tags if t == "svg" and a.get("class") == "plot"]
    assert plots == ["reward", "pass-at-k", "per-row", "duration"]
    index = index_of(run_dir)
    rows = page.find("tr", tabindex="0")
    assert [r["data-key"] for r in rows] == [f"{r['row_index']}.{r['run_index']}" for r in index]
    assert [r["data-status"] for r in rows] == [r["status"] for r in index]
    expected = [
        "skipped"
        if r["status"] == "skipped"
        else "failed"
        if r["status"] == "failed"
        else "passed"
        if r["reward"] >= 1.0
        else "below_threshold"
        for r in index
    ]
    assert [r["data-outcome"] for r in rows] == expected
    data = page.data["rows"]
    assert len(data) == len(index)
    for record, row in zip(data, index, strict=True):
        trajectory_file = run_dir / "rollout_trials" / row["rollout_id"] / "trajectory.json"
        if "trajectory_filename" in row:
            document = json.loads(trajectory_file.read_text())
            assert [s["text"] for s in record["traj"]["steps"]] == [
                s["message"] for s in document["steps"]
            ]
            assert record["traj_href"] == f"rollout_trials/{row['rollout_id']}/trajectory.json"
        else:
            assert "traj" not in record
    first = data[0]
    assert first["traj"]["steps"][-1]["metrics"] == {"prompt_tokens": 12, "completion_tokens": 3}
    assert first["traj"]["label"] == "4"
    artifacts = {a["name"]: a for a in first["arts"]}
    assert artifacts["answer.txt"]["text"] == "4"
    assert artifacts["logs/trace.json"]["href"] == "artifacts/row_0_run_0/logs/trace.json"


@needs_reference
def test_header_cards_show_the_metrics(run_dir: Path) -> None:
    text = write_report_for_run(run_dir).read_text()
    cards = text[text.index('<section class="cards" id="cards">') : text.index("</section>")]
    labels = re.findall(
        r'<div class="label">([^<]+)</div><div class="value[^"]*">([^<]+)</div>', cards
    )
    assert labels == [
        ("Pass rate", "40.0%"),
        ("Outcomes", "12 / 12"),
        ("Tokens", "150"),
        ("Cost", "unknown"),
        ("Duration", "69.4 s"),
        ("pass@2", "60.0%"),
        ("Mean reward", "0.667"),
    ]
    assert "4 passed / 10 attempts not skipped; reward &ge; 1.0" in cards
    assert "4 passed" in cards and "2 below threshold" in cards and "2 skipped" in cards


@needs_reference
def test_links_are_relative_to_where_the_report_is_written(run_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "deep" / "r.html"
    path, _ = write_report(run_dir, target)
    data = Page(path.read_text()).data["rows"]
    hrefs = [a["href"] for r in data for a in r.get("arts", [])]
    hrefs += [r["traj_href"] for r in data if "traj_href" in r]
    assert hrefs
    for href in hrefs:
        assert not href.startswith("/")
        assert (target.parent / unquote(href)).resolve().is_file(), href


@needs_reference
def test_hostile_text_is_escaped(run_dir: Path) -> None:
    hostile = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
    (run_dir / "artifacts" / "row_0_run_0" / "answer.txt").write_text(hostile)
    trajectory = run_dir / "rollout_trials" / "74db4440a7af4c31a77fffc74fd7ce4b" / "trajectory.json"
    document = json.loads(trajectory.read_text())
    document["steps"][1]["message"] = hostile
    document["extra"]["osmosis"]["label"] = hostile
    trajectory.write_text(json.dumps(document))
    index = index_of(run_dir)
    index[0]["error_type"] = "<b>bold</b>"
    (run_dir / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    text = write_report_for_run(run_dir).read_text()
    assert "alert(" in text  # the text is there...
    assert "<script>alert" not in text and "<img src=x" not in text and "<b>bold" not in text
    page = Page(text)
    assert len(page.scripts) == 2  # ...and it did not open a script of its own
    data = page.data["rows"]
    assert data[0]["arts"][0]["text"] == hostile
    assert data[0]["traj"]["steps"][1]["text"] == hostile
    assert data[0]["err"] == "<b>bold</b>"


@needs_reference
def test_comparison_escapes_what_both_runs_hold(run_dir: Path, tmp_path: Path) -> None:
    """The comparison's tables print each run's model, rows' inputs and first answers."""
    hostile = '</td><script>alert(1)</script> & "q" café'
    other = copy_run(REFERENCE, tmp_path / "evals" / "other")
    trajectory = other / "rollout_trials" / "74db4440a7af4c31a77fffc74fd7ce4b" / "trajectory.json"
    document = json.loads(trajectory.read_text())
    document["steps"][1]["message"] = hostile  # row 0's input
    document["steps"][2]["message"] = hostile  # its first attempt's answer
    trajectory.write_text(json.dumps(document))
    metrics = json.loads((other / "metrics.json").read_text())
    metrics["eval_run"]["model_name"] = hostile
    (other / "metrics.json").write_text(json.dumps(metrics))
    current, baseline = load_run(other), load_run(run_dir)
    html = render_html(current, other, compare_runs(current, baseline), baseline=baseline)
    section = html[html.index('<section id="comparison">') : html.index("<h2>Plots</h2>")]
    assert "<script>alert" not in section and "</td><script>" not in section
    escaped = "&lt;/td&gt;&lt;script&gt;alert(1)&lt;/script&gt; &amp; &#34;q&#34; café"
    page = Page(html)
    assert page.find("table", id="side-by-side") and page.find("table", id="row-by-row")
    assert f"<td>{escaped}</td></tr>" in section  # the current run's model, side by side
    assert f'<td class="clip">{escaped}</td>' in section  # row 0's input, row by row
    assert f'<span class="muted">·</span> {escaped}</td></tr>' in section  # row 0's answer


@needs_reference
def test_nothing_outside_the_run_directory_is_read(run_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-VALUE")
    (run_dir / "artifacts" / "row_0_run_0" / "leak.txt").symlink_to(secret)
    trial = run_dir / "rollout_trials" / "b68d66ef584440b999c94af3988c7e19"
    (trial / "trajectory.json").unlink()
    (trial / "trajectory.json").symlink_to(secret)
    (run_dir / "trajectories" / "row_0_run_1.json").unlink()
    (run_dir / "trajectories" / "row_0_run_1.json").symlink_to(secret)
    text = write_report_for_run(run_dir).read_text()
    assert "TOPSECRET" not in text
    data = Page(text).data["rows"]
    assert "leak.txt" not in {a["name"] for a in data[0]["arts"]}
    assert "traj" not in data[1]


@needs_reference
def test_size_budget_embeds_failures_first(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_data, "EMBED_BUDGET", 1500)
    data = Page(write_report_for_run(run_dir).read_text()).data["rows"]
    embedded = [(r["r"], r["n"]) for r in data if "traj" in r]
    omitted = [r for r in data if r.get("omitted")]
    assert embedded and omitted
    assert embedded[0] == (4, 0)  # the first failed attempt with a trajectory comes first
    assert all("text" not in a for r in omitted for a in r["arts"])
    assert all("traj_href" in r for r in omitted)  # still reachable by link


@needs_reference
def test_report_of_an_incomplete_run(run_dir: Path) -> None:
    for name in ("metrics.json", "index.jsonl", "summary.jsonl", "progress.json", "manifest.json"):
        (run_dir / name).unlink()
    lines = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "events.jsonl").write_text("".join(lines[:3]))
    page = Page(write_report_for_run(run_dir).read_text())
    assert [r["data-key"] for r in page.find("tr", tabindex="0")] == ["0.0", "0.1", "1.0"]
    [badge] = page.find("span", id="run-status")
    assert badge["class"] == "badge incomplete"
    data = page.data["rows"]
    assert data[0]["traj"]["steps"][0]["text"] == "You are a calculator."


@needs_reference
def test_compare_finds_regressed_and_improved_rows(run_dir: Path, tmp_path: Path) -> None:
    after = copy_run(REFERENCE, tmp_path / "evals" / "after")
    index = index_of(after)
    index[1]["reward"] = 1.0  # row 0 improves from 1/2 to 2/2
    index[5]["reward"] = 0.0  # row 2 regresses from 1/2 to 0/2
    (after / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    metrics = json.loads((after / "metrics.json").read_text())
    metrics["summary"] = aggregate_metrics(index, 1.0)
    (after / "metrics.json").write_text(json.dumps(metrics))
    comparison = compare_runs(load_run(after), load_run(run_dir))
    assert [
        (e["source_row_index"], e["baseline"], e["current"]) for e in comparison["regressed"]
    ] == [(2, {"passes": 1, "attempts": 2}, {"passes": 0, "attempts": 2})]
    assert [e["source_row_index"] for e in comparison["improved"]] == [0]
    assert comparison["unchanged"] == 3  # rows 1, 4, 5 (row 3 was always skipped)
    change = comparison["pass_rate_change"]
    assert change["difference"] == 0.0 and not change["significant"]
    assert comparison["warnings"] == []
    markdown = comparison_markdown(comparison)
    assert "| 2 | 1/2 | 0/2 |" in markdown and "| 0 | 1/2 | 2/2 |" in markdown
    html = render_html(load_run(after), after, comparison)
    page = Page(html)
    assert page.find("table", id="regressed") and page.find("table", id="improved")
    assert page.find("table", id="side-by-side")


@needs_reference
def test_compare_warns_about_different_datasets_and_thresholds(
    run_dir: Path, tmp_path: Path
) -> None:
    other = copy_run(REFERENCE, tmp_path / "evals" / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["inputs"]["dataset"]["sha256"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    metrics = json.loads((other / "metrics.json").read_text())
    metrics["summary"]["pass_threshold"] = 0.5
    (other / "metrics.json").write_text(json.dumps(metrics))
    warnings = " ".join(compare_runs(load_run(other), load_run(run_dir))["warnings"])
    assert "different dataset files" in warnings
    assert "pass_threshold differs (1.0 vs 0.5)" in warnings


def test_markdown_cells_cannot_break_the_table() -> None:
    assert escape_markdown("a|b\nc <x> `y`") == "a\\|b c \\<x\\> \\`y\\`"
    assert escape_markdown(None) == "–"


def _rewrite(run_dir: Path, index: list[dict[str, Any]], *, n: int, rows: int) -> None:
    """Make *run_dir* a consistent run of *index* (n attempts of *rows* rows)."""
    (run_dir / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    (run_dir / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["inputs"]["n"] = n
    manifest["inputs"]["dataset"]["selected_source_rows"] = f"0-{rows - 1}"
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    progress = {"total_runs": rows * n, "sampled_rows": rows, "total_dataset_rows": rows}
    (run_dir / "progress.json").write_text(json.dumps(progress))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["summary"] = aggregate_metrics(index, 1.0)
    (run_dir / "metrics.json").write_text(json.dumps(metrics))


def _svg(html: str, name: str) -> str:
    start = html.index(f'data-plot="{name}"')
    return html[start : html.index("</svg>", start)]


@needs_reference
def test_single_attempt_run(run_dir: Path) -> None:
    index = [r for r in index_of(run_dir) if r["run_index"] == 0]
    _rewrite(run_dir, index, n=1, rows=6)
    html = write_report_for_run(run_dir).read_text()
    assert _svg(html, "pass-at-k").count("<circle") == 1
    assert "run with n ≥ 2 to see pass@k grow" in _svg(html, "pass-at-k")
    assert _svg(html, "per-row").count("<rect") == 6
    assert "pass@1 only: n = 1" in html


@needs_reference
def test_run_with_no_results_yet(run_dir: Path) -> None:
    for name in ("metrics.json", "index.jsonl", "summary.jsonl", "progress.json"):
        (run_dir / name).unlink()
    (run_dir / "events.jsonl").write_text("")
    html = write_report_for_run(run_dir).read_text()
    for name in ("reward", "pass-at-k", "per-row", "duration"):
        assert 'class="empty"' in _svg(html, name)
    assert "<tr tabindex" not in html
    assert Page(html).data["rows"] == []


@needs_reference
def test_many_rows_switch_the_per_row_plot_to_a_histogram(run_dir: Path) -> None:
    index = []
    for row in range(300):
        for attempt in range(3):
            reward = 1.0 if (row % 3 == 0 or (row % 3 == 1 and attempt == 0)) else 0.0
            index.append(
                {
                    "row_index": row,
                    "run_index": attempt,
                    "rollout_id": f"{row:016x}{attempt:016x}",
                    "status": "success",
                    "reward": reward,
                    "duration_ms": 10.0 + row,
                }
            )
    _rewrite(run_dir, index, n=3, rows=300)
    html = write_report_for_run(run_dir).read_text()
    per_row = _svg(html, "per-row")
    titles = re.findall(r"<title>([^<]*)</title>", per_row)
    assert titles[1:] == [
        "100 rows with 0 of 3 attempts passing",
        "100 rows with 1 of 3 attempts passing",
        "0 rows with 2 of 3 attempts passing",
        "100 rows with 3 of 3 attempts passing",
    ]
    assert html.count("<tr tabindex") == 900


@needs_reference
def test_binary_and_large_artifacts_are_linked_not_inlined(run_dir: Path) -> None:
    artifacts = run_dir / "artifacts" / "row_1_run_0"
    (artifacts / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    (artifacts / "big.log").write_text("x" * 100_000)
    data = Page(write_report_for_run(run_dir).read_text()).data["rows"]
    by_name = {a["name"]: a for a in data[2]["arts"]}
    assert by_name["answer.txt"]["text"] == (artifacts / "answer.txt").read_text()
    for name, size in (("plot.png", 16), ("big.log", 100_000)):
        assert "text" not in by_name[name]
        assert by_name[name]["size"] == size
        assert by_name[name]["href"] == f"artifacts/row_1_run_0/{name}"


# ----------------------------------------------------------------------------- inputs, index


@pytest.fixture
def workspace_run(tmp_path: Path) -> Path:
    """The reference run inside a copy of the workspace that made it."""
    if not REFERENCE.is_dir() or not REFERENCE_WORKSPACE.is_dir():
        pytest.skip("reference run and workspace not available")
    workspace = copy_run(REFERENCE_WORKSPACE, tmp_path / "ws")
    return copy_run(REFERENCE, workspace / ".osmosis" / "evals" / "reference-run")


def with_inputs(page: Page) -> list[dict[str, Any]]:
    """The page's records, each with its input (``in``) put back from the shared list."""
    data = page.data
    return [
        {**r, "in": [data["inputs"][i] for i in r["ii"]]} if "ii" in r else r for r in data["rows"]
    ]


def test_the_dataset_is_used_only_when_its_sha256_is_the_manifests(
    workspace_run: Path, tmp_path: Path
) -> None:
    data = workspace_run.parents[2] / "data" / "ref.jsonl"
    page = Page(write_report_for_run(workspace_run).read_text())
    rows = with_inputs(page)
    assert [r["in_src"] for r in rows] == ["dataset"] * 12
    # One copy of each message: the system prompt all rows share, each row's question.
    assert len(page.data["inputs"]) == 7
    assert [r["ii"] for r in page.data["rows"][::2]] == [
        [0, 1],
        [0, 2],
        [0, 3],
        [0, 4],
        [0, 5],
        [0, 6],
    ]
    assert [r["ii"] for r in page.data["rows"][::2]] == [r["ii"] for r in page.data["rows"][1::2]]
    assert rows[-1]["in"] == [
        ["system", "You are a calculator."],
        ["user", "make the workflow go boom"],
    ]
    # An edited file (one changed question) is not the run's dataset: trajectories speak.
    original = data.read_bytes()
    data.write_bytes(original.replace(b"make the workflow go boom", b"a different question"))
    page = Page(write_report_for_run(workspace_run).read_text())
    assert [r["in_src"] for r in page.data["rows"]] == ["trajectory"] * 10 + [""] * 2
    assert "a different question" not in json.dumps(page.data)
    # The right bytes elsewhere, given as a hint (`report --dataset`), are used.
    elsewhere = tmp_path / "kept" / "ref.jsonl"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(original)
    path, _ = write_report(workspace_run, dataset_hints=(elsewhere,))
    rows = with_inputs(Page(path.read_text()))
    assert rows[-1]["in"][-1] == ["user", "make the workflow go boom"]
    assert f"Inputs from <code>{elsewhere}</code>" in path.read_text()


def test_no_cost_or_explanation_column_when_no_row_has_one(run_dir: Path) -> None:
    text = write_report_for_run(run_dir).read_text()
    page = Page(text)
    heads = [a.get("data-sort") for a in page.find("th")]
    assert {"q_in", "lab", "ans"} <= set(heads)
    assert "cost" not in heads and "expl" not in heads
    assert not any("cost" in r or "expl" in r for r in page.data["rows"])
    # The cost card says what the results table says: no attempt was priced.
    assert '<div class="label">Cost</div><div class="value ">unknown</div>' in text


def test_cost_from_the_journal_row_wins_over_the_trajectory(run_dir: Path) -> None:
    index = index_of(run_dir)
    index[0]["cost_usd"] = 0.25
    index[1]["cost_usd"] = "free"  # not a number: ignored, the trajectory has none either
    (run_dir / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in index))
    trajectory = run_dir / "rollout_trials" / index[0]["rollout_id"] / "trajectory.json"
    document = json.loads(trajectory.read_text())
    document["final_metrics"]["total_cost_usd"] = 9.0
    trajectory.write_text(json.dumps(document))
    rows = Page(write_report_for_run(run_dir).read_text()).data["rows"]
    assert [r.get("cost") for r in rows[:2]] == [0.25, None]


def test_runs_index_escapes_what_runs_hold_and_works_offline(run_dir: Path) -> None:
    root = run_dir.parent
    other = copy_run(REFERENCE, root / "other")
    metrics = json.loads((other / "metrics.json").read_text())
    metrics["eval_run"]["model_name"] = "<script>alert(1)</script>"
    (other / "metrics.json").write_text(json.dumps(metrics))
    (root / ".locks").mkdir()
    path = write_index(root)
    assert path == root / INDEX_FILENAME
    text = path.read_text()
    assert "<script>alert(1)" not in text and "&lt;script&gt;alert(1)" in text
    page = Page(text)
    [csp] = page.find("meta", http_equiv="Content-Security-Policy")
    assert "default-src 'none'" in str(csp["content"]) and "script-src" not in str(csp["content"])
    assert not page.find("script")
    assert sorted(str(a["data-run"]) for a in page.find("tr") if a.get("data-run")) == [
        "other",
        "reference-run",
    ]
    # No run has a report yet: names are plain text, chart points are not links.
    assert not page.find("a")
    # An empty root says how to make a run.
    empty = write_index(root.parent / "nothing-here", root.parent / "empty.html").read_text()
    assert "No runs yet" in empty and "no run with attempts not skipped yet" in empty


def test_time_chart_places_one_run_in_the_middle_and_labels_by_span() -> None:
    one = time_chart("t", "T", [("a", [(1_000_000.0, 0.5, "one", None)])], y_label="rate")
    assert 'cx="380.0"' in one and "<title>one</title>" in one and "<a " not in one
    day = 86400.0
    two = time_chart(
        "t",
        "T",
        [("a", [(0.0, 0.0, "x", "r/report.html"), (10 * day, 1.0, "y", None)])],
        y_label="rate",
    )
    assert "1970-01-01" in two and "1970-01-11" in two and '<a href="r/report.html">' in two
