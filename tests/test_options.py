"""Command-line options as users write them (issue 12, points 11 and 13).

Every value-taking ``--osmosis-*`` option works in both spellings, ``--opt value`` and
``--opt=value``, even when the value names an existing file or directory (which pytest's
first parse, made before plugins load, takes for a test path); an explicitly given but
blank row selector or limit is refused rather than read as "every row".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_server import ModelServer
from workspaces import read_index, write_workspace

from pytest_osmosis.plugin.options import OPTIONS, RUBRIC_OPTIONS

pytest_plugins = ["pytester"]

WORKSPACE_INI = (
    "[pytest]\n"
    "osmosis_eval = true\n"
    "osmosis_rubric_text = The answer is right.\n"
    "osmosis_judge_model = openai/judge\n"
    "osmosis_min_score = 0.5\n"
)

# flag -> its value, relative to the workspace. Every value names an existing path that a
# misread would make pytest's rootdir: "elsewhere/" and the value directories inside the
# workspace hold their own pytest.ini, "out/" (outside the workspace, as absolute as the
# README writes it) none.
SPACE_VALUES = {
    "--osmosis-model": "openai/test-model",
    "--osmosis-limit": "3",
    "--osmosis-n": "1",
    "--osmosis-rows": "0-1",
    "--osmosis-pass-threshold": "1.0",
    "--osmosis-dataset-file": "../elsewhere/calc.jsonl",
    "--osmosis-sample": "1",
    "--osmosis-seed": "7",
    "--osmosis-concurrency": "3",
    "--osmosis-output": "<out>",
    "--osmosis-name": "nightly",
    "--osmosis-secrets-file": "../elsewhere/secrets.env",
    "--osmosis-progress": "log",
    "--osmosis-github": "off",
    "--osmosis-min-pass-rate": "0.5",
    "--osmosis-gate-bound": "wilson",
    "--osmosis-max-error-rate": "0.25",
    "--osmosis-baseline": "main",
    "--osmosis-max-regression": "0.1",
    "--osmosis-gate-test": "paired",
    "--osmosis-baseline-allow": "pass_threshold",
    "--osmosis-row-pass": "1/1",
    "--osmosis-max-tokens": "1000",
    "--osmosis-max-cost": "2.5",
    "--osmosis-cache": "use",
    "--osmosis-cache-max-age": "7d",
    "--osmosis-rubric": "../elsewhere/conversations.jsonl",
    "--osmosis-rubric-text": "rubric",
    "--osmosis-judge-model": "openai/judge",
    "--osmosis-min-score": "0.5",
    "--osmosis-rubric-n": "3",
    "--osmosis-rubric-score-min": "0",
    "--osmosis-rubric-score-max": "1",
    "--osmosis-regrade": "../elsewhere/finished",
    "--osmosis-rollout-dir": "../elsewhere/rollout",
    "--osmosis-execution": "in-process",
    "--osmosis-server-python": "python3",
    "--osmosis-shard": "1/1",
    "--osmosis-reuse": "../elsewhere/finished",
    "--osmosis-upload": "on-pass",
    "--osmosis-remote-root": "../elsewhere/root",
}


def test_the_table_names_every_value_taking_option() -> None:
    flags = {opt.flag for opt in (*OPTIONS, *RUBRIC_OPTIONS) if not opt.is_flag}
    assert flags == set(SPACE_VALUES)


def _finished_run(ws: Path, run_dir: Path) -> None:
    """A finished run of the workspace's config (what ``--osmosis-regrade`` asks for)."""
    from pytest_osmosis.workspace.plan import build_plan, run_inputs

    plan = build_plan(ws / "configs" / "eval" / "calc.toml", {}, None)
    run_dir.mkdir()
    manifest = {
        "schema_version": 1,
        "local_run_id": "0" * 32,
        "run_name": run_dir.name,
        "created_at": "2026-01-01T00:00:00Z",
        "inputs": run_inputs(plan),
        "provenance": {"config_path": "configs/eval/calc.toml"},
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "metrics.json").write_text(json.dumps({"eval_run": {"status": "finished"}}))
    records = [  # a journal that covers its selection (regrade refuses one that does not)
        {"rollout_id": f"r{row}{run}", "row_index": row, "run_index": run,
         "source_row_index": row, "status": "success", "reward": 1.0, "duration_ms": 1.0,
         "tokens": 0}
        for row in range(len(plan.dataset))
        for run in range(plan.settings.n)
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _layout(root: Path) -> Path:
    """``root/ws`` (the workspace, its ini turns the plugin on), ``root/elsewhere`` and
    ``root/out``, plus a directory (with its own ini) for each in-workspace value."""
    ws = root / "ws"
    write_workspace(ws)
    (ws / "pytest.ini").write_text(WORKSPACE_INI)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "pytest.ini").write_text("[pytest]\n")
    (elsewhere / "calc.jsonl").write_text((ws / "data" / "calc.jsonl").read_text())
    (elsewhere / "secrets.env").write_text("UNUSED_TOKEN=abcdefgh12345\n")
    record = {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
        ]
    }
    (elsewhere / "conversations.jsonl").write_text(json.dumps(record) + "\n")
    _finished_run(ws, elsewhere / "finished")
    (elsewhere / "rollout").mkdir()
    (elsewhere / "rollout" / "main.py").write_text((ws / "rollouts/calc/main.py").read_text())
    (root / "out").mkdir()
    for value in SPACE_VALUES.values():
        if not value.startswith(("..", "<")):
            (ws / value).mkdir(parents=True, exist_ok=True)
            (ws / value / "pytest.ini").write_text("[pytest]\n")
    return ws


