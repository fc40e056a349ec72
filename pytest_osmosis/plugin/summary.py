"""The results table printed at the end of an eval session.

Every number comes from the ``metrics.json`` the session just wrote, so what the terminal
says and what ``osmosis eval upload`` sends can never disagree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_osmosis.plugin.session import ControllerRun, EvalSession


def write_summary(terminal: Any, session: EvalSession) -> None:
    for run in session.runs.values():
        if not run.metrics:
            continue
        shard = f" ({run.plan.shard})" if run.plan.shard is not None else ""
        terminal.write_sep("=", f"osmosis: {run.plan.run_name}{shard}")
        if run.reuse_note:
            ran = run.executed
            terminal.write_line(
                f"reuse      {run.reused} reused, {ran} run ({run.reuse_note})"
                if run.reused or not run.reuse_note.startswith("nothing")
                else f"reuse      {run.reuse_note}"
            )
        ran_before = run.pending_at_start == 0 and run.executed == 0 and run.rundir.records
        if ran_before and not run.reused:
            from pytest_osmosis.plugin.next_steps import nothing_retried

            terminal.write_line(
                nothing_retried(session, run)
                or "already finished: every row is recorded, none ran again "
                "(--osmosis-retry-failed re-runs errored and skipped attempts, "
                "--osmosis-retry-below-threshold low rewards too; --osmosis-fresh starts anew)"
            )
        for line in summary_lines(run):
            terminal.write_line(line)
        if run.upload_line:
            terminal.write_line(f"upload     {run.upload_line}")
    if session.admission.budget is not None and any(run.metrics for run in session.runs.values()):
        # The budget counts this session's rows (each session has its own budget).
        budget = session.admission.budget
        spent = "spent: " if budget.spent() else ""
        terminal.write_line(f"budget     {spent}{budget.spend_text()} (this session)")
    verdict = session.verdict
    if verdict is not None:
        word = "PASSED" if verdict.passed else "FAILED"
        terminal.write_sep(
            "=", f"osmosis gate {word}", green=verdict.passed, red=not verdict.passed
        )
        for reason in verdict.reasons:
            terminal.write_line(reason)
        terminal.write_line(
            f"exit status {0 if verdict.passed else 1} is decided by the gate, not by single rows"
        )


def summary_lines(run: ControllerRun) -> list[str]:
    from pytest_osmosis.core.outcome import BELOW_THRESHOLD, FAILED, classify, summary_counts
    from pytest_osmosis.core.words import OUTCOME_WORDS, outcomes_text, pass_rate_text, percent
    from pytest_osmosis.results.row_metrics import cost_text, recorded_cost

    metrics = run.metrics
    eval_run: dict[str, Any] = metrics.get("eval_run", {})
    summary: dict[str, Any] = metrics.get("summary", {})
    plan = run.plan
    lines = [
        f"rollout {eval_run.get('rollout_name')}  model {eval_run.get('model_name')}  "
        f"dataset {eval_run.get('dataset_name')}  status {eval_run.get('status')}",
        *([f"execution  {run.execution}"] if run.execution else []),
        "outcomes   "
        + outcomes_text(summary_counts(summary), int(summary.get("total_samples", 0))),
        "pass rate  "
        + pass_rate_text(int(summary.get("passed", 0)), int(summary.get("completed_samples", 0)))
        + f", pass_threshold {summary.get('pass_threshold')}",
    ]
    stats = summary.get("reward_stats")
    if stats:
        lines.append(
            "reward     "
            + "  ".join(f"{k} {stats[k]:.3f}" for k in ("mean", "median", "std", "min", "max"))
        )
    points = summary.get("pass_at_k")
    if points:
        lines.append(
            "pass@k     " + "  ".join(f"pass@{p['k']} {percent(p['value'])}" for p in points)
        )
    lines += row_lines(run.row_metrics)
    duration = eval_run.get("duration_ms")
    cost = cost_text(recorded_cost(run.row_metrics))
    lines.append(
        f"tokens     {summary.get('tokens_used', 0)}"
        + (f"   cost {cost}" if cost is not None else "")
        + (f"   duration {duration / 1000:.1f} s" if isinstance(duration, (int, float)) else "")
    )
    if run.rate_limited:
        lines.append(f"rate limit {run.rate_limited} calls answered 429, retried after back-off")
    if run.cache_calls:
        from pytest_osmosis.model.cache import cache_path

        lines.append(
            f"cache      {run.cache_hits} of {run.cache_calls} model calls answered from "
            f"{cache_path(plan.output_root)}"
        )
    if run.no_trajectory:
        count = len(run.no_trajectory)
        lines.append(
            f"trajectory {count} row{'s' if count > 1 else ''} recorded without "
            f"trajectory.json (first: {run.no_trajectory[0]})"
        )
    lines.append(f"output     {plan.run_dir}")
    if run.report_path is not None:
        lines.append(f"report     {run.report_path}")
        if run.index_path is not None:
            lines.append(f"all runs   {run.index_path}")
    elif run.report_error:
        lines.append(f"report     not written: {run.report_error}")
    threshold = plan.settings.pass_threshold
    not_passed = [
        (outcome, record)
        for _, record in sorted(run.rundir.records.items())
        if (outcome := classify(record, threshold)) in (BELOW_THRESHOLD, FAILED)
    ]
    if not_passed:
        lines.append("attempts that did not pass:")
        for outcome, record in not_passed[:20]:
            # The dataset row, as node ids and progress name it (not the selection position).
            row = plan.dataset.source_row_index(record["row_index"])
            reward = record.get("reward")
            why = (
                f"({record.get('error_type') or 'error'})"
                if outcome == FAILED
                else f"(reward {reward:.2f})"
                if isinstance(reward, (int, float))
                else ""
            )
            trial = plan.run_dir / "rollout_trials" / record["rollout_id"]
            # A crashed worker's row left no trial directory: point at nothing that is not there.
            where = f"  {trial}" if trial.is_dir() else ""
            lines.append(
                f"  row {row} run {record['run_index']}: {OUTCOME_WORDS[outcome]} {why}{where}"
            )
        if len(not_passed) > 20:
            lines.append(f"  ... and {len(not_passed) - 20} more (see index.jsonl)")
    return lines


def row_lines(doc: dict[str, Any]) -> list[str]:
    """pass^k, and rows by class over their attempts (``osmosis_metrics.json``), for n >= 2."""
    from pytest_osmosis.core.outcome import ROW_FAILED, ROW_FLAKY, ROW_PASSED
    from pytest_osmosis.core.words import percent

    lines = []
    points = doc.get("pass_hat_k")
    if points:
        lines.append(
            "pass^k     " + "  ".join(f"pass^{p['k']} {percent(p['value'])}" for p in points)
        )
    classes = doc.get("rows") or {}
    if points or doc.get("row_pass"):
        flaky = doc.get("flaky_rows") or []
        # Rows whose every attempt was skipped have no class; named so no row goes missing.
        skipped = doc.get("skipped_rows") or []
        lines.append(
            f"rows       {classes.get(ROW_PASSED, 0)} passed every attempt, "
            f"{classes.get(ROW_FLAKY, 0)} flaky{_rows_named(flaky)}"
            f", {classes.get(ROW_FAILED, 0)} passed none"
            + (f", {len(skipped)} skipped{_rows_named(skipped)}" if skipped else "")
        )
    row_pass = doc.get("row_pass")
    if row_pass:
        lines.append(
            f"row pass   {row_pass['k']}/{row_pass['n']}: {row_pass['passed']} rows pass, "
            f"{row_pass['failed']} do not"
        )
    return lines


def _rows_named(rows: list[int]) -> str:
    """`` (row 2)`` / `` (rows 2, 5 ...)``: the dataset rows a count is made of (first ten)."""
    if not rows:
        return ""
    shown = ", ".join(str(row) for row in rows[:10]) + (" ..." if len(rows) > 10 else "")
    return f" (row{'s' if len(rows) > 1 else ''} {shown})"
