"""The dataset package seen from a session: a registered format, deep rows, a replaced file.

Issue 13 §4 (adding a format is one reader and one registry line) and issue 14 (a row
nested too deep, a dataset replaced mid-run: one clear line, never a traceback).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from readme_examples import readme_example
from workspaces import only_run_dir, read_index, write_workspace

import pytest_osmosis.dataset.formats as formats
import pytest_osmosis.dataset.scan as dataset_scan
from pytest_osmosis.core.errors import DatasetError
from pytest_osmosis.dataset import (
    FORMATS,
    RowList,
    Scan,
    SelectedDataset,
    clear_dataset_cache,
    open_dataset,
    resolve_dataset_path,
)
from pytest_osmosis.dataset.select import Selection
from pytest_osmosis.results.journal import read_journal

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    clear_dataset_cache()
    yield
    clear_dataset_cache()


def write(directory: Path, name: str, content: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(content)
    return path


def jsonl(*rows: dict[str, Any]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def open_ds(path: Path) -> SelectedDataset:
    return open_dataset(path, limit=None, rows=None, sample=None, seed=0)


# --------------------------------------------------------------------------- #
# The format registry: a format is one reader and one registry line (issue 13 §4)
# --------------------------------------------------------------------------- #


def _scan_tsv(path: Path, selection: Selection) -> Scan:
    """A toy format: a header line, then tab-separated cells (what a plugin would add)."""

    data, sha256, identity = dataset_scan.read_all(path)
    store = RowList()
    scan = Scan(store, selection.sampling, sha256, identity)
    header, *lines = data.decode("utf-8").splitlines()
    for source, line in enumerate(lines):
        scan.total += 1
        if selection.pick(source):
            raw = dict(zip(header.split("\t"), line.split("\t"), strict=False))
            scan.add(raw, source, (path, source + 2))
            store.values.append(raw)
    return scan


def test_a_registered_format_is_collected_and_run(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FORMATS, "tsv", _scan_tsv)
    write_workspace(pytester.path)
    (pytester.path / "data" / "calc.jsonl").unlink()
    lines = ["user_prompt\tground_truth", "What is 2 + 2?\t4", "What is 3 * 5?\t15"]
    (pytester.path / "data" / "calc.tsv").write_text("\n".join(lines) + "\n")
    bad = pytester.path / "bad.tsv"
    bad.write_text("user_prompt\tground_truth\nWhat is 2 + 2?\n")
    refused = pytester.runpytest("--osmosis-eval", "--osmosis-dataset-file", str(bad))
    refused.stdout.fnmatch_lines([f"*{bad}: row 0 (line 2): ground_truth (or label) is required*"])
    result = pytester.runpytest("--osmosis-eval", "--osmosis-rows", "1", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert [record["status"] for record in read_index(only_run_dir(pytester.path))] == ["success"]
    manifest = json.loads((only_run_dir(pytester.path) / "manifest.json").read_text())
    assert manifest["inputs"]["dataset"]["selected_source_rows"] == "1"


def _tsv_plugin() -> str:
    """The README's dataset format (``Extending``), as printed; importing it leaves a mark
    in $MARK."""
    mark = 'import os\nwith open(os.environ["MARK"], "a") as mark:\n    mark.write("imported\\n")\n'
    return mark + readme_example(1)


def _install_distribution(site: Path, entry_points: str) -> None:
    """What pip install leaves for a distribution (an installed package): its module and
    its dist-info, which importlib.metadata finds on sys.path."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "osmosis_tsv.py").write_text(_tsv_plugin())
    info = site / "osmosis_tsv-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: osmosis-tsv\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_an_installed_distribution_adds_a_format_only_when_the_plugin_is_on(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = pytester.path / "site"
    _install_distribution(site, "[pytest_osmosis.dataset_formats]\ntsv = osmosis_tsv:scan_tsv\n")
    mark = pytester.path / "mark.txt"
    monkeypatch.setenv("MARK", str(mark))
    root = str(Path(__file__).parents[1])  # this checkout's pytest_osmosis, in the subprocess too
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(site), root, os.environ.get("PYTHONPATH", "")])
    )
    write_workspace(pytester.path)
    (pytester.path / "data" / "calc.jsonl").unlink()
    lines = ["user_prompt\tground_truth", "What is 2 + 2?\t4", "What is 3 * 5?\t15"]
    (pytester.path / "data" / "calc.tsv").write_text("\n".join(lines) + "\n")
    off = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only")
    assert off.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert not mark.exists(), "a pytest run without --osmosis-eval imported a format plugin"
    on = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider")
    on.assert_outcomes(passed=2)
    assert mark.read_text() == "imported\n"
    manifest = json.loads((only_run_dir(pytester.path) / "manifest.json").read_text())
    tsv = (pytester.path / "data" / "calc.tsv").read_bytes()
    assert manifest["inputs"]["dataset"]["sha256"] == hashlib.sha256(tsv).hexdigest()


