"""``--osmosis-regrade RUN``: grade a finished run's recorded samples again, as pytest items.

The session is an ordinary one (items, journal, new run directory, results table, gate)
with two differences: its plan takes the rows, attempts and model from the run it
regrades, and an item grades the attempt's recorded sample with the current grader
instead of running the workflow (:func:`kept_result`, :func:`regrade_steps`: the session
hands them to the runner's own grader step). Reading the old run is
``results/source_run.py``; this module adapts it to the session: which config the run
belongs to (:func:`choose_regrade`), what xdist workers are told (:func:`worker_input`,
:func:`take_worker_input`), one item's regrade, and the ``pytest-osmosis regrade``
command.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_osmosis.results.source_run import (
    TAKEN_FROM_RUN,
    RecordedSample,
    RegradeError,
    SourceRun,
    config_problem,
    open_source_run,
    workspace_config,
)

if TYPE_CHECKING:
    import pytest

    from pytest_osmosis.execution.runner import TrajectoryWriter
    from pytest_osmosis.plugin.collect import EvalItem
    from pytest_osmosis.plugin.session import EvalSession


def choose_regrade(session: EvalSession, config: pytest.Config, configs: list[Path]) -> list[Path]:
    """Controller: open the run to regrade and return the one config it was made from.

    Raises :class:`RegradeError` in one line: a selection option given with it, the run
    not found or not finished, no config of this session made it.
    """
    ref = session.options.regrade or ""
    for name in TAKEN_FROM_RUN:
        given = session.options.overrides.get(name)
        if given is not None and not given[1].startswith("ini "):
            raise RegradeError(
                f"{given[1]}: a regrade grades the rows, attempts and model of the run it "
                "regrades; leave it out"
            )
    source = open_source_run(ref, session.options.output, config.invocation_params.dir)
    chosen = _config_of(source, configs, named=not session.collect_all)
    session.regrade = source
    session.regrade_config = chosen
    return [chosen]


def _config_of(source: SourceRun, configs: list[Path], *, named: bool) -> Path:
    def relative(path: Path) -> str:
        return path.relative_to(path.parent.parent.parent).as_posix()

    if source.config_path is None:
        if len(configs) == 1:
            return configs[0]
        raise RegradeError(
            f"--osmosis-regrade: run {source.name!r} does not say which config made it; "
            "name the config: pytest configs/eval/<name>.toml --osmosis-regrade "
            f"{source.name}"
        )
    matches = [path for path in configs if relative(path) == source.config_path]
    if not matches:
        if named and configs:
            raise RegradeError(
                f"--osmosis-regrade: {config_problem(source, relative(configs[0]))}; "
                "name that config, or leave the configs out"
            )
        raise RegradeError(
            f"--osmosis-regrade: run {source.name!r} was made from {source.config_path}, "
            "which this session does not collect (run pytest in that workspace)"
        )
    # Several workspaces with the same layout: the one the run directory lives in.
    inside = [p for p in matches if source.path.is_relative_to(p.parent.parent.parent)]
    return (inside or matches)[0]


def worker_input(session: EvalSession) -> list[str] | None:
    """What an xdist worker needs to regrade: the run's directory and the config."""
    if session.regrade is None or session.regrade_config is None:
        return None
    return [str(session.regrade.path), str(session.regrade_config)]


def take_worker_input(session: EvalSession, value: list[str]) -> None:
    """Worker: open the same run (read-only) the controller chose."""
    path, config_path = value
    session.regrade = open_source_run(path, None, Path(path))
    session.regrade_config = Path(config_path)


def kept_result(source: SourceRun, item: EvalItem) -> dict[str, Any] | None:
    """The result of an attempt whose workflow failed: its recorded failure, kept (and its
    artifacts copied). None when the attempt has a sample to grade again."""
    from pytest_osmosis.core.outcome import RowResult
    from pytest_osmosis.results import prepare_trial_dir

    kept = source.kept(item.key)
    if kept is None:
        return None
    run_dir = item.parent.plan.run_dir
    rollout_id = str(kept["rollout_id"])
    result = RowResult(
        row_index=item.row_index,
        run_index=item.run_index,
        source_row_index=item.source_row_index,
        rollout_id=rollout_id,
        status="failed",
        pass_threshold=item.parent.plan.settings.pass_threshold,
        tokens=kept.get("tokens"),
        duration_ms=float(kept.get("duration_ms") or 0.0),
        error_type=kept.get("error_type") or "rollout_failed",
        message=str(kept["message"]),
        extra={"has_trajectory": False, "trajectory_problem": None, "rate_limited": 0},
    ).as_dict()
    try:
        source.copy_trial(rollout_id, run_dir)
        prepare_trial_dir(run_dir, rollout_id)
    except OSError as exc:  # a full disk: the controller stops, this row stays pending
        result["storage_fault"] = f"cannot copy the artifacts of {rollout_id}: {exc}"
    return result


