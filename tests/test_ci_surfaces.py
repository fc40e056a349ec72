"""CI surfaces (issue 17, points 4-6): GitHub Actions, JUnit, pytest-html, pytest-rerunfailures.

Each runs a real session on the loopback model, in one process and under ``-n 2``, and
reads what CI reads: the step summary file, the workflow commands on stdout, the JUnit
file element by element, the HTML report's data.
"""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from test_gate import ROWS
from workspaces import (
    CALC_ROLLOUT,
    calc_rows,
    only_run_dir,
    read_index,
    run_session,
    write_workspace,
)

from pytest_osmosis.plugin.github import annotation_lines, command, gate_section

# test_gate's five rows: 3 pass; row 3 is below the threshold; row 4 is an error.
BASE = ("--osmosis-eval", "-p", "no:cacheprovider")
MODES = pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["single", "xdist"])
RAISED = "agent_error: workflow raised RuntimeError: workflow exploded on purpose (row 4, run 0)"
LOW = "reward 0.00 < pass_threshold 1.00 (row 3, run 0)"


@pytest.fixture
def workspace(pytester: pytest.Pytester, model_env: Any) -> pytest.Pytester:
    write_workspace(pytester.path, rows=ROWS)
    return pytester


def run(pytester: pytest.Pytester, xdist: tuple[str, ...], *args: str) -> pytest.RunResult:
    return run_session(pytester, *BASE, *xdist, *args)


# ------------------------------------------------------------------ GitHub Actions


def runner_commands(lines: list[str]) -> list[str]:
    """The workflow commands a GitHub runner obeys in this output, in order: lines that
    start with ``::`` (after white space), none while ``::stop-commands::TOKEN`` holds
    until the line ``::TOKEN::``. Commands must be on again when the output ends."""
    obeyed: list[str] = []
    token = None
    for line in lines:
        text = line.strip()
        if token is not None:
            if text == f"::{token}::":
                token = None
            continue
        if text.startswith("::"):
            obeyed.append(text)
            if text.startswith("::stop-commands::"):
                token = text[len("::stop-commands::") :]
    assert token is None, "workflow commands are still off when the output ends"
    return obeyed


def workflow_commands(lines: list[str]) -> list[str]:
    """The commands obeyed, but for ours that turn commands off around the session's text."""
    return [c for c in runner_commands(lines) if not c.startswith("::stop-commands::")]


