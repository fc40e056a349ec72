"""Resolve one eval config into everything a session needs before any row runs.

A plan is built from the TOML, the command-line/ini overrides and the dataset; it names
the run directory. The controller (or the only process, without xdist) builds it at
session start so it can open the run directory, archive with ``--osmosis-fresh`` and
refuse a changed resume before a single row is paid for; xdist workers rebuild the same
plan during collection and receive the run directory from the controller.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pytest_osmosis import __version__
from pytest_osmosis.core.errors import ConfigError, DatasetError, RunDirectoryError
from pytest_osmosis.dataset import SelectedDataset, open_dataset, resolve_dataset_path
from pytest_osmosis.dataset.shard import Shard, row_digests, shard_keys
from pytest_osmosis.workspace.config import (
    MAX_ITEMS,
    EvalConfig,
    EvalSettings,
    load_eval_config,
    resolve_settings,
    validate_rollout_paths,
    validate_run_name,
)

Overrides = Mapping[str, tuple[object, str]]


class AllKeys(Sequence[tuple[int, int]]):
    """Every ``(row_index, run_index)`` of *rows* rows times *n* attempts, in that order,
    computed when asked: a list of them was ~0.1 KB a row for the whole session."""

    def __init__(self, rows: int, n: int) -> None:
        self.rows, self.n = rows, n

    def __len__(self) -> int:
        return self.rows * self.n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return divmod(index, self.n)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((r, i) for r in range(self.rows) for i in range(self.n))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        row, attempt = key
        return (
            isinstance(row, int)
            and isinstance(attempt, int)
            and 0 <= row < self.rows
            and 0 <= attempt < self.n
        )


@dataclass
class EvalPlan:
    """One eval config, resolved: settings, dataset selection, rollout location, run dir."""

    config_path: Path
    workspace: Path
    config: EvalConfig
    settings: EvalSettings
    dataset: SelectedDataset
    rollout_dir: Path
    entrypoint: Path
    output_root: Path
    run_name: str = ""
    #: ``--osmosis-shard K/N``: this session runs (and its run directory holds) that shard.
    shard: Shard | None = None
    _keys: Sequence[tuple[int, int]] | None = field(default=None, repr=False, compare=False)
    _digests: list[str] | None = field(default=None, repr=False, compare=False)

    @property
    def run_dir(self) -> Path:
        return self.output_root / self.run_name

    def work_keys(self) -> Sequence[tuple[int, int]]:
        """Every ``(row_index, run_index)`` this plan runs: its selected rows times its
        attempts (:class:`AllKeys`), or its shard's share of them (computed once)."""
        if self._keys is None:
            n = self.settings.n
            self._keys = (
                AllKeys(len(self.dataset), n)
                if self.shard is None
                else shard_keys(self.row_digests(), n, self.shard)
            )
        return self._keys

    def row_digests(self) -> list[str]:
        """Each selected row's content digest, by row index (computed once; shard.py)."""
        if self._digests is None:
            self._digests = row_digests(self.dataset)
        return self._digests

    def digests_by_row(self) -> dict[int, str]:
        """Dataset row -> digest of every selected row, for ``osmosis_rows.json``: the plan's
        own when it made them (a shard), else made for the caller and not kept (written
        once, at the run's end, when every row's report is still held)."""
        if self._digests is None:
            return self.dataset.row_digests()
        sources = self.dataset.selected_source_rows
        return dict(zip(sources, self._digests, strict=True))

    @property
    def total_items(self) -> int:
        return len(self.dataset) * self.settings.n


def build_plan(
    config_path: Path,
    overrides: Overrides,
    output: Path | None,
    *,
    rollout_dir: Path | None = None,
) -> EvalPlan:
    """Load and validate everything one config needs; raises our own errors only.

    *rollout_dir* (``--osmosis-rollout-dir``) loads the rollout from another directory
    than ``rollouts/<rollout>`` (another checkout's grader, for a regrade).
    """
    config_path = config_path.resolve()
    workspace = config_path.parent.parent.parent
    cfg = load_eval_config(config_path)
    entrypoint = validate_rollout_paths(workspace, cfg.experiment, config_path)
    rollout_root = (workspace / "rollouts" / cfg.experiment.rollout).resolve()
    if rollout_dir is not None:
        rollout_root = rollout_dir.resolve()
        entrypoint = rollout_root / cfg.experiment.entrypoint
        if not entrypoint.is_file():
            raise ConfigError(
                f"--osmosis-rollout-dir: {rollout_root} has no {cfg.experiment.entrypoint} "
                f"(experiment.entrypoint of {config_path})"
            )
    settings = resolve_settings(cfg, overrides)
    dataset_file = settings.dataset_file
    if dataset_file is not None and not dataset_file.is_absolute():
        dataset_file = Path.cwd() / dataset_file
    try:
        dataset_path = resolve_dataset_path(workspace, cfg.experiment.dataset, dataset_file)
    except DatasetError as exc:
        raise DatasetError(f"{config_path}: {exc}") from None
    dataset = open_dataset(
        dataset_path,
        limit=settings.limit,
        rows=settings.rows,
        sample=settings.sample,
        seed=settings.seed,
    )
    items = len(dataset) * settings.n
    if items > MAX_ITEMS:
        raw_n, n_source = overrides.get("n", (None, ""))
        if not (isinstance(raw_n, str) and raw_n.strip()):
            n_source = "evaluation.n"
        raise ConfigError(
            f"{config_path}: {n_source}: {len(dataset):,} rows x {settings.n:,} attempts is "
            f"{items:,} items, more than the {MAX_ITEMS:,} one session runs "
            "(select fewer rows with limit / --osmosis-rows, or lower n)"
        )
    output_root = _output_root(output, workspace)
    return EvalPlan(
        config_path=config_path,
        workspace=workspace,
        config=cfg,
        settings=settings,
        dataset=dataset,
        rollout_dir=rollout_root,
        entrypoint=entrypoint,
        output_root=output_root,
    )


