"""One home per rule (issue 13, points 1 and 5): a row's outcome, the gate's rules, the
node-id format, the run-name rule, the formatting helpers, and the SDK interpreter lookup.

The end-to-end agreement of the terminal, ``metrics.json``, ``info`` and the report is
tested in test_words.py; these tests pin each rule to its one owner.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from workspaces import MIXED_ROWS, write_workspace

from pytest_osmosis import gate
from pytest_osmosis.core import outcome
from pytest_osmosis.core.errors import ConfigError, RunDirectoryError
from pytest_osmosis.core.words import one_line, percent
from pytest_osmosis.plugin import OPTIONS
from pytest_osmosis.plugin.collect import item_name, pytest_verdict, split_item_nodeid
from pytest_osmosis.results.manifest import validate_run_name as directory_run_name
from pytest_osmosis.results.metrics import aggregate_metrics
from pytest_osmosis.workspace.config import validate_run_name as config_run_name

ROOT = Path(__file__).resolve().parents[1]


def _row(status: str, reward: float | None = None, **more: Any) -> dict[str, Any]:
    base = {"row_index": 0, "run_index": 0, "source_row_index": 0, "rollout_id": "r"}
    return {**base, "status": status, "reward": reward, "pass_threshold": 0.5, **more}


@pytest.mark.parametrize(
    ("row", "expected", "pytest_outcome"),
    [
        (_row("success", 0.5), outcome.PASSED, "passed"),
        (_row("success", 0.4), outcome.BELOW_THRESHOLD, "failed"),
        (_row("failed", error_type="agent_error"), outcome.FAILED, "error"),
        (_row("skipped"), outcome.SKIPPED, "skipped"),
    ],
)
def test_every_reader_of_an_outcome_asks_classify(
    row: dict[str, Any], expected: str, pytest_outcome: str
) -> None:
    assert outcome.classify(row, 0.5) == expected
    assert pytest_verdict(row, 0, 0)[0] == pytest_outcome  # collect: the pytest mapping
    summary = aggregate_metrics([row], 0.5)
    assert outcome.summary_counts(summary)[expected] == 1  # metrics.json, gate, summary
    assert outcome.resumed(row, 0.5)["passed"] == (expected == outcome.PASSED)
    assert outcome.summary_fails_session(summary) == (pytest_outcome in ("failed", "error"))


@pytest.mark.parametrize("below_threshold_as", ["passed", "xfailed"])
def test_the_pytest_mapping_is_one_place_and_a_run_run_again_exits_as_it_did(
    pytester: pytest.Pytester, model_env: Any, monkeypatch: pytest.MonkeyPatch,
    below_threshold_as: str,
) -> None:
    """Changing how pytest reports an outcome in ``outcome.PYTEST_OUTCOMES`` alone changes
    the items, the exit status of a run run again and what pytest-rerunfailures re-runs."""
    from pytest_osmosis.plugin.rerun import never_rerun

    monkeypatch.setitem(outcome.PYTEST_OUTCOMES, outcome.BELOW_THRESHOLD, below_threshold_as)
    write_workspace(pytester.path, rows=MIXED_ROWS[:2])  # a pass and a reward below threshold
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "again")
    first = pytester.runpytest(*args)
    first.assert_outcomes(passed=2 if below_threshold_as == "passed" else 1,
                          xfailed=1 if below_threshold_as == "xfailed" else 0)
    assert first.ret == pytest.ExitCode.OK
    again = pytester.runpytest(*args)
    again.stdout.fnmatch_lines(["*already finished*"])
    assert again.ret == pytest.ExitCode.OK, again.stdout.str()
    assert never_rerun() == ("^RewardBelowThreshold: ", "^RowErrored: ")


def test_a_row_result_is_built_one_way() -> None:
    built = outcome.RowResult(
        row_index=1,
        run_index=0,
        source_row_index=4,
        rollout_id="r",
        status="success",
        pass_threshold=0.5,
        reward=0.9,
        extra={"has_trajectory": True},
    ).as_dict()
    assert built["passed"] is True and built["has_trajectory"] is True
    assert "extra" not in built
    crashed = outcome.failure(
        row_index=1,
        run_index=0,
        source_row_index=4,
        pass_threshold=0.0,
        error_type="worker_crashed",
        message="gone",
        config="c.toml",
    )
    assert crashed["status"] == "failed" and crashed["passed"] is False
    assert crashed["config"] == "c.toml" and len(crashed["rollout_id"]) == 32
    assert outcome.classify(crashed, 0.0) == outcome.FAILED  # even at a zero threshold


def test_the_gate_declares_its_options_and_a_new_rule_is_one_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declared = {opt.flag: opt for opt in OPTIONS}
    for rule in gate.RULES:
        assert declared[rule.flag].dest == rule.dest and not declared[rule.flag].override

    def at_most_below(limit: float, _: Any, n: gate.Counts) -> tuple[bool, str]:
        below = n.scored - n.passed - n.errored
        return below <= limit, f"{below} below threshold"

    extra = gate.GateOption(
        "max_below", "--max-below", "h", "N", lambda f, t: int(t), at_most_below
    )
    monkeypatch.setattr(gate, "RULES", (*gate.RULES, extra))
    options = gate.gate_options({"max_below": "0"}.get)
    assert options.active
    metrics = {"summary": aggregate_metrics([_row("success", 0.1)], 0.5)}
    verdict = gate.decide(options, [("run", metrics)])
    assert not verdict.passed and verdict.reasons == ["run: 1 below threshold"]
    with pytest.raises(gate.GateOptionError, match="^--osmosis-min-pass-rate: must be"):
        gate.gate_options({"min_pass_rate": "2"}.get)


def test_the_node_id_format_is_built_and_parsed_in_one_place() -> None:
    nodeid = f"configs/eval/a.toml::{item_name(17, 3)}"
    assert nodeid.endswith("::row_17_run_3")
    assert split_item_nodeid(nodeid) == ("configs/eval/a.toml", 17, 3)
    assert split_item_nodeid("tests/test_x.py::test_row_1_run_2") is None


@pytest.mark.parametrize("name", ["", "x" * 97, "a/b", "..", ".locks", "-x", "a b", "ok-1.v2"])
def test_the_run_name_rule_is_one(name: str) -> None:
    """The TOML's check and the run directory's agree, each in its own error type."""
    problems = []
    for check, error in ((config_run_name, ConfigError), (directory_run_name, RunDirectoryError)):
        try:
            check(name)
        except error as exc:
            problems.append(str(exc).split(" must ")[-1].split(", got")[0])
        else:
            problems.append(None)
    assert problems[0] == problems[1]
    assert (problems[0] is None) == (name == "ok-1.v2")


def test_formatting_helpers() -> None:
    assert percent(0.625) == "62.5%" and percent(None) == "–" and percent(True) == "–"
    assert one_line("a\n  b\tc") == "a b c"
    assert one_line("x" * 10, 8) == "xxxxx..."


def test_the_sdk_python_is_found_the_way_ci_finds_interpreters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sdk_planner

    python = tmp_path / ".pyenv" / "versions" / "3.12.99" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 0\n")  # "imports" osmosis_ai
    python.chmod(0o755)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("OSMOSIS_SDK_PYTHON", raising=False)
    assert sdk_planner.find_sdk_python() == python
    python.write_text("#!/bin/sh\nexit 1\n")  # no osmosis_ai there
    assert sdk_planner.find_sdk_python() is None
    monkeypatch.setenv("OSMOSIS_SDK_PYTHON", "/named/python")
    assert sdk_planner.find_sdk_python() == Path("/named/python")


def test_nothing_names_a_path_of_one_machine() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False
    ).stdout.decode()
    if not tracked:
        pytest.skip("not a git checkout")
    here = Path(__file__).name
    patterns = ("/" + "work/", "/" + "root/")
    found = []
    for rel in filter(None, tracked.split("\0")):
        path = ROOT / rel
        if rel.endswith(here) or not path.is_file() or path.suffix in (".png", ".parquet"):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        found += [
            f"{rel}:{n}"
            for n, line in enumerate(text.splitlines(), 1)
            if any(p in line for p in patterns)
        ]
    assert not found, os.linesep.join(found)


def test_a_row_result_keeps_the_exception_itself() -> None:
    """--pdb post-mortems in the rollout's own frames: the result holds the raised object."""
    try:
        raise RuntimeError("in the rollout")
    except RuntimeError as exc:
        raised = exc
    built = outcome.RowResult(
        row_index=0,
        run_index=0,
        source_row_index=0,
        rollout_id="r",
        status="failed",
        pass_threshold=1.0,
        extra={"exception": raised},
    ).as_dict()
    assert built["exception"] is raised
