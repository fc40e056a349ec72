"""Parsers under fuzzing (issue 6, point 6): arbitrary input gives a valid result or our own
error type with a one-line message, never another exception.

Covers the eval TOML (bytes, generated documents, mutations of a valid one, then the
rollout path rules and the settings overrides), the dataset name lookup, the Parquet
reader (JSONL and CSV are fuzzed against the official reader in
tests/unit/dataset/test_dataset.py), and the journal replay that a resume trusts.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from pytest_osmosis.core.errors import ConfigError, DatasetError, RunDirectoryError
from pytest_osmosis.dataset import clear_dataset_cache, open_dataset, resolve_dataset_path
from pytest_osmosis.results import normalize_record, read_journal
from pytest_osmosis.results.journal import journal_line
from pytest_osmosis.workspace.config import (
    ENV_NAME_RE,
    SECRET_NAME_RE,
    EvalConfig,
    load_eval_config,
    resolve_settings,
    validate_rollout_paths,
)

FUNCTION_FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

VALID_TOML = (
    "[experiment]\n"
    'rollout = "calc"\n'
    'entrypoint = "main.py"\n'
    'model_path = "openai/test-model"\n'
    'dataset = "calc"\n'
    "[evaluation]\n"
    "n = 2\n"
    "pass_threshold = 0.5\n"
    "[env]\n"
    'MODE = "fast"\n'
    "[secrets]\n"
    'required = ["TOKEN"]\n'
)


def one_line(exc: BaseException) -> str:
    message = str(exc)
    assert message and "\n" not in message and "\r" not in message, repr(message)
    return message


# --------------------------------------------------------------------------- #
# A tiny TOML writer for generated documents (values hypothesis can make)
# --------------------------------------------------------------------------- #


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def toml_document(doc: dict[str, Any]) -> str:
    """Scalars first, then one ``[table]`` per dict value."""
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for name, table in doc.items():
        if isinstance(table, dict):
            lines.append(f"[{toml_key(name)}]")
            lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=5,
)
names = st.one_of(
    st.sampled_from(["calc", "r", "..", ".", "", "a/b", "/abs", "calc/../calc", "x" * 300]),
    st.text(max_size=10),
)
entrypoints = st.one_of(
    st.sampled_from(
        ["main.py", "pkg/entry.py", "../calc/main.py", "/etc/hostname", "pkg", "link.py", "m" * 300]
    ),
    st.text(max_size=12),
)
env_names = st.one_of(
    st.sampled_from(["MODE", "_X", "lower", "_OSMOSIS_ROLLOUT_PORT", "TOKEN", "A-B", "1A"]),
    st.text(max_size=6),
)
secret_names = st.one_of(st.sampled_from(["TOKEN", "API_KEY", "_X", "lower"]), st.text(max_size=6))


SECTIONS = ["experiment", "evaluation", "env", "secrets", "advanced"]
KEYS = {
    "experiment": ["rollout", "entrypoint", "model_path", "dataset", "branch", "commit_sha"],
    "evaluation": [
        "limit",
        "n",
        "batch_size",
        "pass_threshold",
        "agent_workflow_timeout_s",
        "grader_timeout_s",
    ],
    "env": ["MODE", "TOKEN"],
    "secrets": ["required"],
    "advanced": ["anything"],
}
# Plausible values first, so a fair share of the documents stay valid and reach the later
# checks (path rules, overrides, dataset lookup); then anything TOML can hold.
plausible = st.one_of(
    names,
    entrypoints,
    st.sampled_from(["main", "a b", "", "abcdef1", "ABCDEF0123", "xyz", "openai/test-model"]),
    st.integers(-3, 5),
    st.floats(),
    st.lists(secret_names, max_size=3),
)
edit = st.one_of(
    st.tuples(
        st.just("set"),
        st.just("experiment"),
        st.sampled_from(["rollout", "entrypoint", "dataset"]),
        st.one_of(names, entrypoints),
    ),
    st.tuples(
        st.just("set"),
        st.sampled_from(SECTIONS),
        st.one_of(st.sampled_from(sorted({k for ks in KEYS.values() for k in ks})), env_names),
        st.one_of(plausible, values),
    ),
    st.tuples(st.just("drop"), st.sampled_from(SECTIONS), st.sampled_from(KEYS["experiment"])),
    st.tuples(st.just("drop"), st.sampled_from(SECTIONS), st.none()),
    st.tuples(
        st.just("replace"),
        st.one_of(st.sampled_from(SECTIONS), st.text(max_size=5)),
        st.none(),
        values,
    ),
)


def edited(changes: list[tuple[Any, ...]]) -> dict[str, Any]:
    doc: dict[str, Any] = _valid_doc()
    for kind, section, key, *value in changes:
        if kind == "set":
            if not isinstance(doc.get(section), dict):
                doc[section] = {}
            doc[section][key] = value[0]
        elif kind == "drop" and key is None:
            doc.pop(section, None)
        elif kind == "drop" and isinstance(doc.get(section), dict):
            doc[section].pop(key, None)
        elif kind == "replace":
            doc[section] = value[0]
    return doc


documents = st.lists(edit, max_size=3).map(edited)

override_text = st.one_of(
    st.sampled_from(["", " ", "0", "-1", "1", "2", "1.5", "nan", "inf", "0-1", "3-1", "0,1,1"]),
    st.text(max_size=8),
)
overrides = st.dictionaries(
    st.sampled_from(
        ["model_path", "limit", "n", "rows", "pass_threshold", "sample", "seed", "concurrency"]
    ),
    st.tuples(override_text, st.just("--osmosis-x")),
    max_size=4,
)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace for the path rules: two rollouts, a nested entrypoint, a symlink out."""
    root = tmp_path_factory.mktemp("fuzz-ws")
    (root / "configs" / "eval").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "data" / "calc.jsonl").write_text('{"user_prompt": "q", "label": "a"}\n')
    (root / "rollouts" / "calc" / "pkg").mkdir(parents=True)
    (root / "rollouts" / "calc" / "main.py").write_text("")
    (root / "rollouts" / "calc" / "pkg" / "entry.py").write_text("")
    (root / "rollouts" / "r").mkdir()
    (root / "outside.py").write_text("")
    (root / "rollouts" / "calc" / "link.py").symlink_to(root / "outside.py")
    return root


