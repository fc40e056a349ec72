"""What a session says around its rows: what it is about to run, and what to do next.

``osmosis eval run`` prints a box of what will run before it starts, and the resume, retry
and upload commands after. Before the first row we print one compact block (one line
under ``-q``): configs, rows x attempts, model, rows in flight, how the run starts and
where it goes. After the results table: the commands that resume or retry the run, open
its report, compare it with the previous run of the same rollout and dataset, and upload
it. After Ctrl-C: that running the same command again resumes, and how much is kept.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_osmosis.plugin.session import ControllerRun, EvalSession

#: Flags that change what a run does once: never part of the command that resumes it.
_ONCE = ("--osmosis-fresh", "--osmosis-retry-failed", "--osmosis-retry-below-threshold")
#: pytest's selections: a command that deselects some of a run's items can never finish it,
#: so the command that resumes the run leaves them out (flags alone, then flags with a value).
_SELECTING = ("--lf", "--last-failed", "--sw", "--stepwise", "--sw-skip", "--stepwise-skip")
_SELECTING_VALUE = ("-k", "-m", "--deselect")
#: What ``_units`` falls back on where pytest's parser is laid out differently: options
#: of pytest and its usual plugins whose value is the next argument. Ours are added from
#: options.py.
_PYTEST_VALUED = frozenset(
    (
        *_SELECTING_VALUE,
        *("-p", "-c", "--config-file", "-o", "--override-ini", "-W", "--pythonwarnings"),
        *("--rootdir", "--basetemp", "--confcutdir", "--ignore", "--ignore-glob"),
        *("--maxfail", "--durations", "--durations-min", "--tb", "-r", "--capture"),
        *("--import-mode", "--color", "--show-capture", "--junitxml", "--junit-xml"),
        *("--log-level", "--log-cli-level", "--log-file", "--log-file-level", "--log-format"),
        *("--log-date-format", "--log-cli-format", "--log-file-format", "--log-disable"),
        *("-n", "--numprocesses", "--dist", "--tx", "--maxprocesses", "--max-worker-restart"),
        *("--timeout", "--timeout-method", "--reruns", "--reruns-delay", "--html"),
    )
)
#: argparse actions that take no value.
_NO_VALUE = frozenset(
    ("store_true", "store_false", "store_const", "append_const", "count", "help", "version")
)


def _valued(config: pytest.Config) -> dict[str, str | int | None]:
    """Every option registered with pytest (its own, every plugin's, a conftest's) that
    takes a value as the next argument -> its ``nargs``: pytest's parser is the one owner
    of how its arguments read (``--cov-config FILE``, a conftest's ``--data DIR``)."""
    parser = getattr(config, "_parser", None)
    groups = getattr(parser, "_groups", None)
    if not isinstance(groups, list):
        from pytest_osmosis.plugin.options import value_flags

        return dict.fromkeys(_PYTEST_VALUED | value_flags())
    found: dict[str, str | int | None] = {}
    for group in [*groups, getattr(parser, "_anonymous", None)]:
        for option in getattr(group, "options", ()):
            attrs = option.attrs()  # pytest 8: addoption's keywords; 9: the argparse Action's
            action = attrs.get("action")
            if (action is None or isinstance(action, str)) and action not in _NO_VALUE:
                if attrs.get("nargs") != 0:
                    found.update(dict.fromkeys(option.names(), attrs.get("nargs")))
    return found


def _units(args: list[str], config: pytest.Config) -> list[list[str]]:
    """``args`` as pytest reads them: an option with its value as one unit (``-W X``), any
    other argument alone; after ``--`` each argument is a path."""
    valued = _valued(config)
    units: list[list[str]] = []
    position = 0
    while position < len(args):
        arg = args[position]
        if arg == "--":
            units += [[arg], *([rest] for rest in args[position + 1 :])]
            break
        takes = arg in valued and position + 1 < len(args)
        if takes and valued[arg] == "?":  # an optional value: argparse takes a non-option
            takes = not args[position + 1].startswith("-")
        if takes:
            units.append(args[position : position + 2])
            position += 2
        else:
            units.append([arg])
            position += 1
    return units


def _is_path(unit: list[str]) -> bool:
    """A test path or node id, not an option or an option's value."""
    return len(unit) == 1 and not unit[0].startswith("-")


def _without_selection(args: list[str], config: pytest.Config) -> list[str]:
    """``args`` minus pytest's item selections (``--lf``, ``-k``, ``-m``, ``--deselect``,
    node ids): what resumes a run runs all of its pending items."""
    kept: list[str] = []
    for unit in _units(args, config):
        first = unit[0]
        if first in _SELECTING or first in _SELECTING_VALUE or (_is_path(unit) and "::" in first):
            continue
        if first.startswith("--deselect=") or first[:2] in _SELECTING_VALUE:
            continue  # --deselect=ID, -kEXPR, -mEXPR
        kept += unit
    return kept


def _shown(path: Path, base: Path) -> str:
    return str(path.relative_to(base)) if path.is_relative_to(base) else str(path)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _retried(run: ControllerRun) -> int:
    """Recorded attempts this session runs again (``--osmosis-retry-*``), before it runs them."""
    return len(run.rundir.pending(run.rundir.records))


def run_state(session: EvalSession, run: ControllerRun) -> str:
    """How the run starts: new, resumed (with what it keeps) or retried."""
    total = run.plan.total_items
    if run.created:
        return "new run"
    recorded = len(run.rundir.records)
    retried = _retried(run)
    if retried:
        what = "errored, skipped or below threshold"
        if not session.options.retry_below_threshold:
            what = "errored or skipped"
        return f"resumes: {recorded} of {total} recorded, retries {retried} {what}"
    return f"resumes: {recorded} of {total} recorded"


def _execution(session: EvalSession, config: pytest.Config) -> str:
    """Where rows run: this process or xdist's workers, and rollouts served apart
    (``--osmosis-execution server``, execution/dispatch.py)."""
    from pytest_osmosis.execution.dispatch import SERVER
    from pytest_osmosis.plugin.xdist import worker_count

    workers = worker_count(config)
    where = "in this process"
    if workers and config.pluginmanager.has_plugin("dsession"):
        where = f"on {_plural(workers, 'xdist worker')}"
    runs = session.runs.values()
    served = [run for run in runs if session.rollouts.load(run.plan).mode == SERVER]
    return f"{where}, rollouts in servers of their own" if served else where


#: What the block before the first row starts each line with (``osmosis: `` starts the
#: progress lines of a log, ``osmosis plan:`` the plan's).
START = "osmosis run:"


def start_lines(session: EvalSession, config: pytest.Config) -> list[str]:
    """The block before the first row (written when start-up succeeded, before pytest's
    header); one line under ``-q``. Work items are those pending before ``-k`` or
    ``--deselect`` choose among them."""
    from pytest_osmosis.workspace.plan import other_named_run

    runs = list(session.runs.values())
    if not runs or config.option.collectonly:
        return []
    base = config.invocation_params.dir
    pending = sum(run.pending_at_start for run in runs)
    several = len(runs) > 1
    output = (
        _shown(runs[0].plan.run_dir, base)
        if not several
        else ", ".join(sorted({_shown(run.plan.output_root, base) for run in runs}))
    )
    flight = (
        f"{session.total_concurrency()} in flight, {_execution(session, config)}"
        if pending
        else "nothing runs"  # a finished run: no rows in flight, whatever -n says
    )
    configs: list[tuple[str, str]] = []
    notes = []
    for run in runs:
        plan = run.plan
        configs.append(
            (
                f"{_shown(plan.config_path, base)} -> {plan.run_name} ({run_state(session, run)})",
                f"{_plural(len(plan.dataset), 'row')} x {_plural(plan.settings.n, 'attempt')}, "
                f"model {plan.settings.model_path}",
            )
        )
        note = other_named_run(plan, session.options.name, several)
        if note:
            notes.append(f"{START} note: {plan.run_name}: {note}")
        why = nothing_retried(session, run) if run.pending_at_start else None  # else the table
        if why:
            notes.append(f"{START} note: {why}")
    items = f"{_plural(pending, 'work item')} pending"
    if config.get_verbosity() < 0:
        each = "; ".join(f"{where}: {what}" for where, what in configs)
        return [f"{START} {items} ({each}), {flight}; output {output}", *notes]
    return [
        *(f"{START} {line}" for pair in configs for line in pair),
        f"{START} {items}, {flight}",
        f"{START} output {output}",
        *notes,
    ]


def nothing_retried(session: EvalSession, run: ControllerRun) -> str | None:
    """Why ``--osmosis-retry-failed`` selects nothing in this run, or None when it does
    (or was not given)."""
    from pytest_osmosis.core.outcome import BELOW_THRESHOLD, classify

    if not session.options.retry_failed or _retried(run):
        return None
    flag = (
        "--osmosis-retry-below-threshold"
        if session.options.retry_below_threshold
        else "--osmosis-retry-failed"
    )
    if run.created:
        return f"{flag}: run {run.plan.run_name} is new, so nothing is recorded to retry" + (
            "" if session.options.name else " (a run without --osmosis-name is new every session)"
        )
    if session.options.retry_below_threshold:
        return f"{flag}: run {run.plan.run_name} has no errored, skipped or below-threshold attempt"
    threshold = run.plan.settings.pass_threshold
    below = sum(
        classify(record, threshold) == BELOW_THRESHOLD for record in run.rundir.records.values()
    )
    kept = (
        f"; its {below} below-threshold attempt{'s are' if below != 1 else ' is'} kept "
        "(--osmosis-retry-below-threshold re-runs them)"
        if below
        else ""
    )
    return f"{flag}: run {run.plan.run_name} has no errored or skipped attempt{kept}"


# -- after the table --------------------------------------------------------------------


def _command(session: EvalSession, run: ControllerRun, *extra: str) -> str:
    """The session's own command, written to reach this run again: its options (minus the
    one-off flags and pytest's selections), ``--osmosis-name`` when the run's name was
    generated, and this run's config only when the command alone would not reach it (it
    ran several configs, or node ids chose the config and are left out)."""
    from pytest_osmosis.plugin.options import joined_option_values

    config = session.config
    params = config.invocation_params
    given = [arg for arg in params.args if arg not in _ONCE]
    args = _without_selection(given, config)
    one = len(session.runs) == 1
    if args != given or not (session.options.name and one):  # else: the same command
        # (a value of ours that names a directory made since would read as a test path)
        args = joined_option_values(args, params.dir, even_if_read_right=True) or args
    if one and not any("::" in arg for arg in given):
        # The command as typed finds this config alone again: add only the name it lacks.
        named = [] if session.options.name else [f"--osmosis-name={run.plan.run_name}"]
        return shlex.join(["pytest", *args, *named, *extra])
    args = [
        arg
        for unit in _units(args, config)
        if not unit[0].startswith("--osmosis-name")
        and not (_is_path(unit) and (params.dir / unit[0].split("::", 1)[0]).exists())
        for arg in unit
    ]
    args += [_shown(run.plan.config_path, params.dir), f"--osmosis-name={run.plan.run_name}"]
    return shlex.join(["pytest", *args, *extra])


def _run_ref(run: ControllerRun, base: Path) -> str:
    """How ``pytest-osmosis`` names the run from here: its name under the output root it
    finds by itself, else its directory."""
    from pytest_osmosis.results.runs import find_output_root

    if find_output_root(base).resolve() == run.plan.output_root.resolve():
        return run.plan.run_name
    return _shown(run.plan.run_dir, base)


def previous_run(run: ControllerRun) -> Path | None:
    """The newest other run of the same rollout and dataset under the run's output root."""
    from pytest_osmosis.core.errors import OsmosisError
    from pytest_osmosis.results.run_views import run_list_item
    from pytest_osmosis.results.runs import list_runs

    try:
        items = [run_list_item(each) for each in list_runs(run.plan.output_root)]
    except OsmosisError:
        return None
    experiment = run.plan.config.experiment
    for item in items:
        path = Path(str(item["path"]))
        same = item["rollout"] == experiment.rollout and item["dataset"] == experiment.dataset
        if same and path.resolve() != run.plan.run_dir.resolve():
            return path
    return None


def next_lines(session: EvalSession, interrupted: bool) -> list[str]:
    """What to do next, per run: resume or retry, the report, a comparison, the upload."""
    from pytest_osmosis.core.outcome import BELOW_THRESHOLD, FAILED, SKIPPED, classify

    base = session.config.invocation_params.dir
    lines: list[str] = []
    for run in session.runs.values():
        if not run.metrics or run.storage_fault is not None:
            continue
        plan = run.plan
        prefix = f"{plan.run_name}: " if len(session.runs) > 1 else ""
        total = plan.total_items
        recorded = run.rundir.kept()  # sealed at the session's end: what the journal holds
        status = run.metrics.get("eval_run", {}).get("status")
        if interrupted or status != "finished":
            command = _command(session, run)
            lines.append(f"{prefix}resume   {command}  ({recorded} of {total} recorded)")
        counts = {FAILED: 0, SKIPPED: 0, BELOW_THRESHOLD: 0}
        for record in run.rundir.records.values():
            outcome = classify(record, plan.settings.pass_threshold)
            if outcome in counts:
                counts[outcome] += 1
        if counts[FAILED] or counts[SKIPPED]:
            lines.append(
                f"{prefix}retry    {_command(session, run, '--osmosis-retry-failed')}  "
                f"({counts[FAILED]} errored, {counts[SKIPPED]} skipped)"
            )
        if counts[BELOW_THRESHOLD]:
            flag = "--osmosis-retry-below-threshold"
            lines.append(
                f"{prefix}retry    {_command(session, run, flag)}  "
                f"({counts[BELOW_THRESHOLD]} below threshold, errored and skipped too)"
            )
        ref = _run_ref(run, base)
        if run.report_path is not None:
            lines.append(f"{prefix}report   {run.report_path}")
        else:
            lines.append(f"{prefix}report   pytest-osmosis report {shlex.quote(ref)}")
        previous = previous_run(run)
        if previous is not None:
            other = previous.name if ref == plan.run_name else _shown(previous, base)
            lines.append(
                f"{prefix}compare  pytest-osmosis compare {shlex.quote(ref)} {shlex.quote(other)}"
            )
        if status == "finished" and not interrupted:
            lines.append(
                f"{prefix}upload   osmosis eval upload {shlex.quote(_shown(plan.run_dir, base))}"
            )
    return lines


def write_next_steps(terminal: Any, session: EvalSession, exitstatus: int) -> None:
    """The block after the results table (and after Ctrl-C, the line that says how to
    resume)."""
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    # A collection error interrupts too, but running the same command again fails the same.
    broken = any(isinstance(r, pytest.CollectReport) for r in terminal.stats.get("error", []))
    lines = next_lines(session, interrupted)
    if not lines:
        return
    terminal.write_sep("-", "osmosis: next")
    for line in lines:
        terminal.write_line(line)
    if interrupted and not broken:
        recorded = session.kept()
        total = sum(run.plan.total_items for run in session.runs.values())
        again = (
            "run the same command again to resume"
            if session.options.name and len(session.runs) == 1
            else "run the resume command above to resume (this run's name was generated)"
            if len(session.runs) == 1
            else "run the resume commands above to resume"
        )
        terminal.write_line(f"osmosis: stopped early: {again} ({recorded} of {total} recorded)")
