"""Eval TOML loading, rollout path rules, settings resolution and run names (contract §2)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from reference_paths import REFERENCE_WORKSPACE, needs_reference

from pytest_osmosis.core.errors import ConfigError
from pytest_osmosis.workspace.config import (
    EvalConfig,
    Experiment,
    load_eval_config,
    resolve_settings,
    validate_rollout_paths,
    validate_run_name,
)

EXPERIMENT = (
    '[experiment]\nrollout = "r"\nentrypoint = "main.py"\n'
    'model_path = "openai/gpt-5-mini"\ndataset = "d"\n'
)
SECRETS = "[secrets]\nrequired = []\n"


def toml(*, top: str = "", exp: str = "", body: str = "", secrets: str = SECRETS) -> str:
    """A valid config, then edited: ``top`` before any table, ``exp`` inside [experiment]."""
    return top + EXPERIMENT + exp + body + secrets


def ev(lines: str) -> str:
    return toml(body=f"[evaluation]\n{lines}\n")


def sec(lines: str) -> str:
    return toml(secrets=f"[secrets]\n{lines}\n")


def drop(key: str) -> str:
    """The valid config without ``key`` in [experiment]."""
    lines = EXPERIMENT.splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith(f"{key} =")) + SECRETS


def load_text(tmp_path: Path, text: str) -> EvalConfig:
    path = tmp_path / "x.toml"
    path.write_text(text, encoding="utf-8")
    return load_eval_config(path)


def config_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'x.toml'}: ")
    assert "\n" not in message
    assert "errors.pydantic.dev" not in message and "Input should" not in message
    return message


BAD_CONFIGS = [
    # syntax and structure
    ("syntax", ev("n = "), "invalid TOML at line 7, column 5"),
    ("unknown-section", toml(body="[local]\nx = 1\n"), "local: unrecognized section (valid: "),
    ("no-experiment", SECRETS, "experiment: missing required section"),
    ("experiment-not-table", "experiment = 3\n" + SECRETS, "experiment: must be a table, got 3"),
    ("evaluation-not-table", toml(top="evaluation = 1\n"), "evaluation: must be a table, got 1"),
    ("env-not-table", toml(top='env = "A=1"\n'), "env: must be a table, got 'A=1'"),
    ("advanced-not-table", toml(top="advanced = [1]\n"), "advanced: must be a table, got [1]"),
    ("secrets-not-table", 'secrets = ["A"]\n' + EXPERIMENT, "secrets: must be a table"),
    # [experiment]
    ("no-rollout", drop("rollout"), "experiment.rollout: missing required key"),
    ("no-entrypoint", drop("entrypoint"), "experiment.entrypoint: missing required key"),
    ("no-model-path", drop("model_path"), "experiment.model_path: missing required key"),
    ("no-dataset", drop("dataset"), "experiment.dataset: missing required key"),
    ("experiment-extra", toml(exp='name = "x"\n'), "experiment.name: unrecognized key (valid: "),
    (
        "rollout-not-str",
        EXPERIMENT.replace('rollout = "r"', "rollout = 1") + SECRETS,
        "experiment.rollout: must be a string, got 1",
    ),
    ("sha-short", toml(exp='commit_sha = "abc12"\n'), "experiment.commit_sha: must be 7-40 hex"),
    ("sha-not-hex", toml(exp='commit_sha = "ghijklm"\n'), "experiment.commit_sha: must be 7-40"),
    ("sha-41", toml(exp=f'commit_sha = "{"a" * 41}"\n'), "experiment.commit_sha: must be 7-40"),
    ("branch-empty", toml(exp='branch = ""\n'), "experiment.branch: must be non-empty"),
    ("branch-space", toml(exp='branch = "my branch"\n'), "experiment.branch: must be non-empty"),
    ("branch-tab", toml(exp='branch = "a\\tb"\n'), "experiment.branch: must be non-empty"),
    (
        "branch-and-sha",
        toml(exp='branch = "main"\ncommit_sha = "abcdef0"\n'),
        "experiment: give either branch or commit_sha, not both",
    ),
    # [evaluation]
    ("evaluation-extra", ev("limits = 3"), "evaluation.limits: unrecognized key (valid: limit,"),
    ("n-zero", ev("n = 0"), "evaluation.n: must be a positive integer, got 0"),
    ("n-negative", ev("n = -2"), "evaluation.n: must be a positive integer, got -2"),
    ("n-bool", ev("n = true"), "evaluation.n: must be a positive integer, got True"),
    ("n-float", ev("n = 1.5"), "evaluation.n: must be a positive integer, got 1.5"),
    ("n-string", ev('n = "2"'), "evaluation.n: must be a positive integer, got '2'"),
    ("limit-float", ev("limit = 1.0"), "evaluation.limit: must be an integer, got 1.0"),
    ("limit-bool", ev("limit = false"), "evaluation.limit: must be an integer, got False"),
    ("batch-str", ev('batch_size = "4"'), "evaluation.batch_size: must be an integer, got '4'"),
    ("threshold-nan", ev("pass_threshold = nan"), "pass_threshold: must be finite, got nan"),
    ("threshold-inf", ev("pass_threshold = -inf"), "pass_threshold: must be finite, got -inf"),
    ("threshold-bool", ev("pass_threshold = true"), "pass_threshold: must be a number, got True"),
    ("threshold-str", ev('pass_threshold = "1"'), "pass_threshold: must be a number, got '1'"),
    (
        "agent-timeout-zero",
        ev("agent_workflow_timeout_s = 0"),
        "evaluation.agent_workflow_timeout_s: must be greater than 0, got 0",
    ),
    (
        "agent-timeout-bool",
        ev("agent_workflow_timeout_s = false"),
        "evaluation.agent_workflow_timeout_s: must be a number, got False",
    ),
    (
        "grader-timeout-negative",
        ev("grader_timeout_s = -1.5"),
        "evaluation.grader_timeout_s: must be greater than 0, got -1.5",
    ),
    ("grader-timeout-inf", ev("grader_timeout_s = inf"), "grader_timeout_s: must be finite"),
    # [env]
    ("env-lowercase", toml(body='[env]\nlower = "x"\n'), "env.lower: invalid variable name"),
    ("env-digit-first", toml(body='[env]\n1A = "x"\n'), "env.1A: invalid variable name"),
    ("env-reserved", toml(body='[env]\n_OSMOSIS_X = "x"\n'), "env._OSMOSIS_X: names starting"),
    ("env-int-value", toml(body="[env]\nA = 1\n"), "env.A: must be a string, got 1"),
    ("env-bool-value", toml(body="[env]\nA = true\n"), "env.A: must be a string, got True"),
    ("env-table-value", toml(body="[env.A]\nB = '1'\n"), "env.A: must be a string, got {'B'"),
    # [secrets]
    ("no-secrets", toml(secrets=""), "secrets: missing required section"),
    ("secrets-extra", sec("required = []\noptional = []"), "secrets.optional: unrecognized key"),
    ("secrets-no-required", toml(secrets="[secrets]\n"), "secrets.required: missing required key"),
    ("required-not-list", sec('required = "A"'), "secrets.required: must be a list, got 'A'"),
    ("required-int-item", sec("required = [1]"), "secrets.required[0]: must be a string, got 1"),
    ("secret-lowercase", sec('required = ["A", "b"]'), "secrets.required[1]: invalid secret name"),
    ("secret-underscore", sec('required = ["_A"]'), "secrets.required[0]: invalid secret name"),
    ("secret-duplicate", sec('required = ["A", "A"]'), "secrets.required: duplicate name(s): A"),
    (
        "env-and-secret",
        toml(body='[env]\nKEY = "1"\n', secrets='[secrets]\nrequired = ["KEY"]\n'),
        "secrets.required: KEY also set in [env]",
    ),
]


@pytest.mark.parametrize(
    ("text", "fragment"), [case[1:] for case in BAD_CONFIGS], ids=[case[0] for case in BAD_CONFIGS]
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, fragment: str) -> None:
    assert fragment in config_error(tmp_path, text)


def test_message_form_with_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    (tmp_path / "configs/eval/x.toml").write_text(ev("n = 0"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_eval_config(Path("configs/eval/x.toml"))
    assert str(info.value) == "configs/eval/x.toml: evaluation.n: must be a positive integer, got 0"


def test_all_issues_reported_together(tmp_path: Path) -> None:
    text = ev("n = 0\nlimit = 1.5\n[env]\nA = 3\n[extra]")
    issues = config_error(tmp_path, text).split(": ", 1)[1].split("; ")
    assert [issue.split(":")[0] for issue in issues] == [
        "evaluation.limit",
        "evaluation.n",
        "env.A",
        "extra",
    ]


def test_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    message = config_error(tmp_path, EXPERIMENT + "\n[evaluation]\nn = = 2\n")
    assert "line 8, column 5" in message


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read config file"):
        load_eval_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_eval_config(tmp_path)
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(toml(exp='branch = "caf\xe9"\n').encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.toml: not valid UTF-8"):
        load_eval_config(latin1)


@needs_reference
def test_reference_config_loads() -> None:
    cfg = load_eval_config(REFERENCE_WORKSPACE / "configs/eval/ref.toml")
    assert cfg.experiment.rollout == "ref-rollout"
    assert cfg.experiment.entrypoint == "main.py"
    assert cfg.experiment.model_path == "openai/gpt-5-mini"
    assert cfg.evaluation.n == 2
    assert cfg.evaluation.agent_workflow_timeout_s == 60.0
    assert isinstance(cfg.evaluation.grader_timeout_s, float)
    assert cfg.env == {"REF_LOG_LEVEL": "info"}
    assert cfg.secrets.required == ["OPENAI_API_KEY"]


def test_minimal_config_defaults(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, toml())
    assert cfg.evaluation.model_dump() == dict.fromkeys(cfg.evaluation.model_dump())
    assert (cfg.advanced, cfg.env, cfg.secrets.required) == ({}, {}, [])
    assert cfg.experiment.branch is None and cfg.experiment.commit_sha is None


def test_good_values_are_kept(tmp_path: Path) -> None:
    text = toml(
        exp='commit_sha = "ABCDEF0123"\n',
        body=(
            "[evaluation]\npass_threshold = 0\nlimit = -1\nbatch_size = 0\n"
            "agent_workflow_timeout_s = 0.5\n"
            '[advanced]\nlr = 0.1\n[advanced.nested]\nk = "v"\n'
            '[env]\n_PRIVATE = "ünïcode"\nA1 = ""\n'
        ),
        secrets='[secrets]\nrequired = ["OPENAI_API_KEY", "B"]\n',
    )
    cfg = load_text(tmp_path, text)
    assert cfg.experiment.commit_sha == "ABCDEF0123"
    assert cfg.evaluation.pass_threshold == 0.0 and isinstance(cfg.evaluation.pass_threshold, float)
    assert (cfg.evaluation.limit, cfg.evaluation.batch_size) == (-1, 0)
    assert cfg.evaluation.agent_workflow_timeout_s == 0.5
    assert cfg.advanced == {"lr": 0.1, "nested": {"k": "v"}}
    assert cfg.env == {"_PRIVATE": "ünïcode", "A1": ""}


@pytest.mark.parametrize("exp", ['branch = "feature/x-1"\n', f'commit_sha = "{"f" * 40}"\n'])
def test_branch_or_sha_alone_is_fine(tmp_path: Path, exp: str) -> None:
    load_text(tmp_path, toml(exp=exp))


# --- rollout paths -------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "rollouts/r/src").mkdir(parents=True)
    (tmp_path / "rollouts/r/main.py").write_text("")
    (tmp_path / "rollouts/r/src/entry.py").write_text("")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/main.py").write_text("")
    return tmp_path


def experiment(rollout: str = "r", entrypoint: str = "main.py") -> Experiment:
    return Experiment(rollout=rollout, entrypoint=entrypoint, model_path="m", dataset="d")


def test_rollout_paths_ok(workspace: Path) -> None:
    got = validate_rollout_paths(workspace, experiment(), Path("c.toml"))
    assert got == (workspace / "rollouts/r/main.py").resolve() and got.is_absolute()
    nested = validate_rollout_paths(workspace, experiment(entrypoint="src/entry.py"), Path("c"))
    assert nested == (workspace / "rollouts/r/src/entry.py").resolve()


@pytest.mark.parametrize("rollout", ["", ".", "..", "r/src", "r\\src", "/abs", "missing", "out"])
def test_bad_rollout(workspace: Path, rollout: str) -> None:
    (workspace / "rollouts/out").symlink_to(workspace / "outside")
    with pytest.raises(ConfigError, match=r"^c\.toml: experiment\.rollout: "):
        validate_rollout_paths(workspace, experiment(rollout=rollout), Path("c.toml"))


@pytest.mark.parametrize(
    "entrypoint", ["", ".", "src", "../../outside/main.py", "nope.py", "src/../../r", "a\0b"]
)
def test_bad_entrypoint(workspace: Path, entrypoint: str) -> None:
    with pytest.raises(ConfigError, match=r"^c\.toml: experiment\.entrypoint: "):
        validate_rollout_paths(workspace, experiment(entrypoint=entrypoint), Path("c.toml"))


def test_absolute_entrypoint_outside_is_refused(workspace: Path) -> None:
    outside = str(workspace / "outside/main.py")
    with pytest.raises(ConfigError, match=r"experiment\.entrypoint: must be a file path inside"):
        validate_rollout_paths(workspace, experiment(entrypoint=outside), Path("c.toml"))


def test_missing_entrypoint_names_the_path(workspace: Path) -> None:
    with pytest.raises(ConfigError) as info:
        validate_rollout_paths(workspace, experiment(entrypoint="gone.py"), Path("c.toml"))
    assert str((workspace / "rollouts/r/gone.py").resolve()) in str(info.value)


# --- settings ------------------------------------------------------------------------


@pytest.fixture
def minimal(tmp_path: Path) -> EvalConfig:
    return load_text(tmp_path, toml())


@pytest.fixture
def ref() -> EvalConfig:
    if not REFERENCE_WORKSPACE.is_dir():
        pytest.skip(needs_reference.kwargs["reason"])
    return load_eval_config(REFERENCE_WORKSPACE / "configs/eval/ref.toml")


def test_defaults(minimal: EvalConfig) -> None:
    settings = resolve_settings(minimal, {})
    assert dataclasses.asdict(settings) == {
        "model_path": "openai/gpt-5-mini",
        "limit": None,
        "n": 1,
        "rows": None,
        "pass_threshold": 1.0,
        "dataset_file": None,
        "sample": None,
        "seed": 0,
        "concurrency": None,
        "agent_timeout_s": None,
        "grader_timeout_s": None,
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.n = 2  # type: ignore[misc]


def test_toml_values_then_overrides(ref: EvalConfig) -> None:
    settings = resolve_settings(ref, {})
    assert (settings.n, settings.agent_timeout_s, settings.grader_timeout_s) == (2, 60.0, 30.0)
    overridden = resolve_settings(ref, {"n": ("5", "ini osmosis_n"), "model_path": ("x/y", "-m")})
    assert (overridden.n, overridden.model_path) == (5, "x/y")
    assert resolve_settings(ref, {"n": (7, "--osmosis-n")}).n == 7


@pytest.mark.parametrize(("batch_size", "expected"), [(8, 8), (0, None), (-3, None)])
def test_batch_size_is_concurrency(tmp_path: Path, batch_size: int, expected: int | None) -> None:
    cfg = load_text(tmp_path, toml(body=f"[evaluation]\nbatch_size = {batch_size}\n"))
    assert resolve_settings(cfg, {}).concurrency == expected


def test_toml_limit_and_threshold(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, ev("limit = 0\npass_threshold = 0"))
    settings = resolve_settings(cfg, {})
    assert (settings.limit, settings.pass_threshold) == (0, 0.0)


@pytest.mark.parametrize(
    ("field", "raw", "expected"),
    [
        ("limit", "10", 10),
        ("limit", " -1 ", -1),
        ("limit", 3, 3),
        ("pass_threshold", "0.5", 0.5),
        ("pass_threshold", "0", 0.0),
        ("pass_threshold", 1, 1.0),
        ("sample", "0.1", 0.1),
        ("sample", "1", 1.0),
        ("seed", "42", 42),
        ("seed", -7, -7),
        ("concurrency", "8", 8),
        ("concurrency", "0", None),
        ("rows", " 0-3,7 ", "0-3,7"),
        ("rows", "5-5", "5-5"),
        ("dataset_file", "data/x.jsonl", Path("data/x.jsonl")),
        ("dataset_file", Path("/abs/x.csv"), Path("/abs/x.csv")),
        ("model_path", " openai/gpt-4o ", "openai/gpt-4o"),
    ],
)
def test_override_parsing(ref: EvalConfig, field: str, raw: object, expected: object) -> None:
    got = getattr(resolve_settings(ref, {field: (raw, "src")}), field)
    assert got == expected and type(got) is type(expected)


OVERRIDE_FIELDS = [
    "model_path", "limit", "n", "rows", "pass_threshold", "dataset_file", "sample", "seed",
    "concurrency",
]


@pytest.mark.parametrize("field", OVERRIDE_FIELDS)
@pytest.mark.parametrize("blank", ["", "  "])
def test_blank_string_override_is_refused(ref: EvalConfig, field: str, blank: str) -> None:
    """Only a field left out takes the config's value (a blank $ROWS is not every row)."""
    with pytest.raises(ConfigError, match="^ini x: must ") as info:
        resolve_settings(ref, {field: (blank, "ini x")})
    assert str(info.value).endswith(f"got {blank!r}")


