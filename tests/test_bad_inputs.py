"""The bad-input catalogue (issue 6, point 1): broken workspaces meet a real pytest session.

Each case writes a valid workspace, breaks one thing, and runs
``pytest --osmosis-eval`` in process. Whatever the user got wrong must come back as a
collection error (exit 2) or a usage error (exit 4) whose one line names the place (file,
row, key, option), never as pytest's INTERNALERROR or a traceback through our code, and
must leave no run directory behind. The model endpoint is a dead loopback port, so
nothing could leave the machine even if a case reached the model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# hypothesis and pytest_osmosis.* are imported only to stay loaded: pytester restores
# sys.modules after each in-process run, and ~80 runs re-importing the plugin's pydantic
# models (and hypothesis, which its pytest plugin imports at every terminal summary)
# would double this file's run time.
import hypothesis  # noqa: F401
import pytest
from workspaces import calc_rows, toml_text, write_workspace

import pytest_osmosis.plugin.collect  # noqa: F401
import pytest_osmosis.plugin.discover  # noqa: F401
import pytest_osmosis.plugin.session  # noqa: F401
import pytest_osmosis.results  # noqa: F401
import pytest_osmosis.rollout  # noqa: F401

pytest_plugins = ["pytester"]

DEAD_ENDPOINT = "http://127.0.0.1:9/v1"
VALID = toml_text()
EXPERIMENT = VALID.split("[secrets]")[0]
SECRETS = "[secrets]\nrequired = []\n"

Build = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    """One broken workspace and the words its error line must contain."""

    id: str
    build: Build
    expect: tuple[str, ...]  # all on one output line
    args: tuple[str, ...] = ()
    rollout_traceback: str | None = None  # '<file>", line N' of the rollout's own frame

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


# --------------------------------------------------------------------------- #
# Builders: a valid workspace, then one thing broken
# --------------------------------------------------------------------------- #


def valid(**toml: Any) -> Build:
    def build(root: Path) -> None:
        write_workspace(root, **toml)

    return build


def config(text: str | bytes) -> Build:
    """The valid workspace with ``configs/eval/calc.toml`` replaced by ``text``."""

    def build(root: Path) -> None:
        path = write_workspace(root)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)

    return build


def evaluation(lines: str) -> Build:
    return config(EXPERIMENT + "[evaluation]\n" + lines + "\n" + SECRETS)


def data(name: str, content: bytes | str | Callable[[Path], None]) -> Build:
    """The valid workspace with its dataset replaced by ``data/<name>``."""

    def build(root: Path) -> None:
        write_workspace(root)
        (root / "data" / "calc.jsonl").unlink()
        path = root / "data" / name
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")

    return build


def jsonl(*lines: Any) -> Build:
    """A JSONL dataset; dicts are dumped, strings written as they are."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    return data("calc.jsonl", text)


def parquet(columns: dict[str, Any]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.table(columns), path)

    return write


def rollout(source: str) -> Build:
    return valid(rollout_source=source)


def package_init(source: str) -> Build:
    """The valid workspace with ``rollouts/calc/__init__.py`` (a rollout that is a package)."""

    def build(root: Path) -> None:
        write_workspace(root)
        (root / "rollouts" / "calc" / "__init__.py").write_text(source)

    return build


def symlinked_rollout(root: Path) -> None:
    """``rollouts/calc`` is a symlink to a directory outside ``rollouts/``."""
    write_workspace(root)
    outside = root / "elsewhere"
    (root / "rollouts" / "calc").rename(outside)
    (root / "rollouts" / "calc").symlink_to(outside, target_is_directory=True)


def no_entrypoint(root: Path) -> None:
    write_workspace(root)
    (root / "rollouts" / "calc" / "main.py").unlink()


def no_rollout_dir(root: Path) -> None:
    write_workspace(root)
    config_path = root / "configs" / "eval" / "calc.toml"
    text = config_path.read_text().replace('rollout = "calc"', 'rollout = "nope"')
    config_path.write_text(text)


