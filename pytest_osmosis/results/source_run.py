"""An earlier, completed run read back for a regrade: its rows, its samples, its failures.

A regrade runs only the grader (the current code) over the samples a finished run
recorded and writes a new run directory. This module is everything it needs from the old
one: finding it (:func:`open_source_run`, one line naming what is wrong), what the new plan
must take from it (rows, ``n``, model: :meth:`SourceRun.overrides`) and agree with
(:meth:`SourceRun.check_inputs`), the sample of one attempt rebuilt from its trajectory
(:meth:`SourceRun.recorded`), and the new manifest's ``inputs.regraded_from``.

An attempt is regraded when the old run kept its trajectory (the workflow finished, so
even a grader failure is graded again); one without (its workflow failed) keeps its
recorded failure (:meth:`SourceRun.kept`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import ConfigError, OsmosisError
from pytest_osmosis.results import stdjson as json
from pytest_osmosis.results.index import (
    CANONICAL_TRAJECTORY_FILENAME,
    METRICS_FILENAME,
    TRIALS_DIRNAME,
    atif_rollout_identity,
    atif_total_tokens,
    read_valid_trajectory,
)
from pytest_osmosis.results.journal import JOURNAL_FILENAME, WorkKey, replay_journal
from pytest_osmosis.results.manifest import MANIFEST_FILENAME, read_manifest
from pytest_osmosis.results.projection import safe_artifact_paths
from pytest_osmosis.results.run_reader import recorded_selection
from pytest_osmosis.results.trajectory import trajectory_messages

#: ``inputs`` key of a regraded run's manifest: which run's samples it graded.
REGRADED_FROM = "regraded_from"

#: The overrides a regrade takes from the run it regrades (and refuses from the user).
TAKEN_FROM_RUN = ("rows", "limit", "n", "model_path", "sample", "seed")


class RegradeError(ConfigError):
    """The run named for a regrade cannot be regraded (one line naming why)."""


@dataclass(frozen=True)
class RecordedSample:
    """One attempt as the earlier run recorded it: what the grader sees again."""

    rollout_id: str
    messages: list[dict[str, Any]]
    label: str | None
    metrics: dict[str, Any]
    extra_fields: dict[str, Any]
    document: dict[str, Any]
    #: The workflow's tokens: the trajectory's step totals (no judge), else the record's.
    tokens: int | None
    duration_ms: float

    def sample(self, api: Any) -> Any:
        """A fresh ``RolloutSample`` (ours or the SDK's): no reward until the grader sets one."""
        return api.RolloutSample(
            messages=self.messages,
            label=self.label,
            metrics=dict(self.metrics),
            extra_fields=dict(self.extra_fields),
        )


@dataclass
class SourceRun:
    """A completed run directory opened read-only for a regrade."""

    path: Path
    manifest: dict[str, Any]
    records: dict[WorkKey, dict[str, Any]]

    @property
    def name(self) -> str:
        return str(self.manifest.get("run_name") or self.path.name)

    @property
    def inputs(self) -> dict[str, Any]:
        inputs: dict[str, Any] = self.manifest["inputs"]
        return inputs

    @property
    def config_path(self) -> str | None:
        """The workspace-relative config the run was made from, when it says."""
        value = self.manifest.get("provenance", {}).get("config_path")
        return value if isinstance(value, str) and value else None

    def overrides(self, given: Mapping[str, tuple[object, str]]) -> dict[str, tuple[object, str]]:
        """The regrade's plan overrides: *given* without the selection, which is this run's
        (its rows, attempts and model; ini values of those are set aside)."""
        where = f"run {self.name!r} (manifest.json)"
        dataset = self.inputs.get("dataset") or {}
        kept = {key: value for key, value in given.items() if key not in TAKEN_FROM_RUN}
        return {
            **kept,
            "rows": (str(dataset.get("selected_source_rows", "")), where),
            "n": (str(self.inputs.get("n")), where),
            "model_path": (str(self.inputs.get("model_path")), where),
        }

    def check_inputs(self, current: Mapping[str, Any], config: Path) -> None:
        """Refuse, in one line, a config whose rollout or dataset is not this run's."""
        old_rollout = self.inputs.get("rollout") or {}
        new_rollout = current.get("rollout") or {}
        for key in ("name", "entrypoint"):
            if old_rollout.get(key) != new_rollout.get(key):
                raise RegradeError(
                    f"--osmosis-regrade: run {self.name!r} ran rollout {key} "
                    f"{old_rollout.get(key)!r}, but {config} has {new_rollout.get(key)!r}: "
                    "regrade it with the config it was made from"
                )
        old_sha = (self.inputs.get("dataset") or {}).get("sha256")
        new_sha = (current.get("dataset") or {}).get("sha256")
        if old_sha != new_sha:
            raise RegradeError(
                f"--osmosis-regrade: the dataset of {config} is not the one run {self.name!r} "
                f"was made from (sha256 {str(new_sha)[:12]}, the run's {str(old_sha)[:12]}): "
                "a regrade needs the rows, labels and metadata the run graded"
            )

    def check_target(self, run_dir: Path) -> None:
        """Refuse to write the regrade into the run it regrades (``--osmosis-fresh`` would
        archive the very samples it is about to read)."""
        if Path(os.path.abspath(run_dir)) == self.path:
            raise RegradeError(
                f"--osmosis-regrade: the regrade of run {self.name!r} is a new run; give it "
                "another --osmosis-name"
            )

    def regrade_inputs(self, current: Mapping[str, Any]) -> dict[str, Any]:
        """The new manifest's inputs: the config's, and which run was regraded.

        In ``inputs`` (not provenance) so that resuming is refused when it changes, and a
        plain run of the same name never resumes a regrade (nor the other way round).
        """
        return {
            **current,
            REGRADED_FROM: {
                "run_name": self.name,
                "local_run_id": self.manifest.get("local_run_id"),
            },
        }

    def trajectory(self, record: Mapping[str, Any]) -> dict[str, Any] | None:
        return read_valid_trajectory(
            self._trajectory_path(record), rollout_id=str(record["rollout_id"])
        )

    def _trajectory_path(self, record: Mapping[str, Any]) -> Path:
        return (
            self.path / TRIALS_DIRNAME / str(record["rollout_id"]) / CANONICAL_TRAJECTORY_FILENAME
        )

    def no_trajectory(self, key: WorkKey) -> str:
        """Why the run holds no trajectory of the attempt ``key`` to regrade (one clause)."""
        path = self._trajectory_path(self.records[key])
        if not path.exists():
            return f"run {self.name!r} kept no trajectory of this attempt"
        try:
            document = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError):
            return f"{path} is not a readable trajectory"
        other = atif_rollout_identity(document) if isinstance(document, dict) else None
        owner = next(
            (k for k, record in self.records.items() if str(record["rollout_id"]) == other), None
        )
        if owner is not None:
            return (
                f"the trajectory of {self.row_words(owner)} was found under "
                f"{self.row_words(key)} ({path})"
            )
        return f"{path} is the trajectory of another rollout ({other!r})"

    def row_words(self, key: WorkKey) -> str:
        """``row <dataset row> run <attempt>``, as the run's lines name an attempt."""
        selection = recorded_selection(
            (self.inputs.get("dataset") or {}).get("selected_source_rows")
        )
        row_index, run_index = key
        shown = selection[row_index] if selection and row_index < len(selection) else row_index
        return f"row {shown} run {run_index}"

    def recorded(self, key: WorkKey) -> RecordedSample | None:
        """The attempt's sample, or None when the run kept no trajectory for it."""
        record = self.records.get(key)
        if record is None:
            return None
        document = self.trajectory(record)
        if document is None:
            return None
        osmosis = (document.get("extra") or {}).get("osmosis") or {}
        label = osmosis.get("label")
        return RecordedSample(
            rollout_id=str(record["rollout_id"]),
            messages=trajectory_messages(document),
            label=label if isinstance(label, str) else None,
            metrics=dict(osmosis.get("sample_metrics") or {}),
            extra_fields=dict(osmosis.get("sample_extra_fields") or {}),
            document=document,
            tokens=_workflow_tokens(document, record),
            duration_ms=float(record.get("duration_ms") or 0.0),
        )

    def kept(self, key: WorkKey) -> dict[str, Any] | None:
        """The recorded record of an attempt that cannot be regraded, with its message.

        A failed attempt without a trajectory is one whose workflow failed: it keeps its
        failure. None when the attempt has a trajectory (it is regraded) or no record.
        """
        record = self.records.get(key)
        if record is None or self.trajectory(record) is not None:
            return None
        from pytest_osmosis.results.runs import error_messages

        rollout_id = str(record["rollout_id"])
        logged = error_messages(self.path, {rollout_id}).get(rollout_id, {})
        if record.get("status") != "failed":
            return {
                **record,
                "status": "failed",
                "reward": None,
                "error_type": "rollout_failed",
                "message": f"{self.no_trajectory(key)}, so there is no sample to regrade",
            }
        message = logged.get("message") or "the workflow failed in run " + repr(self.name)
        return {**record, "message": f"{message} (recorded in run {self.name!r})"}

    def copy_trial(self, rollout_id: str, run_dir: Path) -> None:
        """Copy the attempt's artifacts into the new run: the grader may read what the
        workflow wrote there. The trajectory is written afresh, with the new reward."""
        source = self.path / TRIALS_DIRNAME / rollout_id / "artifacts"
        target = run_dir / TRIALS_DIRNAME / rollout_id / "artifacts"
        for relative in safe_artifact_paths(source):
            destination = target.joinpath(*relative.parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source.joinpath(*relative.parts), destination)