def _value(flag: str, root: Path) -> str:
    value = SPACE_VALUES[flag]
    return str(root / "out") if value == "<out>" else value


def _session(pytester: pytest.Pytester, *args: str) -> tuple[int, str, list[str]]:
    result = pytester.runpytest("--collect-only", "-p", "no:cacheprovider", *args)
    lines = result.outlines
    rootdir = next((line for line in lines if line.startswith("rootdir:")), "")
    items = [line.strip() for line in lines if line.strip().startswith("<") and "Item" in line]
    return int(result.ret), rootdir, items


@pytest.mark.parametrize("flag", sorted(SPACE_VALUES))
def test_space_and_equals_spellings_run_the_same_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    root = pytester.path
    ws = _layout(root)
    monkeypatch.chdir(ws)
    value = _value(flag, root)
    joined = _session(pytester, f"{flag}={value}")
    spaced = _session(pytester, flag, value)
    assert joined[0] == pytest.ExitCode.OK, joined
    assert joined[1].split(",")[0] == f"rootdir: {ws}"
    assert "<EvalItem row_0_run_0>" in joined[2]
    assert spaced == joined


def test_addopts_from_the_environment_are_read_the_same_way(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = pytester.path
    ws = _layout(root)
    monkeypatch.chdir(ws)
    monkeypatch.setenv("PYTEST_ADDOPTS", f"--osmosis-output {root / 'out'}")
    ret, rootdir, items = _session(pytester)
    assert ret == pytest.ExitCode.OK
    assert rootdir.split(",")[0] == f"rootdir: {ws}"
    assert "<EvalItem row_1_run_0>" in items


@pytest.mark.parametrize("exists", [True, False], ids=["existing", "new"])
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["single", "xdist"])
def test_output_outside_the_workspace_in_the_readme_spelling(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    model_env: ModelServer,
    workers: tuple[str, ...],
    exists: bool,
) -> None:
    """The README's ``--osmosis-output /abs/dir``: the run lands there, the ini still counts.

    A directory the session creates is one too: xdist's workers parse the controller's
    command line after it made the directory, and must not take it for a test path.
    """
    root = pytester.path
    ws = _layout(root)
    out = root / "out" if exists else root / "new" / "out"
    monkeypatch.chdir(ws)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", *workers, "--osmosis-output", str(out), timeout=300
    )
    result.assert_outcomes(passed=2)
    run_dir = only_run_dir_in(out)
    assert sorted(r["status"] for r in read_index(run_dir)) == ["success", "success"]
    assert not (ws / ".osmosis").exists()


def only_run_dir_in(out: Path) -> Path:
    runs = [p for p in out.iterdir() if not p.name.startswith(".")]
    assert len(runs) == 1, runs
    return runs[0]


BLANK_CASES = [
    pytest.param(
        ("--osmosis-rows", " "),
        None,
        "ERROR: --osmosis-rows: must name the rows to run, such as '0-9,12' "
        "(leave the option out for every row), got ' '",
        id="rows-space",
    ),
    pytest.param(
        ("--osmosis-rows=",),
        None,
        "ERROR: --osmosis-rows: must name the rows to run*got ''",
        id="rows-empty",
    ),
    pytest.param(
        (),
        "osmosis_rows =",
        "ERROR: ini osmosis_rows: must name the rows to run*got ''",
        id="ini-rows",
    ),
    pytest.param(
        ("-o", "osmosis_rows= "),
        None,
        "ERROR: ini osmosis_rows: must name the rows to run*got ''",
        id="override-ini-rows",
    ),
    pytest.param(
        ("--osmosis-limit", ""),
        None,
        "ERROR: --osmosis-limit: must be an integer, got ''",
        id="limit-empty",
    ),
    pytest.param(
        (),
        "osmosis_limit =",
        "ERROR: ini osmosis_limit: must be an integer, got ''",
        id="ini-limit",
    ),
    pytest.param(
        ("--osmosis-sample", " "),
        None,
        "ERROR: --osmosis-sample: must be a number, got ' '",
        id="sample-space",
    ),
    pytest.param(
        ("--osmosis-output", " "),
        None,
        "ERROR: --osmosis-output: must not be blank (leave it out for the default), got ' '",
        id="output-space",
    ),
]


