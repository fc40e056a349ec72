"""A baseline run for the regression gate: whole, comparable, and its rows known by content.

A baseline decides a merge, so it is refused (one line, exit 4) when it cannot be trusted:
it did not finish or its journal does not cover its selection, its ``metrics.json``
disagrees with its journal, its ``pass_threshold`` means something else by "passed"
(unless ``--osmosis-baseline-allow pass_threshold``), it made another number of attempts
per row, or no row is common to both runs. What may differ on purpose (the model, the
rollout's code, settings, the dataset's other rows) is listed in the verdict.

Rows are matched by content (:func:`pytest_osmosis.dataset.rows.row_digest`): a session
records its rows' digests (results/row_digests.py); a run without them (the SDK's) is
read through its dataset file, found by the sha256 its manifest records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_osmosis.core.errors import OsmosisError, RunDirectoryError

if TYPE_CHECKING:
    from pytest_osmosis.dataset.selected import SelectedDataset

#: ``--osmosis-baseline-allow`` values: differences a user accepts on purpose.
ALLOWABLE = ("pass_threshold",)
#: ``metrics.json`` summary keys that must equal the journal's recount.
_COUNTED = ("total_samples", "completed_samples", "passed", "failed", "graded")


class BaselineError(ValueError):
    """The baseline cannot be compared; the message is the one line the user sees."""


@dataclass(frozen=True)
class RowMatch:
    """Two runs' rows paired by content (dataset rows; current first)."""

    pairs: list[tuple[int, int]] = field(default_factory=list)
    added: list[int] = field(default_factory=list)  # current rows no baseline row matches
    removed: list[int] = field(default_factory=list)  # baseline rows no current row matches
    changed: list[int] = field(default_factory=list)  # same dataset row, other content

    def text(self) -> str:
        """``27 rows compared by content; 3 added (rows 30, 31, 32), 1 changed (row 5)``."""
        parts = [f"{len(self.pairs)} rows compared by content (prompt, label, metadata)"]
        for what, rows in (("added", self.added), ("removed", self.removed)):
            if rows:
                parts.append(f"{len(rows)} {what} ({_rows_text(rows)})")
        if self.changed:
            parts.append(f"{len(self.changed)} changed ({_rows_text(self.changed)})")
        return "; ".join(parts)


def _rows_text(rows: list[int], limit: int = 10) -> str:
    shown = ", ".join(str(row) for row in rows[:limit])
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return f"row{'s' if len(rows) > 1 else ''} {shown}{more}"


def match_rows(current: Mapping[int, str], baseline: Mapping[int, str]) -> RowMatch:
    """Pair dataset rows whose digests are equal (the k-th copy of a duplicated row with the
    k-th); a dataset row left on both sides with other content is ``changed``."""
    by_digest: dict[str, tuple[list[int], list[int]]] = {}
    for side, digests in ((0, current), (1, baseline)):
        for row, digest in sorted(digests.items()):
            by_digest.setdefault(digest, ([], []))[side].append(row)
    pairs: list[tuple[int, int]] = []
    left_current: set[int] = set()
    left_baseline: set[int] = set()
    for mine, theirs in by_digest.values():
        pairs += zip(mine, theirs, strict=False)
        left_current.update(mine[len(theirs) :])
        left_baseline.update(theirs[len(mine) :])
    changed = left_current & left_baseline
    return RowMatch(
        pairs=sorted(pairs),
        added=sorted(left_current - changed),
        removed=sorted(left_baseline - changed),
        changed=sorted(changed),
    )


def run_row_digests(run: Mapping[str, Any], hints: tuple[Path, ...] = ()) -> dict[int, str] | None:
    """Dataset row -> content digest of a loaded run (``results.run_reader.load_run``).

    From the digests a session recorded, else from the run's dataset file (the one whose
    bytes its manifest's sha256 names; *hints* first); None when neither is there.
    """
    from pytest_osmosis.results.row_digests import read_row_digests

    recorded = read_row_digests(Path(run["path"])) if run.get("path") else None
    if recorded is not None:
        return recorded
    from pytest_osmosis.dataset import open_dataset
    from pytest_osmosis.results.runs import find_dataset

    path = find_dataset(run, hints)
    dataset = run.get("manifest", {}).get("inputs", {}).get("dataset") or {}
    selector = dataset.get("selected_source_rows") if isinstance(dataset, dict) else None
    if path is None or not isinstance(selector, str):
        return None
    try:
        selected = open_dataset(path, limit=None, rows=selector, sample=None, seed=0)
    except OsmosisError:
        return None
    return selected.row_digests()


@dataclass(frozen=True)
class CurrentRun:
    """What the gate knows of a run before its first row."""

    name: str
    run_dir: Path
    inputs: Mapping[str, Any]  # its manifest's
    pass_threshold: float
    #: Its selected rows (a session's); None for a finished run, whose recorded digests count.
    dataset: SelectedDataset | None


@dataclass(frozen=True)
class Baseline:
    """A baseline run that may be compared with a current one."""

    run: dict[str, Any]  # ``load_run(..., journal=True)``: rows and summary from its journal
    digests: dict[int, str]
    current_digests: dict[int, str]  # the current run's selected rows
    match: RowMatch
    #: What differs from the current run and is compared anyway (listed in the verdict).
    differences: list[str]