def no_dataset(root: Path) -> None:
    write_workspace(root)
    (root / "data" / "calc.jsonl").unlink()


def dataset_of_another_name(root: Path) -> None:
    """The config names ``ref-dataset`` (the platform's name an SDK run gave a file for with
    ``--dataset-file``) and data/ holds ``ref.jsonl``, as in the reference workspace."""
    write_workspace(root, dataset="ref-dataset")
    (root / "data" / "ref-dataset.jsonl").rename(root / "data" / "ref.jsonl")
    (root / "data" / "notes.txt").write_text("not a dataset\n")


def ini(text: str) -> Build:
    def build(root: Path) -> None:
        write_workspace(root)
        (root / "pytest.ini").write_text("[pytest]\n" + text + "\n")

    return build


# --------------------------------------------------------------------------- #
# Rollout sources
# --------------------------------------------------------------------------- #

IMPORTS = "from pytest_osmosis.rollout import AgentWorkflow, Grader, LocalBackend\n"
WORKFLOW = "class Flow(AgentWorkflow):\n    async def run(self, ctx):\n        return None\n"
GRADER = "class Judge(Grader):\n    async def grade(self, ctx):\n        ctx.set_reward(1.0)\n"
RAISES_ON_IMPORT = (
    "import json\n"  # line 1
    "\n"
    "def connect():\n"
    "    raise RuntimeError('database at db.internal is unreachable')\n"  # line 4
    "\n"
    "connect()\n"  # line 6
)
SYNTAX_ERROR = IMPORTS + "class Flow(AgentWorkflow):\n    async def run(self, ctx)\n        pass\n"
MISSING_MODULE = "import definitely_not_installed_pkg_xyz\n"
# What `from osmosis_ai.rollout import ...` raises where the SDK is not installed (raised
# as such: a test environment may have the SDK).
MISSING_SDK = 'raise ModuleNotFoundError("No module named \'osmosis_ai\'", name="osmosis_ai")\n'
EXITS_ON_IMPORT = "import sys\n\nsys.exit(3)\n"
MAIN_RAISES = (
    IMPORTS
    + WORKFLOW
    + GRADER
    + "\ndef main():\n    raise KeyError('ROLLOUT_MODE')\n"  # the raise is line 10
)
TWO_BACKENDS = (
    IMPORTS
    + WORKFLOW
    + GRADER
    + "a = LocalBackend(workflow=Flow, grader=Judge)\n"
    + "b = LocalBackend(workflow=Flow, grader=Judge)\n"
)


# --------------------------------------------------------------------------- #
# The catalogue
# --------------------------------------------------------------------------- #

