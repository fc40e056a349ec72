"""One broken config among several (issue 12, point 14).

The official workspace template ships a placeholder ``configs/eval/default.toml`` (the
SDK's ``eval.toml.tpl``: ``rollout = "<your-rollout>"``) next to the real configs.
pytest's semantics stay (a collection error interrupts the session), but the error line
says how to run the others, and ``--continue-on-collection-errors`` really runs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_server import ModelServer
from workspaces import calc_rows, read_index, run_session, write_workspace

pytest_plugins = ["pytester"]

# The shape of the template's placeholder (osmosis_ai/templates/_scaffolds/rollout/eval.toml.tpl).
PLACEHOLDER = """\
# Osmosis evaluation config reference.
# Command: osmosis eval submit configs/eval/<your-rollout>.toml
#
[experiment]
rollout = "<your-rollout>"            # Rollout name
entrypoint = "main.py"                # Entrypoint file name
model_path = "openai/gpt-5-mini"      # LiteLLM-style model name
dataset = "<your-dataset-name>"       # Platform dataset name

[evaluation]
# limit = 200                         # Optional row cap

[secrets]
required = ["OPENAI_API_KEY"]
"""


def _workspace(root: Path) -> None:
    """Two real configs (calc: 2 rows, sums: 3 rows) and the template's placeholder."""
    write_workspace(root)
    write_workspace(
        root,
        name="sums",
        dataset="sums",
        rows=calc_rows([("What is 1 + 1?", "2"), ("What is 2 + 3?", "5"), ("What is 4 + 4?", "8")]),
    )
    (root / "configs" / "eval" / "default.toml").write_text(PLACEHOLDER)


def test_the_error_line_says_how_to_run_the_other_configs(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    _workspace(pytester.path)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*Interrupted: 1 error during collection*"])
    result.stdout.fnmatch_lines(
        [
            "*default.toml: experiment.rollout: rollout directory not found: *<your-rollout>; "
            "to run the other configs, add --continue-on-collection-errors or name them: "
            "pytest configs/eval/calc.toml configs/eval/sums.toml"
        ]
    )


def test_a_lone_broken_config_names_no_others(pytester: pytest.Pytester) -> None:
    write_workspace(pytester.path)
    (pytester.path / "configs" / "eval" / "calc.toml").write_text(PLACEHOLDER)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider", "--collect-only")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert "--continue-on-collection-errors" not in result.stdout.str()


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["single", "xdist"])
def test_continue_on_collection_errors_runs_the_good_configs(
    pytester: pytest.Pytester, model_env: ModelServer, workers: tuple[str, ...]
) -> None:
    _workspace(pytester.path)
    result = run_session(
        pytester, "--osmosis-eval", "-p", "no:cacheprovider", "--continue-on-collection-errors",
        *workers,
    )
    result.assert_outcomes(passed=5, errors=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the broken config still fails it
    assert "to run the other configs" not in result.stdout.str()
    evals = pytester.path / ".osmosis" / "evals"
    runs = {p.name.split("-")[0]: p for p in evals.iterdir() if not p.name.startswith(".")}
    assert sorted(runs) == ["calc", "sums"]  # none for the placeholder
    for stem, rows in (("calc", 2), ("sums", 3)):
        index = read_index(runs[stem])
        assert [(r["row_index"], r["status"], r["reward"]) for r in index] == [
            (row, "success", 1.0) for row in range(rows)
        ]
        manifest = json.loads((runs[stem] / "manifest.json").read_text())
        assert manifest["inputs"]["dataset"]["selected_source_rows"] == f"0-{rows - 1}"
        metrics = json.loads((runs[stem] / "metrics.json").read_text())
        assert metrics["eval_run"]["status"] == "finished", metrics
        assert metrics["eval_run"]["dataset_name"] == stem, metrics
        assert metrics["summary"]["passed"] == rows, metrics


def test_the_hint_after_a_traceback_is_a_line_of_its_own(pytester: pytest.Pytester) -> None:
    """A rollout that raises at import ends its message with the traceback's source line:
    the hint goes on the next line, not glued to the code."""
    write_workspace(pytester.path)
    write_workspace(pytester.path, name="boom", rollout="boom", dataset="calc")
    (pytester.path / "rollouts" / "boom" / "main.py").write_text(
        'raise RuntimeError("broken at import")\n'
    )
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider", "--collect-only")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    lines = result.stdout.lines  # the collection error (after the plan, which names it too)
    source = len(lines) - 1 - lines[::-1].index('    raise RuntimeError("broken at import")')
    assert lines[source + 1] == (
        "to run the other configs, add --continue-on-collection-errors or name them: "
        "pytest configs/eval/calc.toml"
    )


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["single", "xdist"])
def test_an_interrupted_collection_opens_no_run_and_calls_no_model(
    pytester: pytest.Pytester, model_env: ModelServer, workers: tuple[str, ...]
) -> None:
    """The healthy configs' run directories were made (left ``incomplete``) and the model
    was called for the preflight; under ``-n 2`` the session exited 1 with the other
    configs run, where a single process exits 2. Then ``-n 2`` said the error twice (the
    second time as ``! _pytest.outcomes.Exit``): its controller now collects as one
    process does, so both say the same, once."""
    _workspace(pytester.path)
    result = run_session(pytester, "--osmosis-eval", "-p", "no:cacheprovider", *workers)
    output = "\n".join([*result.outlines, *result.errlines])
    assert result.ret == pytest.ExitCode.INTERRUPTED, output
    assert output.count("Interrupted: 1 error during collection") == 1, output
    errors = [line for line in output.splitlines() if "rollout directory not found" in line]
    assert len(errors) == 1, output
    assert "default.toml: experiment.rollout: rollout directory not found" in errors[0]
    assert "to run the other configs, add --continue-on-collection-errors" in errors[0]
    assert "ERROR configs/eval/default.toml" in result.outlines, output
    for noise in ("INTERNALERROR", "Traceback", "Exit:", "bringing up nodes", "workers"):
        assert noise not in output, output
    assert not (pytester.path / ".osmosis").exists()
    assert model_env.requests_total == 0