@pytest.mark.parametrize(
    ("field", "raw", "fragment"),
    [
        ("n", "0", "must be a positive integer, got '0'"),
        ("n", 0, "must be a positive integer, got 0"),
        ("n", "abc", "must be a positive integer"),
        ("n", True, "must be a positive integer, got True"),
        ("n", "1.5", "must be a positive integer"),
        ("limit", "x", "must be an integer, got 'x'"),
        ("limit", 2.0, "must be an integer"),
        ("seed", "1.5", "must be an integer"),
        ("concurrency", "many", "must be an integer"),
        ("pass_threshold", "nan", "must be finite"),
        ("pass_threshold", "inf", "must be finite"),
        ("pass_threshold", "high", "must be a number"),
        ("pass_threshold", False, "must be a number"),
        ("sample", "0", "must be a fraction in (0, 1]"),
        ("sample", "1.5", "must be a fraction"),
        ("sample", "-0.1", "must be a fraction"),
        ("sample", "nan", "must be finite"),
        ("rows", "a", "must be comma-separated row indices"),
        ("rows", "1-", "must be comma-separated"),
        ("rows", "-1", "must be comma-separated"),
        ("rows", "1, 2", "must be comma-separated"),
        ("rows", "0,5-3", "range 5-3 is inverted"),
        ("rows", 5, "must be a string of row indices"),
        ("model_path", 3, "must be a model id"),
        ("dataset_file", 3, "must be a file path"),
    ],
)
def test_bad_override(ref: EvalConfig, field: str, raw: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_settings(ref, {field: (raw, "--osmosis-x")})
    assert str(info.value).startswith("--osmosis-x: ")
    assert fragment in str(info.value)


def test_override_error_exact_message(ref: EvalConfig) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_settings(ref, {"n": ("0", "--osmosis-n")})
    assert str(info.value) == "--osmosis-n: must be a positive integer, got '0'"


def test_unknown_override_is_a_caller_bug(ref: EvalConfig) -> None:
    with pytest.raises(ValueError, match="unknown setting 'batch'"):
        resolve_settings(ref, {"batch": ("1", "ini osmosis_batch")})


# --- run names -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nightly", "a.b_c-1", "9lives", "café", "x" * 96])
def test_valid_run_names(name: str) -> None:
    assert validate_run_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "x" * 97, "a/b", "a\\b", "a\0b", ".", "..", ".locks", "-x", ".x", "a b", "a:b"]
)
def test_invalid_run_names(name: str) -> None:
    with pytest.raises(ConfigError, match="^--osmosis-name: ") as info:
        validate_run_name(name, source="--osmosis-name")
    assert "\n" not in str(info.value)