def check_config(path: Path, workspace: Path, extra: dict[str, tuple[str, str]]) -> None:
    """Load, then apply the path rules and overrides; every step is a value or our error."""
    try:
        cfg = load_eval_config(path)
    except ConfigError as exc:
        assert one_line(exc).startswith(f"{path}:")
        return
    assert isinstance(cfg, EvalConfig)
    assert all(ENV_NAME_RE.fullmatch(name) for name in cfg.env)
    assert not any(name.startswith("_OSMOSIS_") for name in cfg.env)
    assert all(SECRET_NAME_RE.fullmatch(name) for name in cfg.secrets.required)
    assert not set(cfg.env) & set(cfg.secrets.required)
    assert cfg.experiment.branch is None or cfg.experiment.commit_sha is None
    assert cfg.evaluation.n is None or cfg.evaluation.n > 0
    for number in (
        cfg.evaluation.pass_threshold,
        cfg.evaluation.agent_workflow_timeout_s,
        cfg.evaluation.grader_timeout_s,
    ):
        assert number is None or math.isfinite(number)
    try:
        entry = validate_rollout_paths(workspace, cfg.experiment, path)
    except ConfigError as exc:
        assert one_line(exc).startswith(f"{path}: experiment.")
    else:
        rollout_dir = (workspace / "rollouts" / cfg.experiment.rollout).resolve()
        assert entry.is_file() and entry.is_relative_to(rollout_dir)
        assert rollout_dir.parent == (workspace / "rollouts").resolve()
    try:
        resolved = resolve_settings(cfg, extra)
    except ConfigError as exc:
        assert one_line(exc).startswith("--osmosis-x: ")
    else:
        assert resolved.n > 0 and math.isfinite(resolved.pass_threshold)
        assert resolved.sample is None or 0 < resolved.sample <= 1
    try:
        found = resolve_dataset_path(workspace, cfg.experiment.dataset, None)
    except DatasetError as exc:
        one_line(exc)
    else:
        assert found.is_file() and found.parent == workspace / "data"