@pytest.fixture
def github(workspace: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    summary = workspace.path / "step-summary.md"
    summary.write_text("earlier step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(workspace.path))
    return summary


@MODES
def test_github_step_summary_and_annotations(
    workspace: pytest.Pytester, github: Path, xdist: tuple[str, ...]
) -> None:
    result = run(workspace, xdist, "--osmosis-min-pass-rate", "0.5", "--osmosis-name", "ci")
    assert result.ret == 0  # the gate passes
    text = github.read_text(encoding="utf-8")
    assert text.startswith("earlier step\n")  # appended, never overwritten
    lines = text.splitlines()
    assert lines[1:12] == [
        "## pytest-osmosis: ci",
        "",
        "rollout `calc`, model `openai/test-model`, dataset `calc`, status **finished**",
        "",
        "| passed | below threshold | errored | skipped | total |",
        "| ---: | ---: | ---: | ---: | ---: |",
        "| 3 | 1 | 1 | 0 | 5 |",
        "",
        "**Pass rate** 60.0% (3 passed / 5 attempts not skipped), 95% Wilson interval "
        "23.1% to 88.2%, pass_threshold 1.0",
        "",
        "### Worst attempts (2 of 2)",
    ]
    # Worst first: the error, then the lowest reward, each with its headline.
    assert lines[13:17] == [
        "| row | run | outcome | reward | headline |",
        "| ---: | ---: | --- | ---: | --- |",
        f"| 4 | 0 | errored |  | {RAISED} |",
        f"| 3 | 0 | below threshold | 0.00 | {LOW} |",
    ]
    assert lines[18:] == [
        "### Gate: PASSED",
        "",
        "- ci: pass rate 60.0% (3 passed / 5 attempts not skipped) >= 50.0%",
        "",
    ]
    # One workflow command per attempt that did not pass, at its dataset line.
    assert workflow_commands(result.stdout.lines) == [
        f"::error file=data/calc.jsonl,line=5,title=ci%3A row 4 run 0::{RAISED}",
        f"::error file=data/calc.jsonl,line=4,title=ci%3A row 3 run 0::{LOW}",
    ]


def test_github_annotations_stop_at_ten_per_config_then_count(
    pytester: pytest.Pytester, model_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two configs, 12 rows below the threshold each: one dataset written as CSV (line 1 is
    # the header), the other as JSON lines.
    rows = "".join(f"What is {n} + 1?,{n}\n" for n in range(12))
    write_workspace(pytester.path, rows=[])
    (pytester.path / "data" / "calc.jsonl").unlink()
    (pytester.path / "data" / "calc.csv").write_text("user_prompt,ground_truth\n" + rows)
    other = calc_rows([(f"What is {n} + 2?", str(n)) for n in range(12)])
    write_workspace(pytester.path, name="other", dataset="other", rows=other)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)  # annotations only
    monkeypatch.setenv("GITHUB_WORKSPACE", str(pytester.path))
    result = pytester.runpytest(*BASE)
    result.assert_outcomes(failed=24)
    commands = workflow_commands(result.stdout.lines)
    assert len(commands) == 22
    by_file = {
        name: [c for c in commands if c.startswith(f"::error file=data/{name},line=")]
        for name in ("calc.csv", "other.jsonl")
    }
    assert [len(found) for found in by_file.values()] == [10, 10]
    assert by_file["calc.csv"][0].endswith(
        "row 0 run 0::reward 0.00 < pass_threshold 1.00 (row 0, run 0)"
    )
    counts = [c for c in commands if c.startswith("::warning::")]
    assert len(counts) == 2
    assert all(c.endswith(": 2 more attempts did not pass (see the step summary)") for c in counts)


# Row 4's workflow prints workflow commands (its own output, shown in its own report) and
# raises what a hostile or broken rollout could: workflow commands at the start of lines,
# terminal controls, a lone surrogate (a surrogateescape decode of bytes that are not
# UTF-8), which every surface of ours shows escaped.
#
# It prints while the process running it is between items, with pytest's capture
# suspended (under xdist a worker's own stdout then goes nowhere): row 4 runs ahead, row 0
# waits until it has started, and row 4 prints only when the conftest's logreport hook for
# row 0 (run with capture suspended) lets it, and that hook waits until it has printed.
RAISE = '            raise RuntimeError("workflow exploded on purpose")\n'
HOSTILE_ROLLOUT = CALC_ROLLOUT.replace(
    RAISE,
    "            import between_items\n"
    "            between_items.STARTED.set()\n"
    "            assert await asyncio.to_thread(between_items.PRINT.wait, 300)\n"
    "            print('::add-mask::leaked\\n::error::printed by the rollout\\n'\n"
    "                  '::stop-commands::theirs')\n"
    "            between_items.PRINTED.set()\n"
    "            raise RuntimeError(\n"
    "                'exploded\\n::error file=x,line=1::raised\\n::warning::raised\\x1b]0;t\\x07'\n"
    "                '\\x00 ' + b'\\xff'.decode('utf-8', 'surrogateescape')\n"
    "            )\n",
).replace(
    '        do = (ctx.metadata or {}).get("do", "")\n        if do == "workflow_raise":\n',
    '        do = (ctx.metadata or {}).get("do", "")\n'
    '        if ctx.prompt[-1]["content"] == "What is 2 + 2?":  # row 0\n'
    "            import between_items\n"
    "            assert await asyncio.to_thread(between_items.STARTED.wait, 300)\n"
    '        if do == "workflow_raise":\n',
)
BETWEEN_ITEMS = """
import threading

STARTED = threading.Event()  # row 4 runs (ahead of its item)
PRINT = threading.Event()  # row 4 may print now
PRINTED = threading.Event()
"""
BETWEEN_ITEMS_CONFTEST = """
import between_items


def pytest_runtest_logreport(report):
    # Reports are logged with pytest's capture suspended (between items, for a worker).
    ours = between_items.STARTED.is_set()  # the process running the rows, not xdist's controller
    if ours and report.when == "setup" and report.nodeid.endswith("::row_0_run_0"):
        between_items.PRINT.set()
        assert between_items.PRINTED.wait(300), "row 4 did not print"
"""
SURROGATE_ROLLOUT = CALC_ROLLOUT.replace(
    RAISE,
    "            raise RuntimeError(b'bytes \\xff'.decode('utf-8', 'surrogateescape'))\n",
)
assert RAISE in CALC_ROLLOUT and "surrogateescape" in HOSTILE_ROLLOUT
assert "# row 0" in HOSTILE_ROLLOUT and "PRINT.wait" in HOSTILE_ROLLOUT


@MODES
def test_a_lone_surrogate_changes_no_exit_status(
    workspace: pytest.Pytester, github: Path, xdist: tuple[str, ...]
) -> None:
    write_workspace(workspace.path, rows=ROWS, rollout_source=SURROGATE_ROLLOUT)
    junit = workspace.path / "junit.xml"
    result = run(
        workspace,
        xdist,
        "--osmosis-min-pass-rate",
        "0.5",
        "--osmosis-name",
        "ci",
        f"--junitxml={junit}",
        "--osmosis-report",
    )
    assert result.ret == 0, result.stdout.str()  # the gate's verdict: 3 of 5 pass
    headline = "agent_error: workflow raised RuntimeError: bytes \\udcff (row 4, run 0)"
    assert f"| 4 | 0 | errored |  | {headline} |" in github.read_text(encoding="utf-8")
    assert workflow_commands(result.stdout.lines)[0].endswith(f"::{headline}")
    assert "bytes \\udcff" in junit.read_text(encoding="utf-8")
    assert "cannot write" not in result.stdout.str()


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["single", "xdist"])
def test_nothing_a_rollout_prints_is_obeyed_by_the_runner(
    workspace: pytest.Pytester, github: Path, xdist: tuple[str, ...]
) -> None:
    write_workspace(workspace.path, rows=ROWS, rollout_source=HOSTILE_ROLLOUT)
    (workspace.path / "between_items.py").write_text(BETWEEN_ITEMS)
    (workspace.path / "conftest.py").write_text(BETWEEN_ITEMS_CONFTEST)
    junit = workspace.path / "junit.xml"
    result = workspace.runpytest_subprocess(
        *BASE,
        *xdist,
        # Every row in flight at once; under -n 2 one shard of all five rows, on one worker.
        "--osmosis-concurrency",
        "10",
        "--osmosis-min-pass-rate",
        "0.5",
        "--osmosis-name",
        "ci",
        f"--junitxml={junit}",
        "-o",
        "junit_logging=system-out",
        "-rA",
    )
    assert result.ret == 0, result.stdout.str()
    out = result.stdout.str()
    # Shown, in row 4's own report (then not obeyed), though printed between items.
    result.stdout.fnmatch_lines(
        [
            "*_ ERROR at setup of row_4_run_0 _*",
            "*- Captured stdout setup -*",  # the row ran, and printed, as its item set up
            "::add-mask::leaked",
            "::error::printed by the rollout",
            "::stop-commands::theirs",
        ]
    )
    obeyed = runner_commands(result.stdout.lines)
    assert [c.split("::")[1] for c in obeyed] == [
        "stop-commands",
        "error file=data/calc.jsonl,line=5,title=ci%3A row 4 run 0",
        "error file=data/calc.jsonl,line=4,title=ci%3A row 3 run 0",
        "stop-commands",
    ]
    assert obeyed[1].endswith(
        "::agent_error: workflow raised RuntimeError: exploded ::error file=x,line=1::raised"
        " ::warning::raised\\u001b]0;t\\u0007\\u0000 \\udcff (row 4, run 0)"
    )
    for control in ("\x1b", "\x07", "\x00"):
        assert control not in out and control not in result.stderr.str()
    summary = github.read_text(encoding="utf-8")
    assert "raised\\u001b]0;t\\u0007\\u0000 \\udcff (row 4, run 0) |" in summary
    cases = {case.get("name"): case for case in ET.parse(junit).iter("testcase")}  # well-formed
    assert "\\u001b" in junit.read_text(encoding="utf-8")
    printed = "::add-mask::leaked\n::error::printed by the rollout\n::stop-commands::theirs\n"
    shown = {name: printed in (case.findtext("system-out") or "") for name, case in cases.items()}
    assert [name for name, has in shown.items() if has] == ["row_4_run_0"]  # its own only


@pytest.mark.parametrize(
    ("env", "args"),
    [
        ({"GITHUB_ACTIONS": "true"}, ("--osmosis-github", "off")),
        ({"GITHUB_ACTIONS": "true"}, ("-o", "osmosis_github=off")),
        ({}, ()),  # not on GitHub Actions
    ],
    ids=["option-off", "ini-off", "not-github"],
)
def test_github_off(
    workspace: pytest.Pytester,
    github: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    args: tuple[str, ...],
) -> None:
    if not env:
        monkeypatch.delenv("GITHUB_ACTIONS")
    result = workspace.runpytest(*BASE, *args)
    result.assert_outcomes(passed=3, failed=1, errors=1)
    assert github.read_text(encoding="utf-8") == "earlier step\n"
    assert not [line for line in result.stdout.lines if line.startswith("::")]


def test_a_bad_github_value_is_one_line(workspace: pytest.Pytester, github: Path) -> None:
    result = workspace.runpytest(*BASE, "--osmosis-github", "yes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --osmosis-github: must be auto or off, got 'yes'"])


def test_gate_section_shows_regressions_when_the_verdict_has_them() -> None:
    verdict = {
        "passed": False,
        "reasons": ["nightly: pass rate 40.0% < 50.0%"],
        "regressions": ["row 7 run 0: passed -> below threshold", {"row": 9, "was": "passed"}],
    }
    assert gate_section(verdict).splitlines() == [
        "### Gate: FAILED",
        "",
        "- nightly: pass rate 40.0% < 50.0%",
        "",
        "### Regressions against the baseline (2)",
        "",
        "- row 7 run 0: passed -> below threshold",
        "- row 9, was passed",
        "",
    ]
    assert "Regressions" not in gate_section({"passed": True, "reasons": []})


def test_workflow_commands_are_escaped(tmp_path: Path) -> None:
    assert command("error", {"file": "a,b:c", "line": "3"}, "50% done\nnext\r") == (
        "::error file=a%2Cb%3Ac,line=3::50%25 done%0Anext%0D"
    )
    assert annotation_lines([], tmp_path) == []


# -------------------------------------------------------------------------- JUnit


@MODES
def test_junit_tells_errors_from_failures_element_by_element(
    workspace: pytest.Pytester, xdist: tuple[str, ...]
) -> None:
    result = run(workspace, xdist, "--osmosis-name", "j", "--junitxml=out.xml")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    check_junit(workspace.path / "out.xml", workspace.path, resumed="")
    # The finished run, run again, runs nothing and writes its recorded rows, not nothing.
    again = run(workspace, xdist, "--osmosis-name", "j", "--junitxml=again.xml")
    assert again.ret == pytest.ExitCode.TESTS_FAILED
    check_junit(workspace.path / "again.xml", workspace.path, resumed=" [resumed]")


def check_junit(path: Path, root: Path, *, resumed: str) -> None:
    run_dir = only_run_dir(root)
    index = {(r["row_index"], r["run_index"]): r for r in read_index(run_dir)}
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "5",
        "failures": "1",
        "errors": "1",
        "skipped": "0",
    }
    cases = {str(case.get("name")): case for case in suite.iter("testcase")}
    assert sorted(cases) == [f"row_{n}_run_0" for n in range(5)]
    for row in range(5):
        case = cases[f"row_{row}_run_0"]
        record = index[(row, 0)]
        # The row's own duration, not the wait (nor the session's start-up on row 0).
        assert float(str(case.get("time"))) == pytest.approx(record["duration_ms"] / 1000, abs=5e-4)
        children = [child.tag for child in case]
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert properties["osmosis_model"] == "openai/test-model"
        assert properties["osmosis_dataset_row"] == str(row)
        assert properties["osmosis_attempt"] == "0"
        assert properties["osmosis_pass_threshold"] == "1.0"
        assert float(str(properties["osmosis_duration_s"])) == pytest.approx(
            record["duration_ms"] / 1000, abs=5e-4
        )
        trajectory = run_dir / "rollout_trials" / record["rollout_id"] / "trajectory.json"
        if row < 4:
            assert properties["osmosis_trajectory"] == str(trajectory)
            assert trajectory.is_file()
            assert properties["osmosis_reward"] == ("0.0" if row == 3 else "1.0")
            assert "osmosis_error_type" not in properties
        else:
            assert properties["osmosis_error_type"] == "agent_error"
            assert "osmosis_reward" not in properties
        if row < 3:
            assert children == ["properties"]
            continue
        (verdict,) = [child for child in case if child.tag != "properties"]
        if row == 3:
            assert verdict.tag == "failure"
            assert verdict.get("message") == LOW.replace(")", f"){resumed}")
        else:
            assert verdict.tag == "error"
            message = (
                RAISED
                if not resumed
                else ("agent_error: recorded by an earlier session (row 4, run 0) [resumed]")
            )
            # pytest's JUnit writer: the setup failure's whole text, cut at 500 characters.
            assert str(verdict.get("message")).startswith(f'failed on setup with "{message}')
            assert str(verdict.text).startswith(message)