TOML_CASES = [
    Case(
        "toml-unclosed-table",
        config("[experiment\nrollout = 'calc'\n"),
        ("calc.toml", "invalid TOML at line 1"),
    ),
    Case("toml-missing-value", evaluation("n = "), ("calc.toml", "invalid TOML at line 7")),
    Case(
        "toml-duplicate-key",
        config(VALID.replace("[secrets]", 'rollout = "calc"\n[secrets]')),
        ("calc.toml", "invalid TOML at line 6"),
    ),
    Case(
        "toml-not-utf8", config(VALID.encode() + b"# caf\xe9\n"), ("calc.toml", "not valid UTF-8")
    ),
    Case(
        "unknown-section",
        config(VALID + "[local]\nworkers = 2\n"),
        ("calc.toml", "local: unrecognized section"),
    ),
    Case(
        "unknown-experiment-key",
        config(VALID.replace("[secrets]", 'modle = "x"\n[secrets]')),
        ("calc.toml", "experiment.modle: unrecognized key", "model_path"),
    ),
    Case(
        "unknown-evaluation-key",
        evaluation("batchsize = 4"),
        ("calc.toml", "evaluation.batchsize: unrecognized key", "batch_size"),
    ),
    Case(
        "unknown-secrets-key",
        config(VALID + "optional = []\n"),
        ("calc.toml", "secrets.optional: unrecognized key"),
    ),
    Case(
        "missing-experiment", config(SECRETS), ("calc.toml", "experiment: missing required section")
    ),
    Case(
        "missing-model-path",
        config(VALID.replace('model_path = "openai/test-model"\n', "")),
        ("calc.toml", "experiment.model_path: missing required key"),
    ),
    Case(
        "experiment-not-table",
        config("experiment = 'calc'\n" + SECRETS),
        ("calc.toml", "experiment: must be a table"),
    ),
    Case(
        "rollout-not-string",
        config(VALID.replace('rollout = "calc"', "rollout = 3")),
        ("calc.toml", "experiment.rollout: must be a string, got 3"),
    ),
    Case(
        "n-is-string",
        evaluation('n = "2"'),
        ("calc.toml", "evaluation.n: must be a positive integer, got '2'"),
    ),
    Case(
        "threshold-is-bool",
        evaluation("pass_threshold = true"),
        ("calc.toml", "evaluation.pass_threshold: must be a number, got True"),
    ),
    Case(
        "env-value-not-string",
        config(EXPERIMENT + "[env]\nMODE = 1\n" + SECRETS),
        ("calc.toml", "env.MODE: must be a string, got 1"),
    ),
    Case(
        "secrets-required-not-list",
        config(EXPERIMENT + '[secrets]\nrequired = "TOKEN"\n'),
        ("calc.toml", "secrets.required: must be a list"),
    ),
    Case(
        "branch-and-commit-sha",
        config(VALID.replace("[secrets]", 'branch = "main"\ncommit_sha = "abcdef1"\n[secrets]')),
        ("calc.toml", "either branch or commit_sha, not both"),
    ),
    Case(
        "missing-secrets",
        config(EXPERIMENT),
        ("calc.toml", "secrets: missing required section", "required = []"),
    ),
    Case(
        "env-name-lowercase",
        valid(env={"mode": "fast"}),
        ("calc.toml", "env.mode", "^[A-Z_][A-Z0-9_]*$"),
    ),
    Case(
        "env-name-reserved",
        valid(env={"_OSMOSIS_ROLLOUT_PORT": "1"}),
        ("calc.toml", "env._OSMOSIS_ROLLOUT_PORT", "reserved"),
    ),
    Case(
        "secret-name-invalid",
        valid(secrets=["api-key"]),
        ("calc.toml", "secrets.required[0]", "'api-key'"),
    ),
    Case(
        "name-in-env-and-secrets",
        valid(env={"TOKEN": "x"}, secrets=["TOKEN"]),
        ("calc.toml", "secrets.required: TOKEN also set in [env]"),
    ),
    Case(
        "secret-not-set",
        valid(secrets=["CATALOGUE_UNSET_TOKEN"]),
        ("calc.toml", "[secrets] required CATALOGUE_UNSET_TOKEN", "no value was found"),
    ),
]

PATH_CASES = [
    Case(
        "rollout-parent",
        valid(rollout=".."),
        ("calc.toml", "experiment.rollout: must be one directory name under rollouts/"),
    ),
    Case(
        "rollout-with-slash",
        config(VALID.replace('rollout = "calc"', 'rollout = "../calc"')),
        ("calc.toml", "experiment.rollout: must be one directory name", "'../calc'"),
    ),
    Case(
        "rollout-symlink-outside",
        symlinked_rollout,
        ("calc.toml", "experiment.rollout: must resolve to a directory under"),
    ),
    Case(
        "rollout-dir-missing",
        no_rollout_dir,
        ("calc.toml", "experiment.rollout: rollout directory not found", "rollouts/nope"),
    ),
    Case(
        "rollout-name-too-long",
        config(VALID.replace('rollout = "calc"', f'rollout = "{"r" * 300}"')),
        ("calc.toml", "experiment.rollout: cannot be used (File name too long)"),
    ),
    Case(
        "entrypoint-escapes",
        config(VALID.replace('"main.py"', '"../../configs/eval/calc.toml"')),
        ("calc.toml", "experiment.entrypoint: must be a file path inside rollouts/calc/"),
    ),
    Case(
        "entrypoint-missing",
        no_entrypoint,
        ("calc.toml", "experiment.entrypoint: file not found", "rollouts/calc/main.py"),
    ),
    Case(
        "entrypoint-name-too-long",
        config(VALID.replace('"main.py"', f'"{"m" * 300}.py"')),
        ("calc.toml", "experiment.entrypoint: cannot be used (File name too long)"),
    ),
]