def _output_root(output: Path | None, workspace: Path) -> Path:
    """Where run directories go, resolved; a loop of symbolic links is one line (exit 4).

    Python 3.10-3.12 raise RuntimeError resolving a loop (INTERNALERROR), 3.13 resolves it
    to itself and the first file made under it fails.
    """
    given = output if output is not None else workspace / ".osmosis" / "evals"
    try:
        root = given.resolve()
        os.stat(root)
        return root
    except FileNotFoundError:
        return root  # made when the first run directory is
    except (RuntimeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno != errno.ELOOP:
            return given.resolve()  # the run directory's own checks name the problem
        what = "--osmosis-output" if output is not None else "the output directory"
        raise RunDirectoryError(
            f"{what} {given}: is a loop of symbolic links, not a directory "
            "(point it at a directory, or remove the link)"
        ) from None


#: What ``osmosis eval run`` 0.3.8 requires of a workspace before it reads a config
#: (``templates/catalog.py::REQUIRED_WORKSPACE_DIRS``) that a session can do without.
SDK_REQUIRED_DIRS = ("configs/training",)


def workspace_warnings(workspace: Path) -> list[str]:
    """One line for each directory ``osmosis eval run`` would refuse this workspace without."""
    return [
        f"{workspace}: no {name}/ directory: `osmosis eval run` refuses a workspace "
        f"without one (an empty {name}/ will do)"
        for name in SDK_REQUIRED_DIRS
        if not (workspace / name).is_dir()
    ]


def run_inputs(plan: EvalPlan) -> dict[str, Any]:
    """The resolved-input lock of the manifest (§7.1): what a resume must not change."""
    from pytest_osmosis.results import build_inputs, source_digest

    cfg = plan.config
    return build_inputs(
        model_path=plan.settings.model_path,
        dataset_sha256=plan.dataset.sha256,
        selected_source_rows=plan.dataset.selector,
        n=plan.settings.n,
        rollout_name=cfg.experiment.rollout,
        entrypoint=cfg.experiment.entrypoint,
        source_digest=source_digest(plan.rollout_dir, plan.output_root),
        env=cfg.env,
        secret_names=cfg.secrets.required,
        agent_timeout_s=plan.settings.agent_timeout_s,
        grader_timeout_s=plan.settings.grader_timeout_s,
    )


def run_provenance(plan: EvalPlan) -> dict[str, Any]:
    from pytest_osmosis.results import build_provenance

    experiment = plan.config.experiment
    try:
        config_rel = plan.config_path.relative_to(plan.workspace).as_posix()
    except ValueError:
        config_rel = None
    provenance = build_provenance(
        sdk_version=f"pytest-osmosis {__version__}",
        config_branch=experiment.branch,
        config_commit_sha=experiment.commit_sha,
        advanced=plan.config.advanced or None,
        config_path=config_rel,
        workspace=plan.workspace,
    )
    if plan.shard is not None:
        provenance["shard"] = plan.shard.as_provenance()
    return provenance


def choose_run_name(
    plan: EvalPlan, name: str | None, inputs: dict[str, Any], now: datetime, several: bool
) -> str:
    """``--osmosis-name`` (plus the config stem when several configs share it), else generated."""
    from pytest_osmosis.results import generated_run_name, inputs_digest

    suffix = plan.shard.suffix if plan.shard is not None else ""
    if name:
        chosen = f"{name}-{plan.config_path.stem}" if several else name
        return validate_run_name(chosen + suffix)
    return generated_run_name(plan.config_path, inputs_digest(inputs), now) + suffix


def other_named_run(plan: EvalPlan, name: str | None, several: bool) -> str | None:
    """Why an existing run of the other spelling of ``--osmosis-name`` is not resumed.

    One config's run is ``NAME``, each of several configs' runs ``NAME-<config stem>``
    (:func:`choose_run_name`): a nightly job that gains a config starts new runs, and one
    that loses one does too. None when no run of the other spelling exists.
    """
    if not name:
        return None
    other = name if several else f"{name}-{plan.config_path.stem}"
    if other == plan.run_name or not (plan.output_root / other).is_dir():
        return None
    rule = (
        f"with several configs each run is {name}-<config stem>"
        if several
        else f"with one config the run is {name}"
    )
    return f"run {other} exists but is not resumed: {rule}"