#: Records, in the controller, what each row's reports carry when they are logged and what
#: pytest still holds of them at the end (it keeps every report to the end of the session).
HOLDING = """
import json

seen = {"logged": [], "properties": {}, "held": []}
worker = []  # this session is an xdist worker of the session under test (not of ours)


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        worker.append(True)


def pytest_runtest_logreport(report):
    if worker:
        return
    name = report.nodeid.rsplit("::", 1)[-1]
    if getattr(report, "osmosis", None) is not None:
        seen["logged"].append([name, report.when, report.osmosis["status"]])
    if report.when == "teardown":
        seen["properties"][name] = [p[0] for p in report.user_properties]


def pytest_terminal_summary(terminalreporter):
    if worker:
        return
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "osmosis", None) is not None:
                seen["held"].append(report.nodeid)
    with open("holding.json", "w") as out:
        json.dump(seen, out)
"""

PROPERTIES = [
    "osmosis_pass_threshold",
    "osmosis_tokens",
    "osmosis_duration_s",
    "osmosis_model",
    "osmosis_dataset_row",
    "osmosis_attempt",
    "osmosis_trajectory",
]


@MODES
def test_reports_carry_the_result_until_logged_and_properties_only_for_junit(
    workspace: pytest.Pytester, xdist: tuple[str, ...]
) -> None:
    # pytest holds every report to the end: a 100,000-row session kept each row's result
    # and its JUnit properties there for nobody (issue 30 item 5).
    workspace.makeconftest(HOLDING)
    run(workspace, xdist, "--osmosis-name", "h").assert_outcomes(passed=3, failed=1, errors=1)
    seen = json.loads((workspace.path / "holding.json").read_text())
    assert sorted(seen["logged"]) == [
        ["row_0_run_0", "call", "success"],
        ["row_1_run_0", "call", "success"],
        ["row_2_run_0", "call", "success"],
        ["row_3_run_0", "call", "success"],
        ["row_4_run_0", "setup", "failed"],
    ]
    assert seen["held"] == []
    assert seen["properties"] == {f"row_{n}_run_0": [] for n in range(5)}

    run(workspace, xdist, "--osmosis-name", "j", "--junitxml=out.xml").assert_outcomes(
        passed=3, failed=1, errors=1
    )
    seen = json.loads((workspace.path / "holding.json").read_text())
    assert seen["held"] == []
    reward = ["osmosis_reward"]
    assert seen["properties"] == {
        **{f"row_{n}_run_0": reward + PROPERTIES for n in range(4)},
        # The error: its type, no reward, no tokens and no trajectory.
        "row_4_run_0": [PROPERTIES[0], "osmosis_error_type", *PROPERTIES[2:6]],
    }