# The collection header names the config; these lines name the dataset file and its row.
DATASET_CASES = [
    Case(
        "dataset-missing",
        no_dataset,
        (
            "no dataset file for experiment.dataset 'calc'",
            "data/calc.jsonl",
            "data/calc.csv",
            "data/calc.parquet (or give the file with --osmosis-dataset-file PATH)",
        ),
    ),
    Case(
        "dataset-of-another-name",
        dataset_of_another_name,
        (
            "no dataset file for experiment.dataset 'ref-dataset'",
            "data/ref-dataset.parquet (data/ holds ref.jsonl: name one in experiment.dataset "
            "without its extension, or give the file with --osmosis-dataset-file PATH)",
        ),
    ),
    Case(
        "dataset-name-with-extension",
        config(VALID.replace('dataset = "calc"', 'dataset = "calc.jsonl"')),
        ("experiment.dataset 'calc.jsonl'", "data/calc.jsonl.jsonl", "try 'calc'"),
    ),
    Case(
        "dataset-name-too-long",
        config(VALID.replace('dataset = "calc"', f'dataset = "{"d" * 300}"')),
        ("experiment.dataset 'ddd", "cannot be looked up", "File name too long"),
    ),
    Case("dataset-empty", jsonl(), ("calc.jsonl selected no rows (it has 0 rows)",)),
    Case(
        "prompt-row-without-label",
        jsonl(*calc_rows([("1+1?", "2")]), {"user_prompt": "2+2?"}),
        ("calc.jsonl: row 1 (line 2)", "ground_truth (or label) is required"),
    ),
    Case(
        "label-without-prompt",
        jsonl({"ground_truth": "4"}),
        ("calc.jsonl: row 0 (line 1)", "user_prompt is required"),
    ),
    Case(
        "metadata-row-empty",
        jsonl(*calc_rows([("1+1?", "2")]), {"metadata": {}}),
        ("calc.jsonl: row 1 (line 2)", "has no prompt and no metadata"),
    ),
    Case(
        "metadata-not-object",
        jsonl({"user_prompt": "q", "metadata": [1, 2]}),
        ("calc.jsonl: row 0 (line 1)", "metadata must be a JSON object, got list"),
    ),
    Case(
        "metadata-string-not-json",
        jsonl({"user_prompt": "q", "metadata": "{oops"}),
        ("calc.jsonl: row 0 (line 1)", "metadata is not valid JSON"),
    ),
    Case(
        "jsonl-invalid-line",
        jsonl(*calc_rows([("1+1?", "2")]), '{"user_prompt": "x",'),
        ("calc.jsonl:2: invalid JSON",),
    ),
    Case(
        "jsonl-line-is-array",
        jsonl(*calc_rows([("1+1?", "2")]), "", '["user_prompt", "x"]'),
        ("calc.jsonl:3: each line must be a JSON object, got a JSON array",),
    ),
    Case(
        "jsonl-not-utf8",
        data("calc.jsonl", b'{"user_prompt": "caf\xe9", "label": "x"}\n'),
        ("calc.jsonl:1: not valid UTF-8",),
    ),
    Case(
        "csv-unterminated-quote",
        data("calc.csv", 'user_prompt,ground_truth\n"What is 2+2?,4\nWhat is 3*5?,15\n'),
        ("calc.csv: row 0 (line 2)", "ground_truth (or label) is required"),
    ),
    Case(
        "csv-field-too-large",
        data("calc.csv", 'user_prompt,ground_truth\n"' + "x" * (16 * 1024 * 1024 + 1) + '",4\n'),
        ("calc.csv:", "invalid CSV (field larger than field limit"),
    ),
    Case("csv-empty", data("calc.csv", ""), ("calc.csv: the CSV file is empty",)),
    Case(
        "parquet-metadata-int",
        data("calc.parquet", parquet({"user_prompt": ["q"], "metadata": [7]})),
        ("calc.parquet: row 0", "metadata must be a JSON object, got int"),
    ),
    Case(
        "parquet-no-label",
        data("calc.parquet", parquet({"user_prompt": ["q"], "answer": [4]})),
        ("calc.parquet: row 0", "ground_truth (or label) is required"),
    ),
    Case(
        "parquet-garbage",
        data("calc.parquet", b"PAR1 this is not parquet PAR1"),
        ("calc.parquet: not a readable Parquet file",),
    ),
    Case(
        "dataset-file-missing",
        valid(),
        ("dataset file", "nowhere.jsonl does not exist"),
        args=("--osmosis-dataset-file", "nowhere.jsonl"),
    ),
]