@given(content=st.binary(max_size=300))
@settings(max_examples=150, deadline=None, suppress_health_check=FUNCTION_FIXTURES)
def test_config_from_arbitrary_bytes(workspace: Path, content: bytes) -> None:
    path = workspace / "configs" / "eval" / "bytes.toml"
    path.write_bytes(content)
    check_config(path, workspace, {})


@given(doc=documents, extra=overrides)
@settings(max_examples=300, deadline=None, suppress_health_check=FUNCTION_FIXTURES)
def test_config_from_generated_documents(
    workspace: Path, doc: dict[str, Any], extra: dict[str, tuple[str, str]]
) -> None:
    path = workspace / "configs" / "eval" / "doc.toml"
    path.write_text(toml_document(doc), encoding="utf-8")
    check_config(path, workspace, extra)


edits = st.lists(
    st.tuples(
        st.sampled_from(["insert", "delete", "replace"]),
        st.integers(0, len(VALID_TOML)),
        st.one_of(st.binary(min_size=1, max_size=4), st.sampled_from([b"\n", b"[", b'"', b"="])),
    ),
    min_size=1,
    max_size=4,
)


@given(changes=edits, extra=overrides)
@settings(max_examples=200, deadline=None, suppress_health_check=FUNCTION_FIXTURES)
def test_config_from_mutated_valid_document(
    workspace: Path, changes: list[tuple[str, int, bytes]], extra: dict[str, tuple[str, str]]
) -> None:
    content = bytearray(VALID_TOML.encode())
    for kind, at, chunk in changes:
        at = min(at, len(content))
        if kind == "insert":
            content[at:at] = chunk
        elif kind == "delete":
            del content[at : at + len(chunk)]
        else:
            content[at : at + len(chunk)] = chunk
    path = workspace / "configs" / "eval" / "mutated.toml"
    path.write_bytes(bytes(content))
    check_config(path, workspace, extra)


def test_the_generator_reaches_every_stage(workspace: Path) -> None:
    """The properties above are only worth something if generated documents get past the
    loader, both to a usable rollout path and to a refused one."""
    path = workspace / "configs" / "eval" / "stage.toml"

    def stage(doc: dict[str, Any]) -> str:
        path.write_text(toml_document(doc), encoding="utf-8")
        try:
            cfg = load_eval_config(path)
        except ConfigError:
            return "refused"
        try:
            validate_rollout_paths(workspace, cfg.experiment, path)
        except ConfigError:
            return "bad path"
        return "runnable"

    quick = settings(max_examples=2000, database=None, deadline=None)
    for wanted in ("refused", "bad path", "runnable"):
        find(documents, lambda doc, wanted=wanted: stage(doc) == wanted, settings=quick)


def _valid_doc() -> dict[str, Any]:
    return {
        "experiment": {
            "rollout": "calc",
            "entrypoint": "main.py",
            "model_path": "openai/test-model",
            "dataset": "calc",
        },
        "evaluation": {"n": 2, "pass_threshold": 0.5},
        "env": {"MODE": "fast"},
        "secrets": {"required": ["TOKEN"]},
    }


# --------------------------------------------------------------------------- #
# Parquet reader
# --------------------------------------------------------------------------- #