def _workflow_tokens(document: Mapping[str, Any], record: Mapping[str, Any]) -> int | None:
    """What the workflow spent: its trajectory's totals count no judge call; a run whose
    trajectory has no totals gives its recorded tokens (a judge's included, if any)."""
    counted = atif_total_tokens(document)
    if counted is not None:
        return counted
    tokens = record.get("tokens")
    return tokens if isinstance(tokens, int) else None


def regraded_trajectory(document: Mapping[str, Any], reward: float | None) -> dict[str, Any]:
    """The recorded trajectory with the new grade: only ``extra.osmosis.reward`` changes."""
    copy: dict[str, Any] = json.loads(json.dumps(document))
    extra = copy.setdefault("extra", {})
    osmosis = extra.setdefault("osmosis", {})
    if reward is None:
        osmosis.pop("reward", None)
    else:
        osmosis["reward"] = float(reward)
    return copy


def open_source_run(ref: str, output_root: Path | None, cwd: Path) -> SourceRun:
    """The completed run ``ref`` names (a path, or a name under the output root).

    Raises :class:`RegradeError` in one line: not found, not a run, not finished.
    """
    from pytest_osmosis.results.runs import resolve_run

    try:
        path = resolve_run(ref, output_root, cwd=cwd)
    except OsmosisError as exc:
        raise RegradeError(f"--osmosis-regrade: {exc}") from None
    path = Path(os.path.abspath(path))
    manifest_path = path / MANIFEST_FILENAME
    if not manifest_path.is_file():
        raise RegradeError(f"--osmosis-regrade: {path} has no {MANIFEST_FILENAME}: not a run")
    try:
        manifest = read_manifest(manifest_path)
    except OsmosisError as exc:
        raise RegradeError(f"--osmosis-regrade: {exc}") from None
    name = manifest.get("run_name") or path.name
    try:
        metrics = json.loads((path / METRICS_FILENAME).read_bytes())
        status = metrics["eval_run"]["status"]
    except (OSError, ValueError, KeyError, TypeError):
        status = None
    if status != "finished":
        shown = f"its status is {status!r}" if status else f"it has no readable {METRICS_FILENAME}"
        raise RegradeError(
            f"--osmosis-regrade: run {name!r} ({path}) is not a completed run ({shown}): "
            "finish it first (the same command resumes it), or regrade a finished run"
        )
    try:
        records = replay_journal(path / JOURNAL_FILENAME).latest
    except OsmosisError as exc:
        raise RegradeError(f"--osmosis-regrade: {exc}") from None
    source = SourceRun(path=path, manifest=manifest, records=records)
    _check_coverage(source)
    return source