def output_symlink_loop(root: Path) -> None:
    """The valid workspace, and ``loop``: a symlink to itself, given as --osmosis-output."""
    write_workspace(root)
    os.symlink("loop", root / "loop")


OPTION_CASES = [
    Case(
        "output-symlink-loop",  # issue 26: INTERNALERROR (OSError: too many levels of links)
        output_symlink_loop,
        ("--osmosis-output", "loop", "symbolic link"),
        args=("--osmosis-output", "loop"),
    ),
    Case(
        "n-zero",
        evaluation("n = 0"),
        ("calc.toml", "evaluation.n: must be a positive integer, got 0"),
    ),
    Case(
        "n-int64-max",  # issue 14: hung building items, then INTERNALERROR MemoryError
        evaluation("n = 9223372036854775807"),
        ("calc.toml", "evaluation.n: must be a positive integer of at most 10,000, got 922"),
    ),
    Case(
        "cli-n-huge",
        valid(),
        ("--osmosis-n: must be a positive integer of at most 10,000, got '10001'",),
        args=("--osmosis-n", "10001"),
    ),
    Case(
        "rows-times-n-huge",
        lambda root: write_workspace(
            root,
            rows=[{"user_prompt": f"q{i}", "ground_truth": "a"} for i in range(1001)],
            evaluation={"n": 10_000},
        ),
        ("calc.toml", "evaluation.n: 1,001 rows x 10,000 attempts is 10,010,000 items"),
    ),
    Case(
        "limit-is-float",
        evaluation("limit = 1.5"),
        ("calc.toml", "evaluation.limit: must be an integer, got 1.5"),
    ),
    Case(
        "cli-n-zero",
        valid(),
        ("--osmosis-n: must be a positive integer, got '0'",),
        args=("--osmosis-n", "0"),
    ),
    Case(
        "cli-n-word",
        valid(),
        ("--osmosis-n: must be a positive integer, got 'two'",),
        args=("--osmosis-n", "two"),
    ),
    Case("ini-n-word", ini("osmosis_n = zero"), ("ini osmosis_n: must be a positive integer",)),
    Case(
        "cli-limit-float",
        valid(),
        ("--osmosis-limit: must be an integer, got '2.5'",),
        args=("--osmosis-limit", "2.5"),
    ),
    Case(
        "rows-outside-dataset",
        valid(),
        ("calc.jsonl has 2 rows", "selects 5", "valid indices are 0-1"),
        args=("--osmosis-rows", "0,5"),
    ),
    Case(
        "rows-inverted",
        valid(),
        ("--osmosis-rows: range 3-1 is inverted",),
        args=("--osmosis-rows", "3-1"),
    ),
    Case(
        "rows-negative",
        valid(),
        ("--osmosis-rows: must be comma-separated row indices",),
        args=("--osmosis-rows=-1",),
    ),
    Case(
        "threshold-nan-toml",
        evaluation("pass_threshold = nan"),
        ("calc.toml", "evaluation.pass_threshold: must be finite, got nan"),
    ),
    Case(
        "threshold-inf-toml",
        evaluation("pass_threshold = -inf"),
        ("calc.toml", "evaluation.pass_threshold: must be finite, got -inf"),
    ),
    Case(
        "threshold-nan-cli",
        valid(),
        ("--osmosis-pass-threshold: must be finite, got 'nan'",),
        args=("--osmosis-pass-threshold", "nan"),
    ),
    Case(
        "sample-zero",
        valid(),
        ("--osmosis-sample: must be a fraction in (0, 1], got '0'",),
        args=("--osmosis-sample", "0"),
    ),
    Case(
        "sample-nan",
        valid(),
        ("--osmosis-sample: must be finite, got 'nan'",),
        args=("--osmosis-sample", "nan"),
    ),
    Case(
        "concurrency-zero",
        valid(),
        ("--osmosis-concurrency: must be a positive integer, got '0'",),
        args=("--osmosis-concurrency", "0"),
    ),
    Case(
        "run-name-traversal",
        valid(),
        ("run name", "single path segment", "'../escape'"),
        args=("--osmosis-name", "../escape"),
    ),
]

