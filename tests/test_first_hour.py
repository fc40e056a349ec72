"""A new user's first hour (issue 29): nothing they meet on the README's path leaves them
stuck, misled or guessing. Each test here is one thing such a user ran into."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from model_server import ModelServer
from workspaces import calc_rows, write_workspace

PLAIN = ("-p", "no:cacheprovider", "-p", "no:randomly")


def _workspace(root: Path) -> Path:
    return write_workspace(
        root, rows=calc_rows([("What is 2 + 2?", "4"), ("What is 3 * 5?", "15")])
    )


# -- 1: a workspace laid out as the README shows ---------------------------------------------


def test_a_workspace_without_the_ini_line_says_how_to_enable_the_plugin(
    pytester: pytest.Pytester,
) -> None:
    _workspace(pytester.path)
    for args in ((), ("--osmosis-plan",)):
        result = pytester.runpytest_subprocess(*args, *PLAIN)
        assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
        hints = [line for line in result.stdout.lines if line.startswith("osmosis: ")]
        assert hints == [
            "osmosis: configs/eval/calc.toml is an eval config, but pytest-osmosis is not "
            "enabled: run pytest --osmosis-eval, or add `osmosis_eval = true` under [pytest] "
            "in pytest.ini"
        ]


def test_the_example_workspace_of_a_fresh_clone_gets_no_warning(pytester: pytest.Pytester) -> None:
    """The README's first command on a fresh clone warned about the example itself: git
    keeps no empty directory, so its ``configs/training/`` was missing."""
    import shutil
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    tracked = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "example_workspace"],
        capture_output=True, text=True, check=False,
    )
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: what a clone holds cannot be told")
    for name in tracked.stdout.splitlines():  # exactly what `git clone` gives a new user
        (pytester.path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(repo / name, pytester.path / name)
    pytester.chdir()
    (pytester.path / "example_workspace").rename(pytester.path / "ws")
    result = pytester.runpytest("ws", "--osmosis-plan", *PLAIN)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["osmosis plan: *capitals.toml"])
    assert not [line for line in result.outlines + result.errlines if "warning:" in line]


def test_a_session_without_eval_configs_gets_no_hint(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nothing="")
    result = pytester.runpytest(*PLAIN)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert not [line for line in result.stdout.lines if line.startswith("osmosis")]


def test_the_ini_line_makes_plain_pytest_collect(pytester: pytest.Pytester) -> None:
    _workspace(pytester.path)
    pytester.makeini("[pytest]\nosmosis_eval = true\n")
    result = pytester.runpytest("--co", "-q", *PLAIN)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["configs/eval/calc.toml::row_1_run_0"])


# -- 2: --osmosis-retry-failed says what it retries ------------------------------------------


def _low(root: Path) -> Path:
    """Row 0 passes, row 1 is below threshold (the model says 15, the label 16)."""
    return write_workspace(
        root, rows=calc_rows([("What is 2 + 2?", "4"), ("What is 3 * 5?", "16")])
    )


def test_help_names_what_each_retry_flag_reruns(pytester: pytest.Pytester) -> None:
    # (argparse may wrap a line at a hyphen: "below-" / "threshold", as pytest 8.4's does)
    out = re.sub(r"-\s+", "-", " ".join(pytester.runpytest("--help").stdout.str().split()))
    assert (
        "--osmosis-retry-failed re-run the errored and skipped attempts of a named run (as the "
        "SDK's --retry-failed), keeping passed and below-threshold ones" in out
    )
    assert "--osmosis-retry-below-threshold re-run the attempts of a named run whose reward" in out
    # 3: the naming rule of several configs is in --help too.
    assert "with several configs each config's run is NAME-<config stem>" in out


def test_retry_failed_keeps_low_rewards_says_why_and_the_other_flag_reruns_them(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    _low(pytester.path)
    named = ("--osmosis-eval", "--osmosis-name", "low", *PLAIN)
    pytester.runpytest(*named).assert_outcomes(passed=1, failed=1)
    requests = model_env.requests_total
    kept = pytester.runpytest(*named, "--osmosis-retry-failed")
    assert model_env.requests_total == requests  # nothing ran, and the table says why
    kept.stdout.fnmatch_lines(
        [
            "--osmosis-retry-failed: run low has no errored or skipped attempt; its 1 "
            "below-threshold attempt is kept (--osmosis-retry-below-threshold re-runs them)"
        ]
    )
    plan = pytester.runpytest(*named, "--osmosis-retry-below-threshold", "--osmosis-plan")
    plan.stdout.fnmatch_lines(["  run * low (resumes: 2 recorded, 1 to run (1 retried))"])
    retried = pytester.runpytest(*named, "--osmosis-retry-below-threshold")
    retried.assert_outcomes(passed=1, failed=1)  # row 0 replayed, row 1 run again
    assert model_env.requests_total == requests + 2  # the preflight and row 1's call
    retried.stdout.fnmatch_lines(
        [
            "osmosis run: configs/eval/calc.toml -> low (resumes: 2 of 2 recorded, retries 1 "
            "errored, skipped or below threshold)",
            "osmosis run: 2 rows x 1 attempt, model openai/test-model",
            "osmosis run: 1 work item pending, 4 in flight, in this process",
        ]
    )


def test_retry_failed_on_a_new_run_says_nothing_was_recorded(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    _workspace(pytester.path)
    result = pytester.runpytest("--osmosis-eval", "--osmosis-retry-failed", *PLAIN)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "osmosis run: note: --osmosis-retry-failed: run calc-* is new, so nothing is recorded "
            "to retry (a run without --osmosis-name is new every session)"
        ]
    )


# -- 3: --osmosis-name with one config, then several -----------------------------------------


def test_the_plan_says_which_named_run_each_config_resumes(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    _workspace(pytester.path)
    pytester.runpytest("--osmosis-eval", "--osmosis-name", "intr3", *PLAIN).assert_outcomes(
        passed=2
    )
    write_workspace(pytester.path, name="sums", dataset="sums")  # the nightly job gains a config
    plan = pytester.runpytest("--osmosis-eval", "--osmosis-name", "intr3", "--osmosis-plan", *PLAIN)
    plan.stdout.fnmatch_lines(
        [
            "osmosis plan: configs/eval/calc.toml",
            "  run * intr3-calc (new run; run intr3 exists but is not resumed: with several "
            "configs each run is intr3-<config stem>)",
        ]
    )
    # The session itself says it too, before the first row (a nightly job prints no plan).
    ran = pytester.runpytest("--osmosis-eval", "--osmosis-name", "intr3", *PLAIN)
    ran.stdout.fnmatch_lines(
        [
            "osmosis run: note: intr3-calc: run intr3 exists but is not resumed: with several "
            "configs each run is intr3-<config stem>"
        ]
    )
    # Back to one config: intr3-calc exists now, and is not what `intr3` resumes.
    one = pytester.runpytest(
        "configs/eval/calc.toml", "--osmosis-name", "intr3", "--osmosis-plan", *PLAIN
    )
    one.stdout.fnmatch_lines(
        [
            "  run * intr3 (finished earlier: all 2 recorded, nothing runs; run intr3-calc exists "
            "but is not resumed: with one config the run is intr3)"
        ]
    )


def test_a_changed_row_selection_is_named_as_such_and_says_how_to_resume(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """Another ``--osmosis-rows`` on a named run was refused as "changed: dataset" (the key
    holds the file's digest and the selection), though the file had not changed."""
    _workspace(pytester.path)
    name = ("--osmosis-eval", "--osmosis-name", "sel", *PLAIN)
    pytester.runpytest(*name, "--osmosis-rows", "0").assert_outcomes(passed=1)
    changed = pytester.runpytest(*name, "--osmosis-rows", "0-1")
    assert changed.ret == pytest.ExitCode.USAGE_ERROR
    assert changed.errlines == [
        f"ERROR: run 'sel' in {pytester.path / '.osmosis' / 'evals'} was created with "
        "different resolved inputs (changed: row selection (0 recorded, 0-1 now)), so "
        "resuming it would mix versions inside one set of metrics; select its rows again "
        "(--osmosis-rows 0) to resume it, rerun with --osmosis-fresh (the previous results "
        "are archived, never deleted) or use a different --osmosis-name",
        "",
    ]
    plan = pytester.runpytest(*name, "--osmosis-rows", "0-1", "--osmosis-plan")
    plan.stdout.fnmatch_lines(
        [
            "  run * sel (would be refused: made with different inputs (changed: row selection "
            "(0 recorded, 0-1 now)))"
        ]
    )
    # The plan stops as the run would: exit 4, with the run's own line.
    assert plan.ret == pytest.ExitCode.USAGE_ERROR
    assert plan.errlines == changed.errlines
    # The file itself changed too: both are named, and no --osmosis-rows can resume it.
    data = pytester.path / "data" / "calc.jsonl"
    data.write_text(data.read_text() + data.read_text().splitlines()[0] + "\n")
    both = pytester.runpytest(*name, "--osmosis-rows", "0-1")
    assert "(changed: dataset, row selection (0 recorded, 0-1 now))" in both.errlines[0]
    assert "select its rows again" not in both.errlines[0]
    file_only = pytester.runpytest(*name, "--osmosis-rows", "0")
    assert "(changed: dataset), so resuming" in file_only.errlines[0]
    # The selection the message names resumes the run (finished: nothing runs again).
    data.write_text("".join(data.read_text().splitlines(keepends=True)[:2]))
    again = pytester.runpytest(*name, "--osmosis-rows", "0")
    assert again.ret == pytest.ExitCode.OK
    again.stdout.fnmatch_lines(["already finished: every row is recorded, none ran again*"])
    assert model_env.requests_total == 2  # the first session's preflight and its one row


# -- 4: what is about to run, and what to do next -------------------------------------------


def test_a_compact_block_before_the_first_row_and_one_line_under_q(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    _workspace(pytester.path)
    args = ("--osmosis-eval", "--osmosis-name", "block", "--osmosis-concurrency", "3", *PLAIN)
    result = pytester.runpytest(*args, "--osmosis-n", "2")
    lines = result.stdout.lines
    block = [line for line in lines if line.startswith("osmosis run:")]
    assert block == [
        "osmosis run: configs/eval/calc.toml -> block (new run)",
        "osmosis run: 2 rows x 2 attempts, model openai/test-model",
        "osmosis run: 4 work items pending, 3 in flight, in this process",
        "osmosis run: output .osmosis/evals/block",
    ]
    # Before the first row: before pytest's header, after the start-up milestones.
    assert lines.index(block[-1]) < lines.index("collected 4 items")
    quiet = pytester.runpytest(*args, "--osmosis-n", "2", "-k", "row_1_", "-q")
    assert [line for line in quiet.stdout.lines if line.startswith("osmosis")] == [
        "osmosis run: 0 work items pending (configs/eval/calc.toml -> block (resumes: 4 of 4 "
        "recorded): 2 rows x 2 attempts, model openai/test-model), nothing runs; output "
        ".osmosis/evals/block"
    ]


def test_the_block_on_a_terminal_stays_above_the_status_line(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    from test_progress import STATUS, frames, run_on_a_terminal, shown

    _workspace(pytester.path)
    output = run_on_a_terminal(
        pytester.path, "--osmosis-eval", "--osmosis-name", "tty", "-n", "2", *PLAIN
    )
    *_, screen = frames(output)
    final = shown(screen)
    block = [line for line in final if line.startswith("osmosis run:")]
    assert block == [  # each line fits the 80 columns
        "osmosis run: configs/eval/calc.toml -> tty (new run)",
        "osmosis run: 2 rows x 1 attempt, model openai/test-model",
        "osmosis run: 2 work items pending, 4 in flight, on 2 xdist workers",
        "osmosis run: output .osmosis/evals/tty",
    ], final
    # Before pytest's header, below the start-up milestones.
    assert final.index(block[-1]) < next(
        i for i, line in enumerate(final) if "test session starts" in line
    )
    assert not [line for line in final if STATUS.match(line)], final
    assert any(line.startswith("upload   osmosis eval upload .osmosis/evals/tty") for line in final)


def test_after_the_table_the_commands_that_come_next(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    _low(pytester.path)
    first = pytester.runpytest("--osmosis-eval", "--osmosis-name", "monday", *PLAIN)
    first.stdout.fnmatch_lines(
        [
            "*- osmosis: next -*",
            # (pytester's own --basetemp is part of the command it ran)
            "retry    pytest --osmosis-eval --osmosis-name monday -p no:cacheprovider -p "
            "no:randomly * --osmosis-retry-below-threshold  (1 below threshold, errored and "
            "skipped too)",
            "report   pytest-osmosis report monday",
            "upload   osmosis eval upload .osmosis/evals/monday",
        ]
    )
    assert "compare  " not in first.stdout.str()  # no earlier run of this rollout
    second = pytester.runpytest("--osmosis-eval", *PLAIN)  # a generated name
    # The command as typed plus the name it lacks: no config path the user did not type.
    second.stdout.fnmatch_lines(
        [
            "retry    pytest --osmosis-eval -p no:cacheprovider -p no:randomly * "
            "--osmosis-name=calc-* --osmosis-retry-below-threshold  *",
            "report   pytest-osmosis report calc-*",
            "compare  pytest-osmosis compare calc-* monday",
        ]
    )
    [retry] = [line for line in second.outlines if line.startswith("retry    ")]
    command = shlex.split(retry.removeprefix("retry    ").split("  (")[0])
    assert not [arg for arg in command if arg.endswith(".toml")], command
    # ... and it reaches that run: its below-threshold attempt runs again, the pass is kept.
    name = next(arg for arg in command if arg.startswith("--osmosis-name=")).split("=", 1)[1]
    third = pytester.runpytest(*command[1:])
    third.stdout.fnmatch_lines(
        [
            f"osmosis run: configs/eval/calc.toml -> {name} (resumes: 2 of 2 recorded, "
            "retries 1 errored, skipped or below threshold)"
        ]
    )
    third.assert_outcomes(passed=1, failed=1)


def test_with_several_configs_the_retry_command_names_the_config(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """``--osmosis-name`` names every run of a session: with two configs the retry command
    must name the config too, or it would retry both under one name."""
    _low(pytester.path)
    write_workspace(pytester.path, name="other", rows=calc_rows([("What is 3 * 5?", "16")]))
    result = pytester.runpytest("--osmosis-eval", *PLAIN)
    result.stdout.fnmatch_lines(
        [
            "calc-*: retry    pytest --osmosis-eval -p no:cacheprovider -p no:randomly * "
            "configs/eval/calc.toml --osmosis-name=calc-* --osmosis-retry-below-threshold  *",
            "other-*: retry    pytest --osmosis-eval -p no:cacheprovider -p no:randomly * "
            "configs/eval/other.toml --osmosis-name=other-* --osmosis-retry-below-threshold  *",
        ]
    )


def _retry_commands(result: pytest.RunResult) -> list[list[str]]:
    """The retry command of each run of a two-config session, as argv."""
    retries = [line for line in result.outlines if ": retry    pytest " in line]
    assert len(retries) == 2, result.outlines
    return [shlex.split(line.split(": retry    ", 1)[1].split("  (")[0]) for line in retries]


def test_the_next_commands_keep_every_options_value(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """An option's value is never a node id or a test path, whatever it holds: ``-W
    ignore::UserWarning`` lost its value (read as a node id, ``::``), and ``--ignore DIR``
    of a directory that exists lost its (read as a test path), leaving ``-W -W`` and an
    ``--ignore`` that took the config's path. Each retry command runs as printed."""

    _low(pytester.path)
    write_workspace(pytester.path, name="other", rows=calc_rows([("What is 3 * 5?", "16")]))
    (pytester.path / "notes").mkdir()
    options = ("-W", "ignore::UserWarning", "--ignore", "notes", "-o", "console_output_style=classic")
    result = pytester.runpytest("--osmosis-eval", *options, *PLAIN)
    for command, config in zip(_retry_commands(result), ("calc", "other"), strict=True):
        at = command.index("-W")
        assert command[at : at + 6] == ["-W", "ignore::UserWarning", *options[2:]], command
        assert command[-3:] == [
            f"configs/eval/{config}.toml",
            command[-2],
            "--osmosis-retry-below-threshold",
        ], command
        assert command[-2].startswith(f"--osmosis-name={config}-"), command
    again = pytester.runpytest(*command[1:])
    again.assert_outcomes(failed=1)  # the other config's row, retried alone under its name


def test_the_resume_command_after_a_selection_finishes_the_run(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """A session that deselected some of a run's items (``-k``, ``--lf``) could never finish
    the run with its own command: the resume command leaves the selection out."""
    import shlex

    write_workspace(
        pytester.path, rows=calc_rows([("What is 2 + 2?", "4"), ("What is 1 + 1?", "2")])
    )
    first = pytester.runpytest("--osmosis-eval", "--osmosis-name", "kk", "-k", "row_0_", *PLAIN)
    first.assert_outcomes(passed=1, deselected=1)
    resume = [line for line in first.outlines if line.startswith("resume   ")]
    assert len(resume) == 1, first.outlines
    command = shlex.split(resume[0].split("  (")[0].removeprefix("resume   "))
    assert "-k" not in command and "row_0_" not in command, command
    again = pytester.runpytest(*command[1:])
    again.assert_outcomes(passed=2)  # the pending row ran; the recorded one reports its record
    assert "resume   " not in again.stdout.str()
    info = json.loads((pytester.path / ".osmosis" / "evals" / "kk" / "metrics.json").read_text())
    assert info["eval_run"]["status"] == "finished"


def test_after_ctrl_c_run_the_same_command_again(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    import signal
    import subprocess
    import sys

    from workspaces import wait_until

    write_workspace(
        pytester.path, rows=calc_rows([("What is 2 + 2?", "4"), ("What is 3 * 5? hold", "15")])
    )
    model_env.hold = "hold"
    log = pytester.path / "session.log"
    args = ["--osmosis-eval", "--osmosis-name", "ctrlc", "--osmosis-concurrency", "1", *PLAIN]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", *args], cwd=pytester.path, stdout=out, stderr=out
        )
    try:
        wait_until(lambda: model_env.holding == 1, "row 1 waits on the model")
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: proc.poll() is not None, "the session exits", 120)
    finally:
        model_env.hold = ""
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, text
    assert (
        "osmosis: stopped early: run the same command again to resume (1 of 2 recorded)" in text
    ), text
    assert "resume   pytest --osmosis-eval --osmosis-name ctrlc" in text, text
    assert "upload " not in text  # an unfinished run is not uploaded


# -- 5: 0/0 is not 0.0% ------------------------------------------------------------------------


def test_a_pass_rate_of_nothing_reads_n_a(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    write_workspace(pytester.path, rows=calc_rows([("What is 4 + 4?", "8", "skip")]))
    result = pytester.runpytest("--osmosis-eval", "--osmosis-progress", "log", *PLAIN)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["pass rate  n/a (0 passed / 0 attempts not skipped), pass_threshold 1.0"]
    )
    assert "pass rate n/a;" in result.stdout.str()  # the progress line's
    assert "0.0%" not in result.stdout.str()


# -- 9: one provider 500 costs at most the bridge's retries ---------------------------------


def test_a_client_with_default_retries_does_not_retry_what_the_bridge_retried(
    model_loop: Any, model_server: ModelServer
) -> None:
    """The README's AsyncOpenAI has max_retries=2: without the bridge's x-should-retry it
    would send each of its 3 tries through the bridge's own 3 (9 provider requests)."""
    import openai

    from pytest_osmosis.model.bridge import Bridge
    from pytest_osmosis.model.ratelimit import TRANSIENT_RETRIES
    from pytest_osmosis.model.routes import ModelRoute

    model = "openai/osmosis-test"
    bridge = Bridge(ModelRoute(model, model, {"api_base": model_server.url, "api_key": "sk-x"}))
    model_loop.run(bridge.start())
    try:
        url, key = bridge.open_rollout("r1")
        client = openai.AsyncOpenAI(base_url=url, api_key=key)  # max_retries=2, the default
        model_server.fail_next(500, count=100, message="the provider is down")

        async def call() -> BaseException:
            try:
                await client.chat.completions.create(
                    model="any", messages=[{"role": "user", "content": "What is 2 + 2?"}]
                )
            except openai.APIStatusError as exc:
                return exc
            raise AssertionError("the call succeeded")

        error = model_loop.run(call())
        assert error.response.headers["x-should-retry"] == "false"
        assert model_server.requests_total == 1 + TRANSIENT_RETRIES  # the bridge's, no more
    finally:
        model_loop.run(bridge.close())


# -- 5: a provider error's headline is the provider's, not the client's ----------------------


def test_a_provider_error_headline_has_no_bridge_url_and_no_mdn_link(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    _workspace(pytester.path)
    model_env.fail_on = {"3 * 5": (500, 100)}  # row 1's calls: the provider answers 500
    result = pytester.runpytest("--osmosis-eval", "--osmosis-name", "p500", *PLAIN)
    result.assert_outcomes(passed=1, errors=1)
    run_dir = pytester.path / ".osmosis" / "evals" / "p500"
    index = [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]
    errors = [row for row in index if row["status"] == "failed"]
    assert len(errors) == 1
    lines = result.stdout.lines
    headline = lines[lines.index(errors_header(result)) + 1]
    for text in (headline, _info_errored(run_dir)):
        assert "workflow raised HTTPStatusError: model call failed: 500 from " in text, text
        assert "injected error 500 for '3 * 5'" in text
        assert "/v1/rollouts/" not in text and "developer.mozilla.org" not in text, text
    # The client's own words, with the bridge's URL, stay in the run's log.
    logs = (run_dir / "logs.txt").read_text()
    assert "/v1/rollouts/" in logs and "developer.mozilla.org" in logs


def errors_header(result: pytest.RunResult) -> str:
    """The line pytest heads the errored row's report with."""
    return next(line for line in result.stdout.lines if "ERROR at setup of row_1_run_0" in line)


def _info_errored(run_dir: Path) -> str:
    import contextlib
    import io

    from pytest_osmosis.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["info", str(run_dir)]) == 0
    return out.getvalue()


# -- 7: a direct-route call is priced as LiteLLM prices it --------------------------------------


def test_direct_rows_are_priced_from_litellms_map_without_importing_it(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    import litellm

    _workspace(pytester.path)
    pytester.makeconftest(
        """
        import sys
        from pathlib import Path

        def pytest_unconfigure(config):
            Path("imported.txt").write_text(str("litellm" in sys.modules))
        """
    )
    result = pytester.runpytest_subprocess(
        "--osmosis-eval",
        "--osmosis-name",
        "priced",
        "--osmosis-model",
        "openai/gpt-4o-mini",
        *PLAIN,
    )
    result.assert_outcomes(passed=2)
    assert (pytester.path / "imported.txt").read_text() == "False"  # the rows went direct
    run_dir = pytester.path / ".osmosis" / "evals" / "priced"
    costs = json.loads((run_dir / "osmosis_metrics.json").read_text())["cost_usd_by_rollout"]
    expected = {}
    for rollout_id in costs:
        trajectory = json.loads(
            (run_dir / "rollout_trials" / rollout_id / "trajectory.json").read_text()
        )
        metrics = trajectory["final_metrics"]
        prompt, completion = metrics["total_prompt_tokens"], metrics["total_completion_tokens"]
        expected[rollout_id] = sum(
            litellm.cost_per_token(
                model="openai/gpt-4o-mini", prompt_tokens=prompt, completion_tokens=completion
            )
        )
    assert costs == pytest.approx(expected) and all(costs.values())
    assert "cost unknown" not in result.stdout.str()
    # Progress says the running cost in the results table's words, never "$0.00" (which
    # reads as free): every attempt so far priced, the sum above zero.
    rows = [line for line in result.stdout.lines if line.startswith("osmosis: row ")]
    found = [re.search(r"; cost \$(\d+\.\d{6}) for (\d+) of \2 priced attempts; ", r) for r in rows]
    assert rows and all(m and float(m.group(1)) > 0 for m in found), rows


# -- 6: a green local run says what it did not cover --------------------------------------------


def test_a_run_that_skipped_the_sdk_lanes_says_how_to_run_them(pytester: pytest.Pytester) -> None:
    from reference_paths import needs_reference
    from sdk_planner import SDK_MISSING

    pytester.makepyfile(
        test_lanes=f"""
        import pytest

        @pytest.mark.skipif(True, reason={SDK_MISSING!r})
        def test_sdk(): pass

        @pytest.mark.skipif(True, reason={needs_reference.kwargs["reason"]!r})
        def test_reference(): pass

        @pytest.mark.skip(reason="not on this platform")
        def test_other(): pass

        def test_ok(): pass
        """
    )
    result = pytester.runpytest("-p", "lane_skips", *PLAIN)
    result.assert_outcomes(passed=1, skipped=3)
    result.stdout.fnmatch_lines(
        [
            "not covered: 2 tests skipped that need the official SDK or its reference run; to "
            "run them, set OSMOSIS_SDK_PYTHON to a Python 3.12+ with osmosis-ai[eval]==0.3.8 "
            "and OSMOSIS_REFERENCE_RUN to the SDK's reference run (shared/reference-run), as "
            ".ci/run does"
        ]
    )
    nothing = pytester.runpytest("-p", "lane_skips", "-k", "ok or other", *PLAIN)
    assert "not covered" not in nothing.stdout.str()


# -- 8: the report, info and compare ----------------------------------------------------------

METADATA_ROLLOUT = """
from pytest_osmosis.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend


class Sums(AgentWorkflow):
    async def run(self, ctx):
        m = ctx.metadata
        if m.get("boom"):
            raise RuntimeError("no question built")
        question = [{"role": "user", "content": f"What is {m['a']} + {m['b']}?"}]
        return AgentWorkflowOutput(messages=[*question, {"role": "assistant", "content": "13"}])


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(float(ctx.sample.messages[-1]["content"] == ctx.label))


backend = LocalBackend(workflow=Sums, grader=Exact)
"""


def test_the_report_shows_a_metadata_rows_input(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    write_workspace(
        pytester.path,
        rows=[
            {"metadata": {"a": 6, "b": 7}, "ground_truth": "13"},
            {"metadata": {"a": 1, "b": 1, "boom": True}, "ground_truth": "2"},
        ],
    )
    (pytester.path / "rollouts" / "calc" / "main.py").write_text(METADATA_ROLLOUT)
    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-name", "meta", "--osmosis-report", *PLAIN
    )
    result.assert_outcomes(passed=1, errors=1)
    page = (pytester.path / ".osmosis" / "evals" / "meta" / "report.html").read_text()
    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page)
    assert found is not None
    data = json.loads(found.group(1))
    shared = data["inputs"]
    inputs = [[shared[i] for i in row.get("ii", [])] for row in data["rows"]]
    # The question the workflow built (its trajectory); without one, the row's metadata.
    assert inputs == [
        [["user", "What is 6 + 7?"]],
        [["metadata", '{"a": 1, "b": 1, "boom": true}']],
    ]
    assert [row["in_src"] for row in data["rows"]] == ["trajectory", "dataset"]


def test_info_lists_errored_and_below_threshold_attempts(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    from workspaces import MIXED_ROWS

    write_workspace(pytester.path, rows=MIXED_ROWS)
    pytester.runpytest("--osmosis-eval", "--osmosis-name", "mixed", *PLAIN)
    text = _info_errored(pytester.path / ".osmosis" / "evals" / "mixed")
    lines = text.splitlines()
    assert "Errored attempts (2)" in lines
    at = lines.index("Below threshold attempts (1)")
    assert re.fullmatch(r"  row 1 run 0: reward 0\.00 < 1\.0 -> rollout_trials/\w+", lines[at + 1])
    assert "Skipped attempts (1)" in lines


def test_compare_is_report_compare(pytester: pytest.Pytester, model_env: ModelServer) -> None:
    import contextlib
    import io

    from pytest_osmosis.cli import main

    _workspace(pytester.path)
    for name in ("monday", "tuesday"):
        pytester.runpytest("--osmosis-eval", "--osmosis-name", name, *PLAIN)
    root = str(pytester.path / ".osmosis" / "evals")
    said = []
    for argv in (
        ["compare", "tuesday", "monday", "--output", root, "--format", "markdown"],
        ["report", "tuesday", "--compare", "monday", "--output", root, "--format", "markdown"],
    ):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(argv) == 0
        said.append(out.getvalue())
    assert said[0] == said[1] and "monday" in said[0]


def test_per_row_tick_labels_do_not_overlap_at_30_rows() -> None:
    from pytest_osmosis.report.svg import PLOT_W, TICK_CHAR_W, bar_chart

    bars = [(str(row), 1.0, "pass", f"row {row}") for row in range(30)]
    svg = bar_chart("per-row", "rows", bars, x_label="row", y_label="passed", pct=True)
    ticks = re.findall(
        r'<text class="tick" x="([\d.]+)" y="[\d.]+" text-anchor="middle">(\d+)<', svg
    )
    assert [label for _, label in ticks] == [str(row) for row in range(0, 30, 2)]
    xs = [float(x) for x, _ in ticks]
    gaps = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    assert min(gaps) > 2 * TICK_CHAR_W  # two digits fit between
    assert PLOT_W / 30 < 2 * TICK_CHAR_W  # (every row labelled would have overlapped)


def test_runs_html_plots_small_and_incomplete_runs_on_lines_of_their_own(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    from pytest_osmosis.report import write_index

    _workspace(pytester.path)
    base = ("--osmosis-eval", "--osmosis-concurrency", "1", *PLAIN)
    pytester.runpytest(*base, "--osmosis-name", "full").assert_outcomes(passed=2)
    pytester.runpytest(*base, "--osmosis-name", "smoke", "--osmosis-rows", "0")
    pytester.runpytest(*base, "--osmosis-name", "cut", "-k", "row_0_").assert_outcomes(passed=1)
    page = write_index(pytester.path / ".osmosis" / "evals").read_text()
    legend = re.findall(r'<text class="legend-entry [^"]*"[^>]*>&#9679; ([^<]*)<', page)
    assert sorted(legend) == [
        "calc on calc, 1 attempt",
        "calc on calc, 2 attempts",
        "calc on calc, 2 attempts (incomplete)",
    ]


# -- 9: a rollout written as a package of its own (session 12's walk) ---------------------------


def test_a_rollout_auto_sends_to_a_server_without_uv_is_named_with_why_and_the_ways_out(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollout's ``pyproject.toml`` naming what this environment lacks (``osmosis-ai``, as
    real rollouts do) sends it to a server of its own under ``auto``; without uv the line
    said only "uv is needed ...": not which rollout, not why it was not run in process, and
    the way out by an ini option's name rather than the command line's."""
    import sys
    import sysconfig

    scripts = {sysconfig.get_path("scripts"), str(Path(sys.executable).parent)}
    if any((Path(folder) / "uv").is_file() for folder in scripts):
        pytest.skip("uv is installed beside this interpreter: the session would find it")
    _workspace(pytester.path)
    rollout = pytester.path / "rollouts" / "calc"
    (rollout / "pyproject.toml").write_text(
        '[project]\nname = "calc"\nversion = "0.1.0"\n'
        'dependencies = ["no-such-distribution-anywhere>=1"]\n'
    )
    monkeypatch.setenv("PATH", str(pytester.path / "no-tools-here"))  # and so no uv on PATH
    result = pytester.runpytest_subprocess("--osmosis-eval", *PLAIN)
    assert result.ret == pytest.ExitCode.INTERRUPTED  # the config's collection error
    assert (
        f"{rollout}: runs on a server of its own (its pyproject.toml needs "
        "no-such-distribution-anywhere>=1 (not installed)), and uv is needed to build a "
        "rollout's own environment from its pyproject.toml (as `osmosis eval run` does): pip "
        "install 'pytest-osmosis[server]', name an interpreter that has osmosis-ai with "
        "--osmosis-server-python PYTHON, or run the rollout in this environment with "
        "--osmosis-execution in-process"
    ) in result.stdout.lines, result.stdout.str()
    # ... and the way out it names works: the rollout never imports what it declared.
    again = pytester.runpytest_subprocess(
        "--osmosis-eval", "--osmosis-execution", "in-process", *PLAIN
    )
    again.assert_outcomes(passed=2)


def test_a_placeholder_in_model_path_is_told_it_is_not_expanded(
    pytester: pytest.Pytester, model_env: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``model_path = "${MODEL}"`` (the contract has no placeholders, nor has the SDK) got
    LiteLLM's "LLM Provider NOT provided ... huggingface/starcoder" paragraph; the line now
    says that the TOML is not expanded and where a model chosen at run time goes."""
    write_workspace(
        pytester.path, rows=calc_rows([("What is 2 + 2?", "4")]), model_path="${EVAL_MODEL}"
    )
    monkeypatch.setenv("EVAL_MODEL", "openai/test-model")  # set, and still not read
    result = pytester.runpytest_subprocess("--osmosis-eval", *PLAIN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines + result.outlines if line.startswith("ERROR:")]
    assert errors == [
        "ERROR: model preflight failed for '${EVAL_MODEL}': not a LiteLLM model id; "
        "it is read as written, never expanded from the environment (as `osmosis eval run` "
        "reads the eval TOML): choose the model at run time with --osmosis-model MODEL"
    ]
    assert list((pytester.path / ".osmosis" / "evals").glob("[!.]*")) == []  # no run
    chosen = pytester.runpytest_subprocess(
        "--osmosis-eval", "--osmosis-model", "openai/test-model", *PLAIN
    )
    chosen.assert_outcomes(passed=1)


def test_help_says_what_confirm_does_without_a_terminal(pytester: pytest.Pytester) -> None:
    """The help said "(skipped when stdin is not a terminal)", which reads as "the run is
    skipped" as easily as "the question is": in CI the run goes on (README, Seeing the plan
    before spending)."""
    out = " ".join(pytester.runpytest("--help").stdout.str().split())
    assert (
        "--osmosis-confirm print the plan and ask before the first model call: only y goes "
        "on (when stdin is not a terminal nothing is asked and the run goes on)" in out
    )


def test_run_from_a_rollouts_own_directory_says_where_the_workspace_is(
    pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``cd rollouts/calc`` (to ``pip install -e .`` it), then ``pytest --osmosis-eval``: it
    said only "no tests ran". A ``-k`` that deselects every item is still silent."""
    _workspace(pytester.path)
    (pytester.path / "configs" / "eval" / "other.toml").write_text(
        (pytester.path / "configs" / "eval" / "calc.toml").read_text()
    )
    rollout = pytester.path / "rollouts" / "calc"
    result = pytester.runpytest_subprocess("--osmosis-eval", *PLAIN, rollout)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    said = [line for line in result.stdout.lines if line.startswith("osmosis:")]
    assert said == [
        "osmosis: no configs/eval/*.toml under rollouts/calc; the workspace at . has 2 eval "
        "configs: run pytest --osmosis-eval there, or name one: pytest configs/eval/calc.toml"
    ]
    nowhere = tmp_path_factory.mktemp("elsewhere")  # outside the workspace
    result = pytester.runpytest_subprocess("--osmosis-eval", *PLAIN, nowhere)
    said = [line for line in result.stdout.lines if line.startswith("osmosis:")]
    assert len(said) == 1
    assert said[0].startswith("osmosis: no configs/eval/*.toml under ")
    assert said[0].endswith("elsewhere0, nor in a directory above it")
    deselected = pytester.runpytest_subprocess("--osmosis-eval", "--co", "-k", "nothing", *PLAIN)
    assert deselected.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert not [line for line in deselected.stdout.lines if "no configs/eval" in line]


_REWARD_AS_WORD = """
from pytest_osmosis.rollout import AgentWorkflow, Grader, LocalBackend


class Echo(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, {"role": "assistant", "content": "4"}]


class Wordy(Grader):
    async def grade(self, ctx):
        ctx.set_reward("high")


backend = LocalBackend(workflow=Echo, grader=Wordy)
"""


def test_a_reward_the_api_refuses_shows_the_rollouts_line_not_the_apis_insides(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """``ctx.set_reward("high")``: the headline named the problem, but the traceback went on
    through pydantic's ``main.py`` (what ``set_reward`` validates with), frames no rollout
    author can act on. It ends at the rollout's own call now, with the exception itself."""
    write_workspace(
        pytester.path,
        rows=calc_rows([("What is 2 + 2?", "4")]),
        rollout_source=_REWARD_AS_WORD,
    )
    result = pytester.runpytest_subprocess("--osmosis-eval", *PLAIN)
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    section = out[out.index("ERROR at setup of row_0_run_0") : out.index("osmosis: calc")]
    frames = re.findall(r'^  File "([^"]+)", line \d+, in (\w+)$', section, re.MULTILINE)
    assert frames == [(str(pytester.path / "rollouts" / "calc" / "main.py"), "grade")], section
    assert "validation_error: grader raised ValidationError: reward: " in section
    assert "ValidationError: 1 validation error for RolloutSample" in section


def test_the_next_commands_keep_the_value_of_a_plugins_option(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    """Any plugin's option takes its value as pytest reads it, not only the options a list
    names: ``--data DIR`` of a conftest (as ``--cov-config .coveragerc`` of pytest-cov), a
    directory that exists, was read as a test path and left out, so the retry command gave
    ``--data`` the config's path and ran no config. ``--level`` takes an optional value."""
    _low(pytester.path)
    write_workspace(pytester.path, name="other", rows=calc_rows([("What is 3 * 5?", "16")]))
    (pytester.path / "notes").mkdir()
    pytester.makeconftest(
        """
        def pytest_addoption(parser):
            parser.addoption("--data")
            parser.addoption("--level", nargs="?", const="1")
        """
    )
    options = ("--data", "notes", "--level", "notes")
    result = pytester.runpytest("--osmosis-eval", *options, *PLAIN)
    for command, config in zip(_retry_commands(result), ("calc", "other"), strict=True):
        at = command.index("--data")
        assert command[at : at + 4] == list(options), command
        assert command[-3] == f"configs/eval/{config}.toml", command
    again = pytester.runpytest(*command[1:])
    again.assert_outcomes(failed=1)  # the other config's row, retried alone under its name