def test_a_format_plugin_that_cannot_load_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_distribution(tmp_path, "[pytest_osmosis.dataset_formats]\ncsv = osmosis_tsv:gone\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MARK", str(tmp_path / "mark.txt"))
    monkeypatch.setattr(formats, "_plugins_loaded", [])
    with pytest.raises(
        DatasetError,
        match=r"^dataset format entry point 'csv' = 'osmosis_tsv:gone' \(osmosis-tsv\): the suffix \.csv already has a reader$",
    ):
        formats.readers()
    (tmp_path / "osmosis_tsv-0.1.dist-info" / "entry_points.txt").write_text(
        "[pytest_osmosis.dataset_formats]\ntsv = osmosis_tsv:gone\n"
    )
    with pytest.raises(
        DatasetError,
        match=r"^dataset format entry point 'tsv' = 'osmosis_tsv:gone' \(osmosis-tsv\): cannot load: AttributeError: .*gone",
    ):
        formats.readers()
    assert "tsv" not in FORMATS


def test_the_registry_decides_lookup_and_the_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FORMATS, "tsv", _scan_tsv)
    write(tmp_path / "data", "d.tsv", "user_prompt\tground_truth\nq\t1\n")
    assert resolve_dataset_path(tmp_path, "d", None) == tmp_path / "data" / "d.tsv"
    with pytest.raises(DatasetError, match=r"expected one of \.jsonl, \.csv, \.parquet, \.tsv$"):
        resolve_dataset_path(tmp_path, "", write(tmp_path, "d.txt", "x"))
    assert open_ds(tmp_path / "data" / "d.tsv").row(0).label == "1"


# --------------------------------------------------------------------------- #
# Deep metadata and a file replaced mid-run: a clear line, never a traceback (issue 14)
# --------------------------------------------------------------------------- #


def _nested(depth: int) -> dict[str, Any]:
    """Metadata whose objects nest `depth` levels (the outermost is level 1)."""
    node: dict[str, Any] = {"do": ""}
    for _ in range(depth - 1):
        node = {"x": node}
    return node


def test_metadata_nested_too_deep_is_a_dataset_error_naming_the_row(tmp_path: Path) -> None:
    ok = write(tmp_path, "ok.jsonl", jsonl({"user_prompt": "u", "metadata": _nested(255)}))
    assert open_ds(ok).row(0).metadata == _nested(255)
    deep = {"user_prompt": "u", "metadata": _nested(900)}
    path = write(tmp_path, "d.jsonl", jsonl({"user_prompt": "u", "ground_truth": "g"}, deep))
    with pytest.raises(DatasetError) as info:
        open_ds(path)
    assert str(info.value) == (
        f"{path}: row 1 (line 2): metadata is nested more than 255 levels deep; flatten it "
        f"(a row this deep cannot be handed to a workflow)"
    )
    csv_path = tmp_path / "d.csv"
    with csv_path.open("w", newline="") as handle:
        csv.writer(handle).writerows([["user_prompt", "metadata"], ["u", json.dumps(_nested(256))]])
    with pytest.raises(DatasetError, match=r"d\.csv: row 0 \(line 2\): metadata is nested more"):
        open_ds(csv_path)