ROLLOUT_CASES = [
    Case(
        "rollout-raises-on-import",
        rollout(RAISES_ON_IMPORT),
        ("main.py", "importing the rollout failed: RuntimeError: database at db.internal"),
        rollout_traceback='main.py", line 4',
    ),
    Case(
        "rollout-syntax-error",
        rollout(SYNTAX_ERROR),
        ("main.py", "importing the rollout failed: SyntaxError"),
        rollout_traceback='main.py", line 3',
    ),
    Case(
        "rollout-missing-module",
        rollout(MISSING_MODULE),
        ("main.py", "ModuleNotFoundError", "definitely_not_installed_pkg_xyz"),
        rollout_traceback='main.py", line 1',
    ),
    Case(
        "rollout-without-the-sdk",
        rollout(MISSING_SDK),
        (
            "main.py",
            "ModuleNotFoundError: No module named 'osmosis_ai' (",
            "import the same names from pytest_osmosis.rollout",
        ),
        rollout_traceback='main.py", line 1',
    ),
    Case(
        "rollout-exits-on-import",
        rollout(EXITS_ON_IMPORT),
        ("main.py", "importing the rollout called sys.exit(3)"),
        rollout_traceback='main.py", line 3',
    ),
    Case(
        "rollout-main-raises",
        rollout(MAIN_RAISES),
        ("main.py", "main() raised before building its LocalBackend: KeyError"),
        rollout_traceback='main.py", line 10',
    ),
    Case("no-workflow", rollout(IMPORTS + GRADER), ("main.py", "no workflow found")),
    Case(
        "several-workflows",
        rollout(IMPORTS + WORKFLOW + WORKFLOW.replace("Flow", "Flow2") + GRADER),
        ("main.py", "several workflow classes (Flow, Flow2)", "osmosis_workflow"),
    ),
    Case("no-grader", rollout(IMPORTS + WORKFLOW), ("main.py", "no grader found")),
    Case(
        "several-graders",
        rollout(IMPORTS + WORKFLOW + GRADER + GRADER.replace("Judge", "Judge2")),
        ("main.py", "several grader classes (Judge, Judge2)", "osmosis_grader"),
    ),
    Case("two-backends", rollout(TWO_BACKENDS), ("main.py", "2 LocalBackend objects")),
    Case(
        "package-init-raises",  # issue 14: INTERNALERROR
        package_init(RAISES_ON_IMPORT),
        ("__init__.py", "importing the rollout failed: RuntimeError: database at db.internal"),
        rollout_traceback='__init__.py", line 4',
    ),
    Case(
        "package-init-exits",
        package_init(EXITS_ON_IMPORT),
        ("__init__.py", "importing the rollout called sys.exit(3)"),
        rollout_traceback='__init__.py", line 3',
    ),
]