def _arrow_columns() -> st.SearchStrategy[Any]:
    """A contract column as (type, values): strings, numbers, nested, binary, nulls."""
    kinds: list[tuple[Any, st.SearchStrategy[Any]]] = [
        (
            pa.string(),
            st.one_of(st.none(), st.text(max_size=5), st.sampled_from(['{"a": 1}', "[1]"])),
        ),
        (pa.int64(), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))),
        (pa.float64(), st.one_of(st.none(), st.floats())),
        (pa.bool_(), st.one_of(st.none(), st.booleans())),
        (pa.binary(), st.one_of(st.none(), st.binary(max_size=4))),
        (pa.list_(pa.int64()), st.one_of(st.none(), st.lists(st.integers(0, 9), max_size=2))),
        (
            pa.struct([("a", pa.int64())]),
            st.one_of(st.none(), st.fixed_dictionaries({"a": st.integers(0, 9)})),
        ),
        (pa.null(), st.none()),
        (pa.timestamp("s"), st.one_of(st.none(), st.integers(0, 2**32))),
        (pa.decimal128(5, 2), st.none()),
    ]
    return st.sampled_from(kinds)


@st.composite
def parquet_tables(draw: Callable[..., Any]) -> Any:
    rows = draw(st.integers(0, 4))
    columns = draw(
        st.lists(
            st.sampled_from(
                ["user_prompt", "ground_truth", "label", "system_prompt", "metadata", "x"]
            ),
            max_size=4,
            unique=True,
        )
    )
    arrays = {}
    for name in columns:
        kind, cells = draw(_arrow_columns())
        arrays[name] = pa.array(draw(st.lists(cells, min_size=rows, max_size=rows)), type=kind)
    if not arrays:
        arrays["x"] = pa.array([None] * rows, type=pa.null())
    return pa.table(arrays)


def check_dataset(path: Path, **selection: Any) -> None:
    clear_dataset_cache()
    kwargs: dict[str, Any] = {"limit": None, "rows": None, "sample": None, "seed": 0}
    kwargs.update(selection)
    try:
        dataset = open_dataset(path, **kwargs)
    except DatasetError as exc:
        one_line(exc)
        return
    assert 1 <= len(dataset) <= dataset.total_dataset_rows
    for index in range(len(dataset)):
        row = dataset.row(index)
        assert row.initial_messages or row.metadata
        assert all(isinstance(m["content"], str) for m in row.initial_messages)
        assert row.metadata is None or isinstance(row.metadata, dict)


def parquet_bytes(table: Any) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


@given(
    table=parquet_tables(),
    limit=st.one_of(st.none(), st.integers(-1, 3)),
    rows=st.one_of(st.none(), st.sampled_from(["0", "1-2", "0,3", "9"])),
)
@settings(max_examples=150, deadline=None, suppress_health_check=FUNCTION_FIXTURES)
def test_parquet_with_any_column_types(
    tmp_path: Path, table: Any, limit: int | None, rows: str | None
) -> None:
    path = tmp_path / "typed.parquet"
    path.write_bytes(parquet_bytes(table))
    check_dataset(path, limit=limit, rows=rows)


GOOD_PARQUET = parquet_bytes(
    pa.table(
        {
            "user_prompt": ["What is 2 + 2?", "What is 3 * 5?"],
            "ground_truth": ["4", "15"],
            "metadata": ['{"a": 1}', None],
        }
    )
)