def _check_coverage(source: SourceRun) -> None:
    """Refuse, in one line, a run whose journal lacks an attempt its manifest selects (a
    journal cut or edited after the run finished): there would be nothing to grade."""
    dataset = source.inputs.get("dataset") or {}
    selection = recorded_selection(dataset.get("selected_source_rows"))
    n = source.inputs.get("n")
    if selection is None or type(n) is not int or n < 1:
        return  # the plan taken from the manifest refuses it, naming the field
    missing = [
        (row, run)
        for row in range(len(selection))
        for run in range(n)
        if (row, run) not in source.records
    ]
    if missing:
        raise RegradeError(
            f"--osmosis-regrade: run {source.name!r} ({source.path}) has no record of "
            f"{len(missing)} of its {len(selection) * n} attempts in {JOURNAL_FILENAME} "
            f"(first: {source.row_words(missing[0])}): its journal was cut or edited after "
            "it finished, so it cannot be regraded"
        )


def config_problem(source: SourceRun, relative: str) -> str | None:
    """Why a config (workspace-relative path) is not the one the run was made from."""
    if source.config_path is None or source.config_path == relative:
        return None
    return f"run {source.name!r} was made from {source.config_path}, not {relative}"


def workspace_config(source: SourceRun) -> Path | None:
    """The config the run names, found above its directory (``<ws>/.osmosis/evals/<run>``)."""
    if source.config_path is None:
        return None
    for directory in source.path.parents:
        candidate = directory / source.config_path
        if candidate.is_file():
            return candidate
    return None