PLAN_CASES = [*TOML_CASES, *PATH_CASES, *DATASET_CASES, *OPTION_CASES]
ALL_CASES = [*PLAN_CASES, *ROLLOUT_CASES]


# --------------------------------------------------------------------------- #
# The checks
# --------------------------------------------------------------------------- #


@pytest.fixture(autouse=True)
def offline_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A dead loopback model endpoint; os.environ restored (rollout [env] is applied in process)."""
    saved = dict(os.environ)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-catalogue-dead-endpoint")
    monkeypatch.setenv("OPENAI_API_BASE", DEAD_ENDPOINT)
    monkeypatch.setenv("OPENAI_BASE_URL", DEAD_ENDPOINT)
    monkeypatch.setenv("LITELLM_OFFLINE_MODE", "true")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("CATALOGUE_UNSET_TOKEN", raising=False)
    yield
    os.environ.clear()
    os.environ.update(saved)


def run_case(pytester: pytest.Pytester, case: Case, *extra: str) -> tuple[int, str]:
    case.build(pytester.path)
    result = pytester.runpytest("--osmosis-eval", "-p", "no:cacheprovider", *case.args, *extra)
    return int(result.ret), "\n".join([*result.outlines, *result.errlines])


def assert_refused_cleanly(pytester: pytest.Pytester, case: Case, ret: int, output: str) -> None:
    assert ret in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR), output
    if ret == pytest.ExitCode.INTERRUPTED:
        assert "Interrupted: 1 error during collection" in output, output
    else:
        assert "ERROR: " in output, output
    lines = output.splitlines()
    assert any(all(word in line for word in case.expect) for line in lines), (
        f"no output line contains all of {case.expect}:\n{output}"
    )
    assert "INTERNALERROR" not in output
    # Our own frames never show; pytest's only when a rollout frame is the point.
    assert "pytest_osmosis/" not in output.replace(str(pytester.path), "<ws>"), output
    if case.rollout_traceback is None:
        assert "Traceback" not in output, output
    else:
        assert case.rollout_traceback in output, output
        assert "_pytest/" not in output, output
    # Not even a lock file or an empty output root: a refused session writes nothing.
    left = sorted(str(p.relative_to(pytester.path)) for p in pytester.path.glob(".osmosis/**/*"))
    assert not (pytester.path / ".osmosis").exists(), f"a refused session left {left} behind"


@pytest.mark.parametrize("case", [c.param() for c in PLAN_CASES])
def test_bad_input_is_refused_naming_the_place(pytester: pytest.Pytester, case: Case) -> None:
    ret, output = run_case(pytester, case)
    assert_refused_cleanly(pytester, case, ret, output)


@pytest.mark.parametrize("case", [c.param() for c in ROLLOUT_CASES])
def test_bad_rollout_is_refused_naming_the_place(pytester: pytest.Pytester, case: Case) -> None:
    """What collection says about a broken rollout. ``--collect-only`` skips the session
    start (run directory, model preflight), so this checks the message on its own."""
    ret, output = run_case(pytester, case, "--collect-only")
    assert_refused_cleanly(pytester, case, ret, output)


def test_bad_rollout_is_refused_before_the_run_starts(pytester: pytest.Pytester) -> None:
    """A real session: the broken entrypoint must be reported, naming it, before a run
    directory exists or the model is called (the dead endpoint would refuse it first)."""
    case = ROLLOUT_CASES[0]
    ret, output = run_case(pytester, case)
    assert_refused_cleanly(pytester, case, ret, output)


@pytest.mark.parametrize("case", [c.param() for c in ROLLOUT_CASES if c.id.startswith("package-")])
def test_bad_package_init_is_refused_before_the_run_starts(
    pytester: pytest.Pytester, case: Case
) -> None:
    """The session start imports the rollout too: a raising ``__init__.py`` was an
    INTERNALERROR there, not a collection error."""
    ret, output = run_case(pytester, case)
    assert_refused_cleanly(pytester, case, ret, output)


def test_catalogue_has_at_least_40_distinct_cases() -> None:
    assert len({case.id for case in ALL_CASES}) == len(ALL_CASES) >= 40


# --------------------------------------------------------------------------- #
# Stored inputs: what an earlier session left, damaged
# --------------------------------------------------------------------------- #

#: A recorded answer with its usage made negative (as a hand edit or a bad provider would).
NEGATIVE_USAGE = {
    "id": "x",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": -5000000},
}

#: (id, the entry's stored answer, the words its row's error line must hold)
DAMAGED_CACHE_ENTRIES = [
    ("not-json", "{not json", "not JSON"),
    ("a-list", "[]", "not a JSON object but list"),
    ("empty-object", "{}", "no choices"),
    ("choice-without-message", '{"choices": [{"index": 0}]}', "choice 0 has no message object"),
    (
        "negative-usage",
        json.dumps(NEGATIVE_USAGE),
        "usage.total_tokens is -5000000, not a non-negative integer",
    ),
    (
        "usage-as-text",
        json.dumps({**NEGATIVE_USAGE, "usage": {"prompt_tokens": "5"}}),
        "usage.prompt_tokens is '5', not a non-negative integer",
    ),
]


@pytest.mark.parametrize(
    ("stored", "words"),
    [pytest.param(stored, words, id=case) for case, stored, words in DAMAGED_CACHE_ENTRIES],
)
def test_a_damaged_cache_entry_fails_its_row_under_replay_naming_file_and_key(
    pytester: pytest.Pytester,
    model_env: Any,
    monkeypatch: pytest.MonkeyPatch,
    stored: str,
    words: str,
) -> None:
    """Never served: the row is ``cache_corrupt``, its line names the cache file and the key."""
    import sqlite3

    from pytest_osmosis.model.cache import cache_path

    write_workspace(pytester.path, rows=calc_rows([("What is 2 + 2?", "4")]))
    recorded = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "record", "--osmosis-name", "first",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    recorded.assert_outcomes(passed=1)
    cache = cache_path(pytester.path / ".osmosis" / "evals")
    with sqlite3.connect(cache) as conn:
        ((key,),) = conn.execute("SELECT key FROM calls").fetchall()
        conn.execute("UPDATE calls SET response = ? WHERE key = ?", (stored, key))
    for name in ("OPENAI_API_BASE", "OPENAI_BASE_URL"):
        monkeypatch.setenv(name, DEAD_ENDPOINT)  # replay calls no model

    result = pytester.runpytest(
        "--osmosis-eval", "--osmosis-cache", "replay", "--osmosis-name", "second",
        "-p", "no:cacheprovider",
    )  # fmt: skip

    output = "\n".join([*result.outlines, *result.errlines])
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    result.assert_outcomes(errors=1)
    expected = (
        "cache_corrupt: model-call cache ",
        str(cache),
        f"entry {bytes(key).hex()} is damaged: {words}",
        "(row 0, run 0)",
    )
    assert any(all(word in line for word in expected) for line in output.splitlines()), output
    assert "INTERNALERROR" not in output and "Traceback" not in output, output
    index = pytester.path / ".osmosis" / "evals" / "second" / "index.jsonl"
    (record,) = [json.loads(line) for line in index.read_text().splitlines()]
    assert (record["status"], record["error_type"]) == ("failed", "cache_corrupt")