def test_a_low_reward_is_an_assertion_error_and_an_error_is_not(workspace: pytest.Pytester) -> None:
    # What Allure (and others) read to say "failed" rather than "broken".
    workspace.makeconftest(
        """
        import json

        def pytest_exception_interact(node, call, report):
            with open("raised.jsonl", "a") as out:
                out.write(json.dumps([node.name, call.when, isinstance(call.excinfo.value, AssertionError)]) + "\\n")
        """
    )
    workspace.runpytest(*BASE).assert_outcomes(passed=3, failed=1, errors=1)
    seen = [json.loads(line) for line in (workspace.path / "raised.jsonl").read_text().splitlines()]
    assert sorted(seen) == [["row_3_run_0", "call", True], ["row_4_run_0", "setup", False]]


# ---------------------------------------------------------------------- pytest-html


@MODES
def test_pytest_html_has_a_reward_column(
    workspace: pytest.Pytester, xdist: tuple[str, ...]
) -> None:
    result = run(workspace, xdist, "--html=report.html", "--self-contained-html")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    page = (workspace.path / "report.html").read_text(encoding="utf-8")
    blob = re.search(r'data-jsonblob="([^"]*)"', page)
    assert blob is not None
    data = json.loads(html.unescape(blob.group(1)))
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", page)
    assert headers == ["Result", "Test", "Reward", "Duration", "Links"]
    shown: dict[str, list[tuple[str, str]]] = {}
    for nodeid, runs in data["tests"].items():
        for row in runs:
            cells = row["resultsTableRow"]
            assert cells[2].startswith('<td class="col-reward">'), cells
            texts = [re.sub(r"<[^>]+>", "", cell) for cell in cells]
            shown.setdefault(nodeid.rsplit("::", 1)[-1], []).append((texts[0], texts[2]))
    assert shown == {
        "row_0_run_0": [("Passed", "1.00")],
        "row_1_run_0": [("Passed", "1.00")],
        "row_2_run_0": [("Passed", "1.00")],
        "row_3_run_0": [("Failed", "0.00")],
        "row_4_run_0": [("Error", "agent_error")],
    }