def regrade_steps(
    source: SourceRun, item: EvalItem, redactor: Any, storage_faults: list[str]
) -> tuple[RecordedSample, Callable[[str], Path | None], TrajectoryWriter]:
    """What the runner needs to grade the attempt's recorded sample instead of running the
    workflow: the sample, its trial directory (the old artifacts copied in) and a writer of
    the recorded trajectory with the new reward."""
    from pytest_osmosis.results import prepare_trial_dir, write_trajectory
    from pytest_osmosis.results.redact import redact_trajectory
    from pytest_osmosis.results.source_run import regraded_trajectory

    recorded = source.recorded(item.key)
    if recorded is None:  # the run is complete, so only a hand edit gets here
        raise RegradeError(f"run {source.name!r} has no record of {item.nodeid}")
    run_dir = item.parent.plan.run_dir

    def prepare(rollout_id: str) -> Path | None:
        try:
            source.copy_trial(rollout_id, run_dir)
        except OSError as exc:
            storage_faults.append(f"cannot copy the artifacts of {rollout_id}: {exc}")
        return prepare_trial_dir(run_dir, rollout_id)

    def save_trajectory(rollout_id: str, sample: Any, work: Any, step_usage: Any = None) -> bool:
        """The recorded trajectory with the new reward (its steps are the recorded ones)."""
        trial_dir = run_dir / "rollout_trials" / rollout_id
        document = regraded_trajectory(recorded.document, sample.reward)
        try:
            write_trajectory(trial_dir, redact_trajectory(document, redactor))
        except OSError as exc:
            storage_faults.append(f"cannot write a trajectory in {trial_dir}: {exc}")
            return False
        return True

    return recorded, prepare, save_trajectory


# ----------------------------------------------------------------------------- the command


def add_regrade_parser(subparsers: Any) -> None:
    """``pytest-osmosis regrade RUN [--rollout-dir DIR] [-- PYTEST ARGS]`` (cli.EXTENSIONS).

    What follows ``--`` goes to pytest untouched: ``cli.main`` hands it over as
    ``args.pytest_args`` (argparse itself drops a ``--`` that follows a positional).
    """
    parser = subparsers.add_parser(
        "regrade",
        help="grade a finished run's recorded samples again with the current grader",
        allow_abbrev=False,
        usage="%(prog)s NAME|PATH [--rollout-dir DIR] [--output ROOT] [-- PYTEST ARGS]",
        description="Run pytest with --osmosis-regrade RUN on the config the run was made "
        "from: only the grader runs, over the run's recorded samples, into a new run "
        "directory. Exits with pytest's status.",
        epilog="Arguments after -- go to pytest, e.g. -- -n 2 --osmosis-name regraded",
    )
    parser.add_argument(
        "run", metavar="NAME|PATH", help="run name under the root, or its directory"
    )
    parser.add_argument(
        "--rollout-dir",
        metavar="DIR",
        help="take the workflow and grader from DIR instead of the workspace's "
        "rollouts/<rollout> (--osmosis-rollout-dir)",
    )
    parser.add_argument(
        "--output",
        metavar="ROOT",
        help="root of run directories (default: .osmosis/evals of the nearest workspace)",
    )
    parser.set_defaults(handler=run_regrade_command, pytest_args=[])


def run_regrade_command(args: argparse.Namespace) -> int:
    """Find the run and its config, then pytest in this process; pytest's exit status."""
    import pytest

    root = Path(args.output).expanduser().resolve() if args.output else None
    source = open_source_run(args.run, root, Path.cwd())
    config = workspace_config(source)
    argv = [str(config)] if config is not None else []
    argv += ["--osmosis-regrade", str(source.path)]
    if args.rollout_dir:
        argv += ["--osmosis-rollout-dir", str(Path(args.rollout_dir).expanduser().resolve())]
    if root is not None:
        argv += ["--osmosis-output", str(root)]
    return int(pytest.main([*argv, *args.pytest_args]))