@given(
    content=st.one_of(
        st.binary(max_size=200),
        st.lists(
            st.tuples(st.integers(0, len(GOOD_PARQUET) - 1), st.integers(0, 255)),
            min_size=1,
            max_size=6,
        ).map(lambda flips: _flipped(GOOD_PARQUET, flips)),
        st.integers(0, len(GOOD_PARQUET)).map(lambda cut: GOOD_PARQUET[:cut]),
    )
)
@settings(max_examples=200, deadline=None, suppress_health_check=FUNCTION_FIXTURES)
def test_parquet_from_corrupt_bytes(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(content)
    check_dataset(path)


def _flipped(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for at, byte in flips:
        out[at] = byte
    return bytes(out)


# --------------------------------------------------------------------------- #
# Journal replay
# --------------------------------------------------------------------------- #

journal_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.integers(),
    st.just(10**400),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(["success", "failed", "skipped", "a" * 32, "../x", "a/b", ".", "\ud800"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
records = st.one_of(
    st.fixed_dictionaries(
        {
            "row_index": st.one_of(st.integers(0, 3), journal_values),
            "run_index": st.one_of(st.integers(0, 1), journal_values),
            "rollout_id": st.one_of(st.just("0" * 32), journal_values),
            "status": st.one_of(st.sampled_from(["success", "failed", "skipped"]), journal_values),
        },
        optional={
            name: journal_values
            for name in (
                "reward",
                "tokens",
                "duration_ms",
                "error_type",
                "source_row_index",
                "extra",
            )
        },
    ),
    journal_values,
)
record_line = st.one_of(
    records.map(lambda record: json.dumps(record, allow_nan=True).encode("utf-8", "surrogatepass")),
    st.sampled_from(
        [b"", b" ", b"[" * 5000, b'{"row_index": ' + b"1" * 5000 + b"}", b"\xef\xbb\xbf{}", b"\xff"]
    ),
    st.binary(max_size=20),
)
journal_bytes = st.one_of(
    st.binary(max_size=300),
    st.tuples(st.lists(record_line, max_size=5), st.binary(max_size=8)).map(
        lambda parts: b"".join(line + b"\n" for line in parts[0]) + parts[1]
    ),
)


@given(content=journal_bytes)
@settings(max_examples=400, deadline=None, suppress_health_check=FUNCTION_FIXTURES)
def test_journal_replay_of_any_bytes(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "events.jsonl").write_bytes(content)
    try:
        latest = read_journal(tmp_path)
    except RunDirectoryError as exc:
        assert one_line(exc).startswith(f"{tmp_path / 'events.jsonl'}:")
        return
    assert isinstance(latest, dict)
    for (row_index, run_index), record in latest.items():
        assert (record["row_index"], record["run_index"]) == (row_index, run_index)
        # What replay accepts, a resume writes back: it must survive the round trip.
        line = journal_line(record)
        assert normalize_record(json.loads(line), where="round trip") == record


def test_journal_replay_refuses_what_it_cannot_write_back(tmp_path: Path) -> None:
    """Found by the property above: each of these escaped replay as a non-Osmosis error,
    or was accepted and then failed when the record was written again."""
    base = '{"row_index":0,"run_index":0,"rollout_id":"r","status":"success"'
    for tail, problem in [
        (',"reward":' + "9" * 400 + "}", "reward must be a finite number"),
        (',"reward":NaN}', "reward must be a finite number"),
        (',"duration_ms":-Infinity}', "duration_ms must be a finite number"),
        (',"error_type":"\\ud800"}', "error_type is not valid Unicode text"),
        (',"tokens":' + "1" * 5000 + "}", "invalid JSON in journal record"),
    ]:
        (tmp_path / "events.jsonl").write_text(base + tail + "\n")
        with pytest.raises(RunDirectoryError, match=re.escape(problem)):
            read_journal(tmp_path)
    (tmp_path / "events.jsonl").write_text("[" * 100_000 + "\n")
    with pytest.raises(RunDirectoryError, match="invalid JSON in journal record"):
        read_journal(tmp_path)


def test_parquet_whose_footer_miscounts_its_rows_is_refused(tmp_path: Path) -> None:
    """Found by the fuzzer: one flipped byte left the footer saying 0 rows over 2."""
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(_flipped(GOOD_PARQUET, [(352, 0)]))
    clear_dataset_cache()
    try:
        dataset = open_dataset(path, limit=None, rows=None, sample=None, seed=0)
    except DatasetError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
    else:
        assert len(dataset) <= dataset.total_dataset_rows