# ------------------------------------------------------------ pytest-rerunfailures

#: Each execution appends its row's ``do`` to executions.txt beside the rollout; the first
#: execution of ``hang`` outlives its budget, ``bug`` always raises, the rest ask the model.
RERUN_ROLLOUT = """
import asyncio
from pathlib import Path

import httpx

from pytest_osmosis.rollout import (
    AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend, get_rollout_context,
)

LOG = Path(__file__).with_name("executions.txt")


class Flaky(AgentWorkflow):
    async def run(self, ctx):
        do = (ctx.metadata or {}).get("do", "")
        with LOG.open("a") as out:
            out.write(do + "\\n")
        if do == "bug":
            raise RuntimeError("a bug in the rollout")
        if do == "hang" and LOG.read_text().splitlines().count("hang") == 1:
            await asyncio.sleep(3600)  # only the budget ends it
        rollout = get_rollout_context()
        async with httpx.AsyncClient(timeout=120) as client:
            response = await client.post(
                rollout.chat_completions_url + "/chat/completions",
                headers={"Authorization": f"Bearer {rollout.api_key}"},
                json={"model": "anything", "messages": ctx.prompt},
            )
            response.raise_for_status()
        answer = response.json()["choices"][0]["message"]["content"]
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": answer}])


class Exact(Grader):
    async def grade(self, ctx):
        final = list(ctx.sample.messages)[-1]["content"].strip()
        ctx.set_reward(1.0 if final == ctx.label else 0.0)


backend = LocalBackend(workflow=Flaky, grader=Exact)
"""

