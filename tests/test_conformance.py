"""The official SDK is the judge: its upload planner and its metrics over our run directories.

Runs the plugin on workspaces with every outcome, then asks ``osmosis-ai`` 0.3.8 (in its
own Python >= 3.12 environment: ``OSMOSIS_SDK_PYTHON``) whether ``osmosis eval upload``
would accept each directory, and whether its ``aggregate_metrics`` over our ``index.jsonl``
equals the summary we wrote.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from model_server import ModelServer
from sdk_planner import SDK_MISSING, SDK_PYTHON, sdk_python_imports
from workspaces import MIXED_ROWS, calc_rows, read_index, run_session, write_workspace

pytestmark = pytest.mark.skipif(
    not sdk_python_imports("osmosis_ai.eval.local.upload"), reason=SDK_MISSING
)

JUDGE = r"""
import json, sys
from pathlib import Path
from osmosis_ai.eval.local.upload import build_eval_upload_plan, LocalEvalUploadError
from osmosis_ai.eval.local.results import aggregate_metrics

run_dir = Path(sys.argv[1])
out = {}
try:
    plan = build_eval_upload_plan(run_dir)
    out["accepted"] = True
    out["files"] = sorted(f.path for f in plan.files)
except LocalEvalUploadError as exc:
    out["accepted"] = False
    out["refusal"] = str(exc)
rows = [json.loads(line) for line in (run_dir / "index.jsonl").read_text().splitlines()]
metrics = json.loads((run_dir / "metrics.json").read_text())
threshold = metrics["summary"]["pass_threshold"]
out["sdk_summary"] = aggregate_metrics(rows, pass_threshold=threshold)
out["our_summary"] = metrics["summary"]
print(json.dumps(out))
"""


def judge(run_dir: Path) -> dict[str, object]:
    done = subprocess.run(
        [str(SDK_PYTHON), "-c", JUDGE, str(run_dir)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


MIXED = [*MIXED_ROWS, *calc_rows([("What is 6 + 1?", "7", "no_reward")])]


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["single", "xdist"])
def test_mixed_outcomes_are_accepted_with_the_sdks_metrics(
    pytester: pytest.Pytester, model_env: ModelServer, xdist: tuple[str, ...]
) -> None:
    write_workspace(pytester.path, rows=MIXED, evaluation={"n": 2})
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "mixed", *xdist)
    result = run_session(pytester, *args)
    result.assert_outcomes(passed=2, failed=2, errors=6, skipped=2)
    run_dir = pytester.path / ".osmosis" / "evals" / "mixed"
    verdict = judge(run_dir)
    assert verdict["accepted"], verdict.get("refusal")
    assert verdict["sdk_summary"] == verdict["our_summary"]
    files = verdict["files"]
    assert isinstance(files, list)
    assert "index.jsonl" in files and "progress.json" in files and "logs.txt" in files
    # Trajectories of every attempt that produced a sample, none for workflow crashes.
    assert sum(1 for f in files if f.endswith("/trajectory.json")) == 10


def test_an_interrupted_run_is_refused_until_resumed_to_completion(
    pytester: pytest.Pytester, model_env: ModelServer
) -> None:
    rows = [dict(r) for r in MIXED[:4]]
    write_workspace(pytester.path, rows=rows)
    args = ("--osmosis-eval", "-p", "no:cacheprovider", "--osmosis-name", "half")
    pytester.runpytest(*args, "-x")
    run_dir = pytester.path / ".osmosis" / "evals" / "half"
    first = judge(run_dir)
    assert not first["accepted"]
    assert "not completed" in str(first["refusal"]) or "incomplete" in str(first["refusal"])
    done_before = {(r["row_index"], r["rollout_id"]) for r in read_index(run_dir)}
    pytester.runpytest(*args)
    second = judge(run_dir)
    assert second["accepted"], second.get("refusal")
    assert second["sdk_summary"] == second["our_summary"]
    after = {(r["row_index"], r["rollout_id"]) for r in read_index(run_dir)}
    assert done_before <= after  # journalled items were carried forward, not re-run
