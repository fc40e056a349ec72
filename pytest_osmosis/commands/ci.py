"""``pytest-osmosis merge`` and ``pytest-osmosis gate``: the CI matrix's last job.

``merge`` joins the run directories of ``--osmosis-shard K/N`` jobs into one completed run
(results/merge.py); ``gate`` applies the session's gate rules (gate.py, the same
``judge_runs``) to any finished run and, under GitHub Actions, writes the step summary and
the annotations a session would (github.py). Both are subcommands of the ``pytest-osmosis``
command line (cli.py finds them by their ``add_*_parser``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from pytest_osmosis.core.errors import ConfigError, RunDirectoryError

EXIT_OK, EXIT_FAILED = 0, 1


# -- merge ------------------------------------------------------------------------------


def add_merge_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "merge",
        help="join the run directories of --osmosis-shard jobs into one run",
        allow_abbrev=False,
        description="Write one completed-run directory (journal, trials, trajectories, "
        "index, metrics) from the run directories of every shard of a run "
        "(pytest --osmosis-shard K/N), as if one session had run them all.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a shard's run directory")
    parser.add_argument(
        "--output", required=True, metavar="DIR", help="root to write the merged run under"
    )
    parser.add_argument(
        "--name",
        metavar="NAME",
        help="the merged run's name (default: the shards' name without -shard-K-of-N)",
    )
    parser.set_defaults(handler=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    from pytest_osmosis.results.merge import merge_shards

    if args.name is not None:
        from pytest_osmosis.results.manifest import validate_run_name

        validate_run_name(args.name)
    merged = merge_shards([Path(run) for run in args.runs], Path(args.output), args.name)
    sys.stdout.write(f"{merged}\n")
    return EXIT_OK


# -- upload -----------------------------------------------------------------------------


def add_upload_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "upload",
        help="hand a finished run to the SDK's osmosis eval upload",
        allow_abbrev=False,
        description="Upload a finished run with the Osmosis SDK's own `osmosis eval upload` "
        "(run from the current directory, the workspace's Git checkout); a run that is not "
        "finished is refused.",
    )
    parser.add_argument("run", metavar="NAME|PATH", help="run name under the root, or its path")
    parser.add_argument(
        "--output",
        metavar="ROOT",
        help="root of run directories (default: .osmosis/evals of the nearest workspace)",
    )
    parser.set_defaults(handler=cmd_upload)


def cmd_upload(args: argparse.Namespace) -> int:
    from pytest_osmosis.results.runs import resolve_run
    from pytest_osmosis.results.upload import upload_run

    root = Path(args.output).expanduser().resolve() if args.output else None
    result = upload_run(resolve_run(args.run, root), Path.cwd())
    (sys.stdout if result.uploaded else sys.stderr).write(result.line + "\n")
    return EXIT_OK if result.uploaded else EXIT_FAILED


# -- gate -------------------------------------------------------------------------------


def add_gate_parser(subparsers: Any) -> None:
    from pytest_osmosis.gate import BUDGETS, RULES

    parser = subparsers.add_parser(
        "gate",
        help="apply the gate rules to a finished run (exit 0 passed, 1 failed)",
        allow_abbrev=False,
        description="Apply every gate rule given to a finished run, with the same code as "
        "pytest --osmosis-eval's gate; under GitHub Actions also append the step summary and "
        "print the annotations a session would.",
    )
    parser.add_argument("run", metavar="NAME|PATH", help="run name under the root, or its path")
    parser.add_argument(
        "--output",
        metavar="ROOT",
        help="root of run directories (default: .osmosis/evals of the nearest workspace)",
    )
    parser.add_argument(
        "--osmosis-github",
        dest="github",
        default="auto",
        metavar="auto|off",
        help="auto (default): under GitHub Actions write the step summary and annotations",
    )
    for rule in RULES:
        if rule.dest not in BUDGETS:  # budgets stop a session while it runs: nothing to judge
            # argparse %-formats help; a rule's help is plain text (95% Wilson...).
            help_text = rule.help.replace("%", "%%")
            parser.add_argument(rule.flag, dest=rule.dest, metavar=rule.metavar, help=help_text)
    parser.set_defaults(handler=cmd_gate)


def cmd_gate(args: argparse.Namespace) -> int:
    from pytest_osmosis.baseline import CurrentRun
    from pytest_osmosis.gate import (
        GateOptionError,
        GateRun,
        check_runs,
        gate_options,
        judge_runs,
    )
    from pytest_osmosis.results import read_journal
    from pytest_osmosis.results.run_reader import load_run
    from pytest_osmosis.results.runs import resolve_run

    root = Path(args.output).expanduser().resolve() if args.output else None
    run_dir = resolve_run(args.run, root)
    run = load_run(run_dir)
    metrics = run.get("metrics") or {}
    status = (metrics.get("eval_run") or {}).get("status")
    if status != "finished":
        raise RunDirectoryError(
            f"{run_dir}: not finished (metrics.json status {status!r}); a gate judges a "
            "finished run"
        )
    inputs = run["manifest"].get("inputs") or {}
    name = run_dir.name
    try:
        options = gate_options(lambda dest: getattr(args, dest, None))
        if not options.active:
            raise GateOptionError("no gate rule given (e.g. --osmosis-min-pass-rate 0.8)")
        threshold = float((metrics.get("summary") or {}).get("pass_threshold", 1.0))
        check_runs(options, [CurrentRun(name, run_dir, inputs, threshold, None)])
    except GateOptionError as exc:
        raise ConfigError(str(exc)) from None
    records = list(read_journal(run_dir).values())
    verdict = judge_runs(options, [GateRun(name, metrics, records, threshold, run_dir)])
    word = "PASSED" if verdict.passed else "FAILED"
    sys.stdout.write(f"osmosis gate {word}\n" + "".join(f"{r}\n" for r in verdict.reasons))
    from pytest_osmosis.plugin.github import active

    if active(str(args.github).strip().lower()):
        _github(run, run_dir, metrics, records, threshold, verdict.as_dict())
    return EXIT_OK if verdict.passed else EXIT_FAILED


def _github(
    run: dict[str, Any],
    run_dir: Path,
    metrics: dict[str, Any],
    records: list[dict[str, Any]],
    threshold: float,
    verdict: dict[str, Any],
) -> None:
    """The step summary and annotations a session writes, from the run directory alone."""
    from pytest_osmosis.plugin.github import annotation_lines, gate_section, not_passed, run_section
    from pytest_osmosis.plugin.session import ControllerRun

    recorded = cast(ControllerRun, _recorded_run(run, run_dir, metrics, records, threshold))
    text = run_section(recorded, {}) + gate_section(verdict)
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        try:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            sys.stderr.write(f"osmosis: cannot write the GitHub step summary {path}: {exc}\n")
    base = Path(os.environ.get("GITHUB_WORKSPACE") or Path.cwd())
    for line in annotation_lines(not_passed(recorded, {}), base):
        sys.stdout.write(line + "\n")


class _RecordedDataset:
    """What the GitHub surfaces ask of a plan's dataset, from the run's own records."""

    def __init__(self, run: dict[str, Any], records: list[dict[str, Any]]) -> None:
        from pytest_osmosis.results.runs import find_dataset

        self.sources = {r["row_index"]: r.get("source_row_index", r["row_index"]) for r in records}
        found = find_dataset(run)
        self.path = found or Path(
            str((run.get("metrics") or {}).get("eval_run", {}).get("dataset_name", "dataset"))
        )
        self._opened: Any = None
        if found is not None:
            from pytest_osmosis.dataset import open_dataset

            selector = (run["manifest"].get("inputs") or {}).get("dataset", {})
            try:
                self._opened = open_dataset(
                    found,
                    limit=None,
                    rows=selector.get("selected_source_rows"),
                    sample=None,
                    seed=0,
                )
            except Exception:  # noqa: BLE001 - lines are a nicety; annotate without them
                self._opened = None

    def source_row_index(self, row_index: int) -> int:
        return int(self.sources.get(row_index, row_index))

    def line(self, row_index: int) -> int | None:
        return self._opened.line(row_index) if self._opened is not None else None


def _recorded_run(
    run: dict[str, Any],
    run_dir: Path,
    metrics: dict[str, Any],
    records: list[dict[str, Any]],
    threshold: float,
) -> SimpleNamespace:
    """A finished run shaped as github.py reads a session's run (plan, records, metrics)."""
    plan = SimpleNamespace(
        run_name=run_dir.name,
        config_path=run_dir,
        run_dir=run_dir,
        dataset=_RecordedDataset(run, records),
        settings=SimpleNamespace(pass_threshold=threshold),
    )
    rundir = SimpleNamespace(records={(r["row_index"], r["run_index"]): r for r in records})
    return SimpleNamespace(plan=plan, rundir=rundir, metrics=metrics)