RERUN_ROWS = calc_rows(
    [
        ("What is 2 + 2?", "4", "ok"),
        ("What is 3 + 3?", "6", "hang"),  # workflow_timeout once: infrastructure
        ("What is 9 + 9? FLAKY5XX", "18", "provider"),  # the provider's 503 once
        ("What is 3 * 5?", "16", "low"),  # below the threshold: never again
        ("What is 1 + 1?", "2", "bug"),  # agent_error: never again
    ]
)


@MODES
def test_reruns_run_again_only_infrastructure_errors_and_record_once(
    pytester: pytest.Pytester, model_env: Any, xdist: tuple[str, ...]
) -> None:
    write_workspace(
        pytester.path,
        rows=RERUN_ROWS,
        rollout_source=RERUN_ROLLOUT,
        evaluation={"agent_workflow_timeout_s": 5, "grader_timeout_s": 30},
    )
    # Three 503s: the provider's client retries a 5xx twice itself before the row sees it.
    model_env.fail_on = {"FLAKY5XX": (503, 3)}
    result = run(pytester, xdist, "--osmosis-name", "r", "--reruns", "2", "-rR")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    assert result.parseoutcomes()["rerun"] == 2
    executions = (pytester.path / "rollouts" / "calc" / "executions.txt").read_text().split()
    assert sorted(executions) == sorted(
        ["ok", "hang", "hang", "provider", "provider", "low", "bug"]
    )
    run_dir = only_run_dir(pytester.path)
    # One record per (row, attempt): the re-run's, not the error it replaced.
    events = (run_dir / "events.jsonl").read_text().splitlines()
    assert len(events) == 5
    by_row = {r["row_index"]: r for r in read_index(run_dir)}
    assert [by_row[n]["status"] for n in range(5)] == [
        "success",
        "success",
        "success",
        "success",
        "failed",
    ]
    assert by_row[4]["error_type"] == "agent_error"
    result.stdout.fnmatch_lines(["*RERUN configs/eval/calc.toml::row_1_run_0*"])
    result.stdout.fnmatch_lines(["*RERUN configs/eval/calc.toml::row_2_run_0*"])