def test_a_deeply_nested_row_is_one_collection_error_not_a_traceback(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    rows = [
        {"user_prompt": "What is 2 + 2?", "ground_truth": "4", "metadata": _nested(900)},
        {"user_prompt": "What is 3 * 5?", "ground_truth": "15", "metadata": _nested(255)},
        {"user_prompt": "What is 3 * 5?", "ground_truth": "15", "metadata": _nested(252)},
    ]
    write_workspace(pytester.path, rows=rows)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    assert "RecursionError" not in out and "Traceback" not in out
    result.stdout.fnmatch_lines(["*calc.jsonl: row 0 (line 1): metadata is nested more than 255*"])
    # The deepest row the rule accepts (255: the deepest the SDK's client sends) runs to a
    # result; past 252 levels its trajectory cannot be written, as the SDK's cannot (measured
    # with osmosis-ai 0.3.8: pydantic's serialization depth), and its line says so.
    result = pytester.runpytest("--osmosis-eval", "--osmosis-rows", "1-2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        # pydantic-core's words: "Maximum serialization depth exceeded", or at the floor
        # (pydantic 2.11) "Circular reference detected (depth exceeded)"
        ["*row 1 run 0 passed (reward 1.0); no trajectory written: *depth*"]
    )
    rows = read_index(only_run_dir(pytester.path))
    assert [row.get("trajectory_filename") for row in rows] == [None, "trajectory.json"], rows


REPLACING_ROLLOUT = """
import asyncio
import os

from pytest_osmosis.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend

replaced = None


class Replacing(AgentWorkflow):
    async def run(self, ctx):
        global replaced
        if replaced is None:
            replaced = asyncio.Event()
        target = (ctx.metadata or {}).get("replace")
        if target:
            fresh = target + ".new"
            with open(fresh, "w") as handle:
                handle.write('{"user_prompt": "other", "ground_truth": "x"}\\n')
            os.replace(fresh, target)
            replaced.set()
        else:
            await replaced.wait()  # rows started before the replacement finish after it
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": "4"}])


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


backend = LocalBackend(workflow=Replacing, grader=Exact)
"""


def test_the_dataset_replaced_mid_run_stops_in_one_line_rows_pending(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    data = pytester.path / "data" / "calc.jsonl"
    rows = [{"user_prompt": f"row {i}", "ground_truth": "4"} for i in range(64)]
    rows[0]["metadata"] = {"replace": str(data)}
    write_workspace(pytester.path, rows=rows, rollout_source=REPLACING_ROLLOUT)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in out and "DatasetChangedError" not in out
    line = f"{data} changed after it was opened (sha256 "
    assert out.count(line) == 1, out
    assert "stopped, the rows not run are left pending" in out
    journal = read_journal(only_run_dir(pytester.path))  # what a resume carries forward
    assert (0, 0) in journal and len(journal) < 64
    assert all(record["status"] == "success" for record in journal.values())


#: Each process of the session under test lists, once pytest is done with it (unconfigure:
#: after every hook of the session), the files it still holds open under data/.
OPEN_AT_THE_END = """
import json
import os
import signal
from pathlib import Path

reported = []


def pytest_runtest_logreport(report):
    if os.environ.get("STOP_BY") == "SIGTERM" and report.when == "call":
        reported.append(report.nodeid)
        if len(reported) == 2:
            os.kill(os.getpid(), signal.SIGTERM)


def pytest_unconfigure(config):
    data = str(Path("data").resolve())
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(data):
            held.append(target)
    role = config.workerinput["workerid"] if hasattr(config, "workerinput") else "main"
    Path(f"open-at-end-{role}.json").write_text(json.dumps(held))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists /proc/self/fd")
@pytest.mark.parametrize(
    ("stop", "args", "status"),
    [
        pytest.param(stop, args, status, id=stop)
        for stop, args, status in [
            ("finished", (), pytest.ExitCode.OK),
            ("-x", ("-x",), pytest.ExitCode.TESTS_FAILED),
            ("SIGTERM", (), pytest.ExitCode.INTERRUPTED),
            ("xdist", ("-n", "2"), pytest.ExitCode.OK),
        ]
    ],
)
def test_the_dataset_file_is_closed_when_the_session_ends(
    pytester: pytest.Pytester,
    model_env: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
    stop: str,
    args: tuple[str, ...],
    status: pytest.ExitCode,
) -> None:
    """The descriptor rows are read through stayed open until garbage collection, and the
    dataset is memoised for the process: a long-lived process (an embedding runner, an
    in-process pytester) held one per dataset after its session had ended."""
    rows = [{"user_prompt": f"What is {i} + 1?", "ground_truth": str(i + 1)} for i in range(6)]
    if stop == "-x":
        rows[2]["ground_truth"] = "wrong"
    write_workspace(pytester.path, rows=rows)
    pytester.makeconftest(OPEN_AT_THE_END)
    monkeypatch.setenv("STOP_BY", stop)
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", *args)
    assert result.ret == status, result.stdout.str()
    written = sorted(pytester.path.glob("open-at-end-*.json"))
    roles = ["gw0", "gw1", "main"] if stop == "xdist" else ["main"]
    assert [p.stem.rsplit("-", 1)[1] for p in written] == roles
    for path in written:
        assert json.loads(path.read_text()) == [], path.name


def _held(path: Path) -> int:
    """How many descriptors of this process are open on ``path``."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            continue
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists /proc/self/fd")
def test_a_closed_dataset_reads_a_row_again_by_opening_the_file_again(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl({"user_prompt": "a", "ground_truth": "1"}))
    dataset = open_ds(path)
    assert _held(path) == 0  # the scan's handle is closed; rows open the file on demand
    first = dataset.row(0)
    assert _held(path) == 1
    dataset.close()
    assert _held(path) == 0
    dataset.close()  # twice is nothing
    assert dataset.row(0) == first
    assert _held(path) == 1
    dataset.close()
    assert _held(path) == 0