def open_baseline(ref: str, current: CurrentRun, allow: frozenset[str] = frozenset()) -> Baseline:
    """The baseline *ref* (a run name or directory) for *current*, or a one-line refusal."""
    from pytest_osmosis.results.run_reader import load_run
    from pytest_osmosis.results.runs import resolve_run

    where = f"--osmosis-baseline {ref}"
    try:
        found = resolve_run(ref, current.run_dir.parent)
    except RunDirectoryError as exc:
        raise BaselineError(f"--osmosis-baseline: {exc}") from None
    if found.resolve() == current.run_dir.resolve():
        raise BaselineError(f"{where}: is this run ({current.name}) itself")
    try:
        run = load_run(found, journal=True)
    except RunDirectoryError as exc:
        raise BaselineError(f"{where}: {exc}") from None
    _check_whole(where, run)
    theirs = run["manifest"].get("inputs") or {}
    mine = current.inputs
    if mine.get("n") != theirs.get("n"):
        raise BaselineError(
            f"{where}: not comparable with run {current.name}: n {mine.get('n')!r} "
            f"(baseline {theirs.get('n')!r})"
        )
    differences = _differences(mine, theirs)
    threshold = float(run["pass_threshold"])
    if threshold != current.pass_threshold:
        said = (
            f"pass_threshold {threshold:g} (this run {current.pass_threshold:g}) changes "
            "what passed means"
        )
        if "pass_threshold" not in allow:
            raise BaselineError(
                f"{where}: {said}; --osmosis-baseline-allow pass_threshold compares anyway"
            )
        differences.insert(0, f"{said}, compared on purpose (--osmosis-baseline-allow)")
    hints = (current.dataset.path,) if current.dataset is not None else ()
    digests = run_row_digests(run, hints)
    if digests is None:
        sha = str((theirs.get("dataset") or {}).get("sha256"))[:12]
        raise BaselineError(
            f"{where}: its rows cannot be matched by content: it records no row digests "
            f"and its dataset file (sha256 {sha}) is not found"
        )
    if current.dataset is not None:
        mine_digests = current.dataset.row_digests()
    else:
        mine_digests = run_row_digests(load_run(current.run_dir), ()) or {}
    match = match_rows(mine_digests, digests)
    if not match.pairs:
        raise BaselineError(
            f"{where}: no row in common with run {current.name} (rows are matched by "
            f"prompt, label and metadata; {len(digests)} baseline rows, "
            f"{len(mine_digests)} here)"
        )
    return Baseline(
        run=run,
        digests=digests,
        current_digests=mine_digests,
        match=match,
        differences=differences,
    )


def _check_whole(where: str, run: Mapping[str, Any]) -> None:
    """A baseline finished, its journal covers its selection and agrees with metrics.json."""
    metrics = run["metrics"]
    status = (metrics.get("eval_run") or {}).get("status")
    recorded = {(row["row_index"], row["run_index"]) for row in run["rows"]}
    total = run.get("total_runs")
    done = f"{len(recorded)} of {total if total is not None else '?'} attempts recorded"
    if not metrics:
        raise BaselineError(f"{where}: not finished ({done}, no metrics.json): not a whole run")
    if status != "finished":
        raise BaselineError(f"{where}: not finished ({done}, status {status}): not a whole run")
    inputs = run["manifest"].get("inputs") or {}
    n = inputs.get("n")
    if total is None or not isinstance(n, int):
        raise BaselineError(f"{where}: its manifest does not say which rows it selected")
    expected = {(row, attempt) for row in range(total // n) for attempt in range(n)}
    if recorded != expected:
        raise BaselineError(
            f"{where}: its journal does not cover its selection ({done}): not a whole run"
        )
    said = metrics.get("summary") or {}
    recount = run["summary"]
    differs = [
        f"{key} {said.get(key)!r} (journal {recount.get(key)!r})"
        for key in _COUNTED
        if said.get(key) != recount.get(key)
    ]
    if differs:
        raise BaselineError(
            f"{where}: metrics.json disagrees with its journal: {'; '.join(differs)}"
        )


def _differences(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """What differs between two runs' manifest inputs that the gate compares anyway."""

    def rollout(inputs: Mapping[str, Any], key: str) -> Any:
        value = inputs.get("rollout")
        return value.get(key) if isinstance(value, dict) else None

    def dataset(inputs: Mapping[str, Any], key: str) -> Any:
        value = inputs.get("dataset")
        return value.get(key) if isinstance(value, dict) else None

    found = []
    for label, ours, other in (
        ("model", mine.get("model_path"), theirs.get("model_path")),
        ("rollout", rollout(mine, "name"), rollout(theirs, "name")),
        ("entrypoint", rollout(mine, "entrypoint"), rollout(theirs, "entrypoint")),
        (
            "rollout code (source digest)",
            str(rollout(mine, "source_digest"))[:12],
            str(rollout(theirs, "source_digest"))[:12],
        ),
        (
            "dataset file (sha256)",
            str(dataset(mine, "sha256"))[:12],
            str(dataset(theirs, "sha256"))[:12],
        ),
        (
            "row selection",
            dataset(mine, "selected_source_rows"),
            dataset(theirs, "selected_source_rows"),
        ),
        ("env", _keys(mine.get("env")), _keys(theirs.get("env"))),
        ("timeouts", mine.get("timeouts"), theirs.get("timeouts")),
    ):
        if ours != other:
            found.append(f"{label} {ours} (baseline {other})")
    return found


def _keys(env: Any) -> str:
    """An [env] table by its names and a digest of its values (values stay out of CI logs)."""
    import hashlib
    import json

    if not isinstance(env, dict):
        return "none"
    values = hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:8]
    return f"{', '.join(sorted(env)) or 'none'} (values {values})"