@MODES
def test_rerun_reports_let_go_of_the_result_once_logged(
    pytester: pytest.Pytester, model_env: Any, xdist: tuple[str, ...]
) -> None:
    """A report pytest-rerunfailures logs for an execution it runs again kept that
    execution's result to the end of the session (pytest holds every report), when every
    other report let go of its own at logfinish."""
    write_workspace(pytester.path, rows=RERUN_ROWS[:3:2], rollout_source=RERUN_ROLLOUT)
    model_env.fail_on = {"FLAKY5XX": (503, 3)}  # row 1 (the provider's): one 503 at the row
    pytester.makeconftest(HOLDING)
    result = run(pytester, xdist, "--osmosis-name", "rr", "--reruns", "1")
    result.assert_outcomes(passed=2)
    assert result.parseoutcomes()["rerun"] == 1
    seen = json.loads((pytester.path / "holding.json").read_text())
    assert sorted(seen["logged"]) == [  # each execution's report carried it while logged
        ["row_0_run_0", "call", "success"],
        ["row_1_run_0", "call", "success"],
        ["row_1_run_0", "setup", "failed"],
    ]
    assert seen["held"] == []


def test_reruns_keep_the_users_rerun_except(pytester: pytest.Pytester, model_env: Any) -> None:
    write_workspace(pytester.path, rows=ROWS)
    pytester.makeini("[pytest]\nrerun_except =\n    SomethingOfMine\n")
    pytester.makeconftest(
        """
        def pytest_sessionfinish(session):
            with open("rerun_except.txt", "w") as out:
                out.write("\\n".join(session.config.option.rerun_except))
        """
    )
    pytester.runpytest(*BASE, "--reruns", "1").assert_outcomes(passed=3, failed=1, errors=1)
    assert (pytester.path / "rerun_except.txt").read_text().splitlines() == [
        "SomethingOfMine",
        "^RewardBelowThreshold: ",
        "^RowErrored: ",
    ]


def test_without_the_optional_plugins_nothing_changes(workspace: pytest.Pytester) -> None:
    result = workspace.runpytest(*BASE, "-p", "no:html", "-p", "no:rerunfailures")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    without = workspace.parseconfigure(*BASE, "-p", "no:html", "-p", "no:rerunfailures")
    assert without.pluginmanager.get_plugin("osmosis-html") is None
    assert not hasattr(without.option, "rerun_except")  # its option is not there to extend
    with_them = workspace.parseconfigure(*BASE, "--reruns", "1")
    assert with_them.pluginmanager.get_plugin("osmosis-html") is not None
    assert with_them.option.rerun_except == ["^RewardBelowThreshold: ", "^RowErrored: "]