@pytest.mark.parametrize(("args", "ini", "line"), BLANK_CASES)
def test_a_blank_value_is_refused_not_read_as_every_row(
    pytester: pytest.Pytester,
    model_env: ModelServer,
    args: tuple[str, ...],
    ini: str | None,
    line: str,
) -> None:
    """``--osmosis-rows "$ROWS"`` with ROWS unset must not become a full, paid run."""
    write_workspace(pytester.path)
    if ini is not None:
        pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([line])
    assert model_env.requests_total == 0
    assert not (pytester.path / ".osmosis").exists()


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        pytest.param(
            raw,
            f"ERROR: osmosis_backstop_grace: must be a number of seconds >= 0, got {raw!r}",
            id=raw,
        )
        for raw in ("soon", "-1", "inf")
    ],
)
def test_a_bad_backstop_grace_is_one_line_before_any_row(
    pytester: pytest.Pytester, model_env: ModelServer, raw: str, line: str
) -> None:
    """Checked with the other options (exit 4), not at collection or never (-1, inf)."""
    write_workspace(pytester.path)
    pytester.makeini(f"[pytest]\nosmosis_backstop_grace = {raw}\n")
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([line])
    assert "Traceback" not in result.stderr.str()
    assert model_env.requests_total == 0
    assert not (pytester.path / ".osmosis").exists()


@pytest.mark.parametrize(
    ("ini", "grace"),
    [
        pytest.param(None, 30.0, id="absent"),
        pytest.param("osmosis_backstop_grace =", 30.0, id="blank"),
        pytest.param("osmosis_backstop_grace = 0", 0.0, id="zero"),
        pytest.param("osmosis_backstop_grace = 2.5", 2.5, id="given"),
    ],
)
def test_a_blank_backstop_grace_is_the_default(
    pytester: pytest.Pytester, model_env: ModelServer, ini: str | None, grace: float
) -> None:
    """``osmosis_backstop_grace =`` has meant the default 30 s since the key was added
    (unlike the other keys, where blank is refused): each row's backstop is both budgets
    plus the grace."""
    write_workspace(
        pytester.path, evaluation={"agent_workflow_timeout_s": 6, "grader_timeout_s": 3}
    )
    if ini is not None:
        pytester.makeini(f"[pytest]\n{ini}\n")
    items, _ = pytester.inline_genitems("--osmosis-eval", "-p", "no:cacheprovider")
    assert len(items) == 2
    for item in items:
        marker = item.get_closest_marker("timeout")
        assert marker is not None and marker.args == (6 + 3 + grace,)
        assert marker.kwargs == {"method": "signal", "func_only": True}
    assert model_env.requests_total == 0


def test_rubric_values_keep_their_own_rules(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rubric reads blank as absent and ini paths from the ini file (``rubric_value``);
    the eval options read the same blank ini key as a value, which they refuse."""
    from pytest_osmosis.plugin.options import option_value, rubric_option, rubric_value

    pytester.makeini(
        "[pytest]\nosmosis_rubric = evals/c.jsonl\nosmosis_rubric_n =\n"
        "osmosis_judge_model = openai/ini\n"
    )
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)
    config = pytester.parseconfig("--osmosis-judge-model", " ", "--osmosis-min-score", "0.5")

    def read(dest: str) -> tuple[str, Path, str] | None:
        entry = rubric_value(config, rubric_option(dest))
        return None if entry is None else (entry[0], entry[1].resolve(), entry[2])

    root = pytester.path.resolve()
    assert read("rubric") == ("evals/c.jsonl", root, "ini osmosis_rubric")
    assert read("judge_model") == ("openai/ini", root, "ini osmosis_judge_model")  # blank flag
    assert read("min_score") == ("0.5", sub.resolve(), "--osmosis-min-score")
    assert read("rubric_n") is None
    assert option_value(config, rubric_option("rubric_n")) == ("", "ini osmosis_rubric_n")


def test_help_shows_each_option_in_its_group(pytester: pytest.Pytester) -> None:
    """Seven groups instead of one of ~40, each option in its own, the table deciding."""
    from pytest_osmosis.plugin.options import GROUPS

    lines = pytester.runpytest("--help").stdout.lines
    headings = [line.rstrip(":") for line in lines if line.startswith("pytest-osmosis")]
    assert headings == list(GROUPS.values())
    starts = {
        line.rstrip(":"): at for at, line in enumerate(lines) if line.startswith("pytest-osmosis")
    }
    bounds = sorted(starts.values()) + [len(lines)]
    for opt in (*OPTIONS, *RUBRIC_OPTIONS):
        start = starts[GROUPS[opt.group]]
        end = next(b for b in bounds if b > start)
        assert any(line.lstrip().startswith(opt.flag) for line in lines[start:end]), opt.flag


def test_help_shows_a_percent_sign_as_written(pytester: pytest.Pytester) -> None:
    """argparse %-formats an option's help, pytest prints an ini key's as written: both say 95%."""
    text = " ".join(pytester.runpytest("--help").stdout.str().split())
    assert "%%" not in text
    assert text.count("the 95% Wilson lower bound") == 2  # the option and its ini twin
