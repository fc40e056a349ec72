"""The eval TOML (contract §2) as pydantic models, and the settings a session runs with.

Whatever a user can get wrong here surfaces as one ``ConfigError`` line naming the file and
the key, e.g. ``configs/eval/x.toml: evaluation.n: must be a positive integer, got 0``.
Unlike the SDK, ``[evaluation]`` values are checked at load time, so a bad value fails
collection instead of surfacing halfway through a run.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from pytest_osmosis.core.errors import ConfigError
from pytest_osmosis.dataset import parse_row_selector
from pytest_osmosis.results.manifest import run_name_problem

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

__all__ = [
    "EvalConfig",
    "EvalSettings",
    "Evaluation",
    "Experiment",
    "Secrets",
    "check_overrides",
    "load_eval_config",
    "resolve_settings",
    "validate_rollout_paths",
    "validate_run_name",
]

COMMIT_SHA_RE = re.compile(r"[0-9a-fA-F]{7,40}")
ENV_NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]*")
SECRET_NAME_RE = re.compile(r"[A-Z][A-Z0-9_]*")
RESERVED_ENV_PREFIX = "_OSMOSIS_"
_INT_TEXT_RE = re.compile(r"[+-]?\d+")


def _show(value: object) -> str:
    """A short repr for messages, so one bad value cannot flood the terminal."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _newlines_escaped(message: str) -> str:
    """A message keeps every character of the value it quotes, on one line (not folded)."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


# Value checks, shared by [evaluation] and the command-line/ini overrides. Each raises
# ValueError("must be ...") without the offending value; the caller appends ", got <raw>".


def _integer(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be an integer")
    return value


def _positive_integer(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError("must be a positive integer")
    return value


#: Bounds no real eval reaches; past them a session would only hang building items or run
#: out of memory. The SDK declares none (0.3.8 checks only ``n > 0``).
MAX_N = 10_000
MAX_ITEMS = 10_000_000


def _attempts(value: object) -> int:
    number = _positive_integer(value)
    if number > MAX_N:
        raise ValueError(f"must be a positive integer of at most {MAX_N:,}")
    return number


def _finite(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError("must be finite")
    return number


def _positive_finite(value: object) -> float:
    number = _finite(value)
    if number <= 0:
        raise ValueError("must be greater than 0")
    return number


_EVALUATION_CHECKS: dict[str, Callable[[object], object]] = {
    "limit": _integer,
    "n": _attempts,
    "batch_size": _integer,
    "pass_threshold": _finite,
    "agent_workflow_timeout_s": _positive_finite,
    "grader_timeout_s": _positive_finite,
}


def _env_name(name: str) -> str:
    if not ENV_NAME_RE.fullmatch(name):
        raise ValueError("invalid variable name (must match ^[A-Z_][A-Z0-9_]*$)")
    if name.startswith(RESERVED_ENV_PREFIX):
        raise ValueError(f"names starting with {RESERVED_ENV_PREFIX} are reserved")
    return name


def _secret_name(name: str) -> str:
    if not SECRET_NAME_RE.fullmatch(name):
        raise ValueError(f"invalid secret name {name!r} (must match ^[A-Z][A-Z0-9_]*$)")
    return name


class Experiment(BaseModel):
    """``[experiment]``: what to run. ``branch``/``commit_sha`` are provenance only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout: str
    entrypoint: str
    model_path: str
    dataset: str
    branch: str | None = None
    commit_sha: str | None = None

    @field_validator("branch")
    @classmethod
    def _check_branch(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise ValueError(f"must be non-empty and contain no whitespace, got {_show(value)}")
        return value

    @field_validator("commit_sha")
    @classmethod
    def _check_commit_sha(cls, value: str | None) -> str | None:
        if value is not None and not COMMIT_SHA_RE.fullmatch(value):
            raise ValueError(f"must be 7-40 hexadecimal characters, got {_show(value)}")
        return value

    @model_validator(mode="after")
    def _branch_xor_commit(self) -> Experiment:
        if self.branch is not None and self.commit_sha is not None:
            raise ValueError("give either branch or commit_sha, not both")
        return self


class Evaluation(BaseModel):
    """``[evaluation]``: every key optional; ``None`` means "use the default"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: int | None = None
    n: int | None = None
    batch_size: int | None = None
    pass_threshold: float | None = None
    agent_workflow_timeout_s: float | None = None
    grader_timeout_s: float | None = None

    @field_validator(*_EVALUATION_CHECKS, mode="before")
    @classmethod
    def _check_value(cls, value: object, info: ValidationInfo) -> object:
        try:
            return _EVALUATION_CHECKS[str(info.field_name)](value)
        except ValueError as exc:
            raise ValueError(f"{exc}, got {_show(value)}") from None


class Secrets(BaseModel):
    """``[secrets]``: names of variables the user must supply; values never live here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    required: list[Annotated[str, AfterValidator(_secret_name)]]

    @field_validator("required")
    @classmethod
    def _no_duplicates(cls, value: list[str]) -> list[str]:
        duplicates = sorted({name for name in value if value.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate name(s): {', '.join(duplicates)}")
        return value


class EvalConfig(BaseModel):
    """One ``configs/eval/*.toml`` file, validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment: Experiment
    evaluation: Evaluation = Field(default_factory=Evaluation)
    advanced: dict[str, Any] = Field(default_factory=dict)
    env: dict[Annotated[str, AfterValidator(_env_name)], str] = Field(default_factory=dict)
    secrets: Secrets

    @model_validator(mode="after")
    def _env_secrets_disjoint(self) -> EvalConfig:
        both = sorted(set(self.env) & set(self.secrets.required))
        if both:
            # A model-level error has no location; the message carries its key itself.
            raise ValueError(
                f"secrets.required: {', '.join(both)} also set in [env] "
                "(a variable must come from exactly one place)"
            )
        return self


_EXPECTED_BY_ERROR = {
    "string_type": "a string",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
    "list_type": "a list",
}
_SECTION_KEYS: dict[str, list[str]] = {
    "": list(EvalConfig.model_fields),
    "experiment": list(Experiment.model_fields),
    "evaluation": list(Evaluation.model_fields),
    "secrets": list(Secrets.model_fields),
}


def _loc_key(loc: tuple[int | str, ...]) -> str:
    key = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for an invalid dict key; the key precedes it
            continue
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else part)
    return key


def _issue(error: ErrorDetails) -> str:
    """One pydantic error as ``section.key: problem``, without pydantic's boilerplate."""
    key = _loc_key(error["loc"])
    depth = len([part for part in error["loc"] if part != "[key]"])
    kind = error["type"]
    if kind == "value_error":
        problem = str(error.get("ctx", {}).get("error", error["msg"]))
    elif kind == "missing":
        problem = "missing required section" if depth == 1 else "missing required key"
        if key == "secrets":
            problem += " (write `required = []` when the rollout needs none)"
    elif kind == "extra_forbidden":
        section = "" if depth == 1 else str(error["loc"][0])
        problem = "unrecognized section" if depth == 1 else "unrecognized key"
        if section in _SECTION_KEYS:
            problem += f" (valid: {', '.join(_SECTION_KEYS[section])})"
    elif kind in _EXPECTED_BY_ERROR:
        problem = f"must be {_EXPECTED_BY_ERROR[kind]}, got {_show(error['input'])}"
    else:
        problem = f"{error['msg']}, got {_show(error['input'])}"
    return f"{key}: {problem}" if key else problem


def _toml_problem(exc: tomllib.TOMLDecodeError) -> str:
    """``at line L, column C: <what>`` from parsers with or without ``lineno`` attributes."""
    lineno, colno, msg = (getattr(exc, name, None) for name in ("lineno", "colno", "msg"))
    if lineno is None:  # tomllib before 3.14 only puts "(at line L, column C)" in the text
        match = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", str(exc))
        if match is None:
            return f": {exc}"
        msg, lineno, colno = match.groups()
    return f" at line {lineno}, column {colno}: {msg}"


def load_eval_config(path: Path) -> EvalConfig:
    """Read, parse and validate one eval TOML; every problem is one ``ConfigError`` line."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 (bad byte at offset {exc.start})") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(_newlines_escaped(f"{path}: invalid TOML{_toml_problem(exc)}")) from None
    try:
        return EvalConfig.model_validate(raw)
    except ValidationError as exc:
        issues = "; ".join(_issue(error) for error in exc.errors())
        raise ConfigError(_newlines_escaped(f"{path}: {issues}")) from None


def _resolved(path: Path) -> Path | None:
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):  # symlink loops, NUL bytes
        return None


def validate_rollout_paths(workspace: Path, experiment: Experiment, config_path: Path) -> Path:
    """Return the absolute entrypoint, which must stay inside ``rollouts/<rollout>/``."""

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(_newlines_escaped(f"{config_path}: experiment.{key}: {problem}"))

    rollout, entrypoint = experiment.rollout, experiment.entrypoint
    if (
        rollout in ("", ".", "..")
        or any(sep in rollout for sep in ("/", "\\", "\0"))
        or Path(rollout).is_absolute()
    ):
        raise fail("rollout", f"must be one directory name under rollouts/, got {_show(rollout)}")
    rollouts_root = _resolved(workspace / "rollouts")
    rollout_root = _resolved(workspace / "rollouts" / rollout)
    if (
        rollouts_root is None
        or rollout_root is None
        or rollout_root == rollouts_root
        or not rollout_root.is_relative_to(rollouts_root)
    ):
        raise fail("rollout", f"must resolve to a directory under {workspace / 'rollouts'}")
    try:
        rollout_is_dir = rollout_root.is_dir()
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise fail(
            "rollout", f"cannot be used ({exc.strerror or exc}), got {_show(rollout)}"
        ) from None
    if not rollout_is_dir:
        raise fail("rollout", f"rollout directory not found: {rollout_root}")
    entry = None if "\0" in entrypoint else _resolved(rollout_root / entrypoint)
    if entry is None or entry == rollout_root or not entry.is_relative_to(rollout_root):
        raise fail(
            "entrypoint",
            f"must be a file path inside rollouts/{rollout}/, got {_show(entrypoint)}",
        )
    try:
        entry_is_file, entry_exists = entry.is_file(), entry.exists()
    except OSError as exc:
        raise fail(
            "entrypoint", f"cannot be used ({exc.strerror or exc}), got {_show(entrypoint)}"
        ) from None
    if not entry_is_file:
        raise fail("entrypoint", f"{'not a file' if entry_exists else 'file not found'}: {entry}")
    return entry


@dataclass(frozen=True)
class EvalSettings:
    """What one config runs with after command line > ini > ``[evaluation]`` > defaults."""

    model_path: str
    limit: int | None
    n: int
    rows: str | None
    pass_threshold: float
    dataset_file: Path | None
    sample: float | None
    seed: int
    concurrency: int | None
    agent_timeout_s: float | None
    grader_timeout_s: float | None


def _int_text(text: str) -> object:
    return int(text) if _INT_TEXT_RE.fullmatch(text) else text


def _float_text(text: str) -> object:
    try:
        return float(text)
    except ValueError:
        return text


def _model_path(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a model id such as 'openai/gpt-5-mini'")
    return value.strip()


def _rows(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string of row indices such as '0-9,12'")
    text = value.strip()
    if not text:
        # A blank $ROWS in CI must not become a full, paid run: only an absent option is.
        raise ValueError(
            "must name the rows to run, such as '0-9,12' (leave the option out for every row)"
        )
    parse_row_selector(text)  # a RowSelectorError is a ValueError worded for an option
    return text


def _dataset_file(value: object) -> Path:
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a file path")
    return Path(value.strip())


def _sample(value: object) -> float:
    number = _finite(value)
    if not 0 < number <= 1:
        raise ValueError("must be a fraction in (0, 1]")
    return number


def _concurrency(value: object) -> int | None:
    number = _integer(value)
    return number if number > 0 else None


def _identity(text: str) -> object:
    return text


# field -> (parse an ini/command-line string, check the value)
_OVERRIDES: dict[str, tuple[Callable[[str], object], Callable[[object], object]]] = {
    "model_path": (_identity, _model_path),
    "limit": (_int_text, _integer),
    "n": (_int_text, _attempts),
    "rows": (_identity, _rows),
    "pass_threshold": (_float_text, _finite),
    "dataset_file": (_identity, _dataset_file),
    "sample": (_float_text, _sample),
    "seed": (_int_text, _integer),
    "concurrency": (_int_text, _concurrency),
}


def resolve_settings(cfg: EvalConfig, overrides: Mapping[str, tuple[object, str]]) -> EvalSettings:
    """Apply the winning override per field over ``[evaluation]`` and the defaults.

    ``overrides`` maps a field to ``(value, source)``; ``source`` (``--osmosis-n``,
    ``ini osmosis_n``) names the origin in errors. Only a field left out takes the
    config's value: a blank string is refused like any other bad value.
    """
    evaluation = cfg.evaluation
    values: dict[str, Any] = {
        "model_path": cfg.experiment.model_path,
        "limit": evaluation.limit,
        "n": 1 if evaluation.n is None else evaluation.n,
        "rows": None,
        "pass_threshold": 1.0 if evaluation.pass_threshold is None else evaluation.pass_threshold,
        "dataset_file": None,
        "sample": None,
        "seed": 0,
        "concurrency": _concurrency(evaluation.batch_size or 0),  # absent or <= 0: uncapped
        "agent_timeout_s": evaluation.agent_workflow_timeout_s,
        "grader_timeout_s": evaluation.grader_timeout_s,
    }
    for name, (raw, source) in overrides.items():
        values[name] = _override(name, raw, source)
    return EvalSettings(**values)


def check_overrides(overrides: Mapping[str, tuple[object, str]]) -> None:
    """Refuse a bad command-line/ini value before any config is read (the same checks)."""
    for name, (raw, source) in overrides.items():
        _override(name, raw, source)


def _override(name: str, raw: object, source: str) -> object:
    if name not in _OVERRIDES:
        raise ValueError(f"unknown setting {name!r} (from {source}); valid: {list(_OVERRIDES)}")
    parse, check = _OVERRIDES[name]
    try:
        return check(parse(raw.strip()) if isinstance(raw, str) else raw)
    except ValueError as exc:
        raise ConfigError(_newlines_escaped(f"{source}: {exc}, got {_show(raw)}")) from None


def validate_run_name(name: str, *, source: str = "run name") -> str:
    """Return ``name`` if it is a safe single directory name, else a ``ConfigError``."""
    problem = run_name_problem(name)
    if problem is not None:
        raise ConfigError(_newlines_escaped(f"{source}: {problem}, got {_show(name)}"))
    return name
