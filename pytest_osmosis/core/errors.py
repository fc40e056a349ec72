"""Error types a user meets: each carries a one-line message naming the place."""

from __future__ import annotations


class OsmosisError(Exception):
    """Base of every error we raise on purpose; its message is shown as is."""


class ConfigError(OsmosisError):
    """The eval TOML or a command-line/ini override is invalid."""


class DatasetError(OsmosisError):
    """The dataset is missing, unreadable, or a row breaks the contract."""


class RolloutLoadError(OsmosisError):
    """The rollout entrypoint cannot be imported or its workflow/grader not found."""


class NeedsServerError(RolloutLoadError):
    """The rollout cannot run in process faithfully (it serves, or builds a non-local
    backend, while loading); ``--osmosis-execution auto`` runs it on its server instead."""


class ModelPreflightError(OsmosisError):
    """The configured model cannot be reached; the session stops before any row."""


class RunDirectoryError(OsmosisError):
    """The run directory cannot be created, locked, resumed or written."""


class SessionFaultError(OsmosisError):
    """The session cannot go on (not a row's failure): stop in one line, exit 4, the rows
    not finished left pending so that a resume runs them."""


class ResourceExhaustedError(SessionFaultError):
    """The session itself ran out of a resource (file descriptors): not the row's failure."""
