"""The Osmosis completed-run directory: journal, manifest, index, metrics, projections.

A pure library (no pytest imports). The controller process owns a
:class:`RunDirectory`; the process executing a rollout (possibly an xdist
worker) only prepares its trial directory and writes the trajectory.
"""

from __future__ import annotations

from pytest_osmosis.results.atif import Trajectory, validate_trajectory
from pytest_osmosis.results.atomic import (
    atomic_write_bytes,
    atomic_write_json,
    canonical_json,
    format_utc,
    utc_now,
)
from pytest_osmosis.results.index import (
    atif_rollout_identity,
    atif_total_tokens,
    build_index_row,
    read_valid_trajectory,
    render_index,
)
from pytest_osmosis.results.journal import (
    TERMINAL_STATUSES,
    WorkKey,
    normalize_record,
    read_journal,
)
from pytest_osmosis.results.manifest import (
    ROLLOUT_PROTOCOL_VERSION,
    build_inputs,
    build_provenance,
    changed_input_keys,
    describe_changed_inputs,
    format_row_selector,
    generated_run_name,
    git_provenance,
    inputs_digest,
    source_digest,
    validate_run_name,
)
from pytest_osmosis.results.metrics import aggregate_metrics, pass_at_k
from pytest_osmosis.results.projection import projection_stem, safe_artifact_paths
from pytest_osmosis.results.redact import (
    AMBIENT_SECRET_ENV_NAMES,
    REDACTED,
    Redactor,
    ambient_secret_values,
)
from pytest_osmosis.results.run_log import RunLog
from pytest_osmosis.results.rundir import RunDirectory, RunLock, archive_run_directory
from pytest_osmosis.results.trajectory import (
    build_trajectory,
    format_trajectory_json,
    prepare_trial_dir,
    trial_dir_of,
    write_trajectory,
)

__all__ = [
    "AMBIENT_SECRET_ENV_NAMES",
    "REDACTED",
    "ROLLOUT_PROTOCOL_VERSION",
    "TERMINAL_STATUSES",
    "Redactor",
    "RunDirectory",
    "RunLock",
    "RunLog",
    "Trajectory",
    "WorkKey",
    "aggregate_metrics",
    "ambient_secret_values",
    "archive_run_directory",
    "atif_rollout_identity",
    "atif_total_tokens",
    "atomic_write_bytes",
    "atomic_write_json",
    "build_index_row",
    "build_inputs",
    "build_provenance",
    "build_trajectory",
    "canonical_json",
    "changed_input_keys",
    "describe_changed_inputs",
    "format_row_selector",
    "generated_run_name",
    "format_trajectory_json",
    "format_utc",
    "git_provenance",
    "inputs_digest",
    "normalize_record",
    "pass_at_k",
    "prepare_trial_dir",
    "projection_stem",
    "read_journal",
    "read_valid_trajectory",
    "render_index",
    "safe_artifact_paths",
    "source_digest",
    "trial_dir_of",
    "utc_now",
    "validate_run_name",
    "validate_trajectory",
    "write_trajectory",
]
