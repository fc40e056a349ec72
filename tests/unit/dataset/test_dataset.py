"""Dataset resolution, readers, row normalisation and selection (contract §3, §7.1)."""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_paths import REFERENCE_WORKSPACE, needs_reference

import pytest_osmosis
import pytest_osmosis.dataset.jsonl as dataset_jsonl
import pytest_osmosis.dataset.parquet as dataset_parquet
from pytest_osmosis.core.errors import ConfigError, DatasetError
from pytest_osmosis.dataset import (
    EvalDatasetRow,
    RowSelectorError,
    SelectedDataset,
    clear_dataset_cache,
    format_row_selector,
    normalize_row,
    open_dataset,
    parse_row_selector,
    parse_rows,
    resolve_dataset_path,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

REFERENCE_DATASET = REFERENCE_WORKSPACE / "data" / "ref.jsonl"


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    clear_dataset_cache()
    yield
    clear_dataset_cache()


def write(directory: Path, name: str, content: str | bytes) -> Path:
    path = directory / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return path


def jsonl(*rows: Mapping[str, Any]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def prompt_row(i: int) -> dict[str, Any]:
    return {"user_prompt": f"q{i}", "ground_truth": f"a{i}"}


def open_ds(
    path: Path,
    *,
    limit: int | None = None,
    rows: str | None = None,
    sample: float | None = None,
    seed: int = 0,
) -> SelectedDataset:
    return open_dataset(path, limit=limit, rows=rows, sample=sample, seed=seed)


def all_rows(ds: SelectedDataset) -> list[EvalDatasetRow]:
    return [ds.row(i) for i in range(len(ds))]


def dataset_error(path: Path, **kwargs: Any) -> str:
    with pytest.raises(DatasetError) as info:
        open_ds(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def write_parquet(directory: Path, name: str, table: Any) -> Path:
    path = directory / name
    pq.write_table(table, path)
    return path


# --------------------------------------------------------------------------- #
# resolve_dataset_path
# --------------------------------------------------------------------------- #


def test_resolve_prefers_jsonl_then_csv_then_parquet(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write(data, "d.parquet", b"x")
    assert resolve_dataset_path(tmp_path, "d", None) == data / "d.parquet"
    write(data, "d.csv", "user_prompt\n")
    assert resolve_dataset_path(tmp_path, "d", None) == data / "d.csv"
    write(data, "d.jsonl", "")
    assert resolve_dataset_path(tmp_path, "d", None) == data / "d.jsonl"


def test_resolve_lists_every_path_tried(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "d.jsonl").mkdir()  # a directory is not a dataset file
    with pytest.raises(DatasetError) as info:
        resolve_dataset_path(tmp_path, "d", None)
    message = str(info.value)
    for extension in ("jsonl", "csv", "parquet"):
        assert str(tmp_path / "data" / f"d.{extension}") in message
    assert "'d'" in message


def test_resolve_hints_when_dataset_has_an_extension(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="try 'gsm8k'"):
        resolve_dataset_path(tmp_path, "gsm8k.jsonl", None)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "..\\x", "a\0b"])
def test_resolve_rejects_names_that_are_not_one_segment(tmp_path: Path, name: str) -> None:
    with pytest.raises(DatasetError, match="one path segment"):
        resolve_dataset_path(tmp_path, name, None)


def test_resolve_dataset_file_wins_and_must_exist(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write(data, "d.jsonl", jsonl(prompt_row(0)))
    explicit = write(tmp_path, "other.csv", "user_prompt,label\nq,a\n")
    assert resolve_dataset_path(tmp_path, "d", explicit) == explicit
    with pytest.raises(DatasetError, match="does not exist"):
        resolve_dataset_path(tmp_path, "d", tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="is not a file"):
        resolve_dataset_path(tmp_path, "d", data)
    with pytest.raises(DatasetError, match=r"unsupported dataset extension 'txt'"):
        resolve_dataset_path(tmp_path, "d", write(tmp_path, "rows.txt", "x"))


def test_open_rejects_unknown_extension_and_missing_file(tmp_path: Path) -> None:
    assert "'json'" in dataset_error(write(tmp_path, "d.json", "{}"))
    assert "cannot read dataset" in dataset_error(tmp_path / "gone.jsonl")
    (tmp_path / "dir.jsonl").mkdir()
    assert "cannot read dataset" in dataset_error(tmp_path / "dir.jsonl")


def test_extension_is_case_insensitive(tmp_path: Path) -> None:
    path = write(tmp_path, "D.JSONL", jsonl(prompt_row(0)))
    assert len(open_ds(path)) == 1


# --------------------------------------------------------------------------- #
# Reference dataset
# --------------------------------------------------------------------------- #


@needs_reference
def test_reference_dataset() -> None:
    ds = open_ds(REFERENCE_DATASET)
    assert len(ds) == 6
    assert ds.total_dataset_rows == 6
    assert ds.selected_source_rows == [0, 1, 2, 3, 4, 5]
    assert ds.selector == "0-5"
    assert ds.sha256 == hashlib.sha256(REFERENCE_DATASET.read_bytes()).hexdigest()
    rows = all_rows(ds)
    assert [r.label for r in rows] == ["4", "50", "6", "skip", "crash", "0"]
    assert rows[0] == EvalDatasetRow(
        row_index=0,
        source_row_index=0,
        initial_messages=[
            {"role": "system", "content": "You are a calculator."},
            {"role": "user", "content": "What is 2 + 2?"},
        ],
        label="4",
        metadata={"op": "add", "a": 2, "b": 2},
    )
    assert rows[5].metadata == {"op": "boom", "a": 0, "b": 0}
    assert [r.row_index for r in rows] == list(range(6))


# --------------------------------------------------------------------------- #
# normalize_row (§3.2)
# --------------------------------------------------------------------------- #


def norm(raw: Mapping[str, Any], source: int = 0) -> EvalDatasetRow:
    return normalize_row(raw, source, 0)


def norm_error(raw: Mapping[str, Any], source: int = 7) -> str:
    with pytest.raises(DatasetError) as info:
        normalize_row(raw, source, 0)
    message = str(info.value)
    assert message.startswith(f"row {source}: ")
    return message


def test_prompt_mode_row() -> None:
    row = normalize_row(
        {"system_prompt": "s", "user_prompt": "u", "ground_truth": "g", "other": 1}, 9, 2
    )
    assert row == EvalDatasetRow(
        row_index=2,
        source_row_index=9,
        initial_messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
        label="g",
        metadata=None,
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [(4, "4"), (4.0, "4.0"), (True, "True"), (False, "False"), ([1, 2], "[1, 2]"), ("x", "x")],
)
def test_text_columns_are_stringified(value: Any, text: str) -> None:
    row = norm({"system_prompt": value, "user_prompt": value, "ground_truth": value})
    assert row.initial_messages == [
        {"role": "system", "content": text},
        {"role": "user", "content": text},
    ]
    assert row.label == text


def test_text_is_not_stripped() -> None:
    row = norm({"user_prompt": "  hi \n", "label": " "})
    assert row.initial_messages == [{"role": "user", "content": "  hi \n"}]
    assert row.label == " "


def test_label_alias_and_ground_truth_wins() -> None:
    assert norm({"user_prompt": "u", "label": "L"}).label == "L"
    assert norm({"user_prompt": "u", "label": "L", "ground_truth": "G"}).label == "G"
    assert norm({"user_prompt": "u", "label": "L", "ground_truth": ""}).label == "L"
    assert norm({"user_prompt": "u", "label": "L", "ground_truth": None}).label == "L"


@pytest.mark.parametrize("missing", [None, ""])
def test_prompt_mode_requires_user_prompt(missing: str | None) -> None:
    message = norm_error({"user_prompt": missing, "ground_truth": "g", "system_prompt": "s"})
    assert "user_prompt is required" in message
    assert "'metadata'" in message


@pytest.mark.parametrize("raw", [{"user_prompt": "u"}, {"user_prompt": "u", "label": ""}])
def test_prompt_mode_requires_a_label(raw: dict[str, Any]) -> None:
    assert "ground_truth (or label) is required" in norm_error(raw)


def test_metadata_mode_makes_prompt_and_label_optional() -> None:
    row = norm({"metadata": {"a": 1}})
    assert row.initial_messages == []
    assert row.label is None
    assert row.metadata == {"a": 1}
    row = norm({"metadata": {"a": 1}, "system_prompt": "s"})
    assert row.initial_messages == [{"role": "system", "content": "s"}]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ({}, None),
        ("", None),
        ("   ", None),
        ("{}", None),
        (' {"a": [1]} ', {"a": [1]}),
        ({"b": {"c": 2}}, {"b": {"c": 2}}),
    ],
)
def test_metadata_values(value: Any, expected: dict[str, Any] | None) -> None:
    # user_prompt keeps the row valid when metadata is absent.
    assert norm({"metadata": value, "user_prompt": "u"}).metadata == expected


def test_metadata_key_present_but_empty_still_waives_the_label() -> None:
    row = norm({"metadata": None, "user_prompt": "u"})
    assert (row.label, row.metadata) == (None, None)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("{bad", "metadata is not valid JSON"),
        ("[1, 2]", "metadata must be a JSON object, got a JSON array"),
        ('"s"', "metadata must be a JSON object, got a JSON string"),
        (5, "metadata must be a JSON object, got int"),
        ([1], "metadata must be a JSON object, got list"),
        ("[" * 100_000, "metadata is not valid JSON"),
    ],
)
def test_bad_metadata(value: Any, fragment: str) -> None:
    assert fragment in norm_error({"metadata": value, "user_prompt": "u"})


@pytest.mark.parametrize("metadata", [None, {}, "", "{}"])
def test_row_with_no_prompt_and_no_metadata(metadata: Any) -> None:
    message = norm_error({"metadata": metadata, "user_prompt": "", "ground_truth": "g"})
    assert "has no prompt and no metadata" in message


# --------------------------------------------------------------------------- #
# JSONL
# --------------------------------------------------------------------------- #


def test_jsonl_blank_lines_are_skipped_and_not_counted(tmp_path: Path) -> None:
    text = "\n" + json.dumps(prompt_row(0)) + "\n  \t\n\n" + json.dumps(prompt_row(1)) + "\n\n"
    ds = open_ds(write(tmp_path, "d.jsonl", text))
    assert ds.total_dataset_rows == 2
    assert ds.selected_source_rows == [0, 1]
    assert [r.label for r in all_rows(ds)] == ["a0", "a1"]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_jsonl_newline_styles_and_missing_final_newline(tmp_path: Path, newline: str) -> None:
    lines = [json.dumps(prompt_row(i), ensure_ascii=False) for i in range(3)]
    lines.insert(1, "")
    path = write(tmp_path, "d.jsonl", newline.join(lines))
    ds = open_ds(path)
    assert [r.initial_messages[0]["content"] for r in all_rows(ds)] == ["q0", "q1", "q2"]
    # Line numbers count blank lines: the bad row is on line 5.
    write(tmp_path, "d.jsonl", newline.join([*lines, "{oops"]))
    assert dataset_error(path).startswith(f"{path}:5: invalid JSON (")


def test_jsonl_rows_keep_metadata_and_unicode(tmp_path: Path) -> None:
    row = {"user_prompt": "héllo ✓", "metadata": {"k": "ü", "n": [1, 2.5, None]}}
    ds = open_ds(write(tmp_path, "d.jsonl", jsonl(row)))
    got = ds.row(0)
    assert got.initial_messages == [{"role": "user", "content": "héllo ✓"}]
    assert got.metadata == {"k": "ü", "n": [1, 2.5, None]}
    assert got.label is None


def test_jsonl_metadata_mode_is_decided_per_row(tmp_path: Path) -> None:
    path = write(
        tmp_path, "d.jsonl", jsonl({"metadata": {"a": 1}}, {"metadata": {"a": 2}}, {"x": 1})
    )
    message = dataset_error(path)
    assert message == (
        f"{path}: row 2 (line 3): user_prompt is required for a row with no 'metadata' "
        "column (give a non-empty user_prompt, or a metadata object)"
    )


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{oops", "invalid JSON (Expecting property name enclosed in double quotes at column 2)"),
        ("   [1]", "each line must be a JSON object, got a JSON array"),
        ("null", "each line must be a JSON object, got a JSON null"),
        ('{"a": 1} x', "invalid JSON (Extra data at column 10)"),
        ("[" * 100_000, "invalid JSON ("),
        ('{"n": ' + "9" * 5000 + "}", "invalid JSON ("),
    ],
)
def test_jsonl_line_errors(tmp_path: Path, line: str, fragment: str) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(prompt_row(0)) + "\n" + line + "\n")
    message = dataset_error(path)
    assert message.startswith(f"{path}:3: ")
    assert fragment in message


def test_jsonl_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(prompt_row(0)).encode() + b'{"a": "\xff"}\n')
    message = dataset_error(path)
    assert message.startswith(f"{path}:2: not valid UTF-8 (invalid start byte")


def test_jsonl_invalid_json_anywhere_is_an_error_even_beyond_the_limit(tmp_path: Path) -> None:
    # The official reader parses every line to count the rows.
    path = write(tmp_path, "d.jsonl", jsonl(prompt_row(0), prompt_row(1)) + "{bad\n")
    assert ":3: invalid JSON" in dataset_error(path, limit=1)


def test_row_errors_only_for_selected_rows(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(prompt_row(0), prompt_row(1), {"user_prompt": "x"}))
    assert len(open_ds(path, limit=2)) == 2
    assert len(open_ds(path, rows="0-1")) == 2
    message = dataset_error(path)
    assert message.startswith(f"{path}: row 2 (line 3): ground_truth (or label) is required")


def test_jsonl_error_names_file_row_line_and_key(tmp_path: Path) -> None:
    text = "\n" + jsonl(prompt_row(0), {"user_prompt": "u", "metadata": "[1]"})
    path = write(tmp_path, "d.jsonl", text)
    assert dataset_error(path) == (
        f"{path}: row 1 (line 3): metadata must be a JSON object, got a JSON array"
    )


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8, 64])
def test_jsonl_lines_split_across_reads(tmp_path: Path, chunk: int) -> None:
    rows = [{"user_prompt": f"ü{i}", "ground_truth": "✓" * (i + 1)} for i in range(6)]
    parts = [json.dumps(row, ensure_ascii=False) for row in rows]
    text = parts[0] + "\r\n\r\n" + parts[1] + "\r" + parts[2] + "\n\r" + "\r\n".join(parts[3:])
    path = write(tmp_path, "d.jsonl", text)
    expected = all_rows(open_ds(path))
    clear_dataset_cache()
    with mock.patch.object(dataset_jsonl, "_READ_CHUNK", chunk):
        ds = open_ds(path)
        assert all_rows(ds) == expected
    assert [r.label for r in expected] == [r["ground_truth"] for r in rows]
    assert ds.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    # Line numbers survive the splits: \r\n is one line end, "\n\r" two.
    write(tmp_path, "d.jsonl", text + "\r\n{oops")
    with mock.patch.object(dataset_jsonl, "_READ_CHUNK", chunk):
        assert dataset_error(path).startswith(f"{path}:9: invalid JSON")


# --------------------------------------------------------------------------- #
# CSV
# --------------------------------------------------------------------------- #


def test_csv_values_are_strings_and_metadata_is_parsed(tmp_path: Path) -> None:
    text = (
        "id,user_prompt,ground_truth,metadata\r\n"
        '1,"What is\r\n2+2?",4.0,"{""op"": ""add""}"\r\n'
        "2,hi,,\r\n"
    )
    ds = open_ds(write(tmp_path, "d.csv", text))
    first, second = all_rows(ds)
    assert first.initial_messages == [{"role": "user", "content": "What is\r\n2+2?"}]
    assert (first.label, first.metadata) == ("4.0", {"op": "add"})
    # The metadata header puts every row in metadata mode: no label needed.
    assert (second.label, second.metadata) == (None, None)
    assert second.initial_messages == [{"role": "user", "content": "hi"}]


def test_csv_blank_lines_short_rows_and_extra_cells(tmp_path: Path) -> None:
    text = "user_prompt,label,system_prompt\n\nq0,a0\n\n\nq1,a1,s1,extra,more\n"
    ds = open_ds(write(tmp_path, "d.csv", text))
    assert ds.total_dataset_rows == 2
    rows = all_rows(ds)
    assert rows[0].initial_messages == [{"role": "user", "content": "q0"}]
    assert rows[1].initial_messages == [
        {"role": "system", "content": "s1"},
        {"role": "user", "content": "q1"},
    ]


def test_csv_matches_dictreader_for_repeated_headers(tmp_path: Path) -> None:
    text = "user_prompt,label,user_prompt\nfirst,a,second\nonly,b\n"
    path = write(tmp_path, "d.csv", text)
    official = list(csv.DictReader(io.StringIO(text, newline="")))
    # DictReader: the last column of a name wins, and a short row leaves it missing.
    assert [row["user_prompt"] for row in official] == ["second", None]
    ds = open_ds(path, limit=1)
    assert ds.row(0).initial_messages == [{"role": "user", "content": "second"}]
    assert dataset_error(path).startswith(f"{path}: row 1 (line 3): user_prompt is required")


def test_csv_errors(tmp_path: Path) -> None:
    assert "needs a header row" in dataset_error(write(tmp_path, "a.csv", ""))
    assert "line 1 must be the CSV header row" in dataset_error(
        write(tmp_path, "b.csv", "\nuser_prompt,label\nq,a\n")
    )
    path = write(tmp_path, "c.csv", "user_prompt,label\n")
    assert dataset_error(path) == f"{path} selected no rows (it has 0 rows)"
    path = write(tmp_path, "d.csv", "user_prompt,label\nq,a\n,b\n")
    assert dataset_error(path).startswith(f"{path}: row 1 (line 3): user_prompt is required")
    path = write(tmp_path, "f.csv", b"user_prompt,label\nq,a\n\nq,\xe9\n")
    assert dataset_error(path).startswith(f"{path}:4: not valid UTF-8 (")
    path = write(tmp_path, "g.csv", "\ufeffuser_prompt,label\nq,a\n")
    assert "byte-order mark" in dataset_error(path)


def test_csv_nul_is_refused_with_line_and_column_on_every_python(tmp_path: Path) -> None:
    """Python 3.11+'s csv accepts NUL (3.10's refuses it): the rule is ours, not the interpreter's."""
    path = write(tmp_path, "e.csv", "user_prompt,label\nq,a\nq\x00,b\n")
    assert dataset_error(path) == f"{path}:3:2: invalid CSV (a NUL character at line 3, column 2)"
    # Inside a quoted multi-line field, after non-ASCII text (columns count characters), CRLF.
    path = write(tmp_path, "f.csv", 'user_prompt,label\r\n"é\r\nxé\x00",b\r\n'.encode())
    assert dataset_error(path) == f"{path}:3:3: invalid CSV (a NUL character at line 3, column 3)"
    path = write(tmp_path, "g.csv", "\x00user_prompt,label\nq,a\n")
    assert dataset_error(path) == f"{path}:1:1: invalid CSV (a NUL character at line 1, column 1)"


def test_csv_big_fields_and_field_limit_restored(tmp_path: Path) -> None:
    before = csv.field_size_limit()
    big = "x" * 300_000  # over csv's default 128 KiB limit, under the contract's 16 MiB
    ds = open_ds(write(tmp_path, "d.csv", f"user_prompt,label\n{big},a\n"))
    assert ds.row(0).initial_messages[0]["content"] == big
    assert csv.field_size_limit() == before


def test_csv_multiline_records_report_their_first_line(tmp_path: Path) -> None:
    text = 'user_prompt,label\n"a\nb\nc",x\n"d\ne",\n'
    path = write(tmp_path, "d.csv", text)
    assert dataset_error(path).startswith(f"{path}: row 1 (line 5): ground_truth (or label)")


# --------------------------------------------------------------------------- #
# Parquet
# --------------------------------------------------------------------------- #


def test_parquet_rows(tmp_path: Path) -> None:
    table = pa.table(
        {
            "user_prompt": ["q0", "q1", "q2"],
            "ground_truth": [4, 5, None],
            "label": [None, None, True],
            "metadata": pa.array(
                [{"a": 1, "tags": ["x"]}, None, {"a": 3, "tags": []}],
                pa.struct([("a", pa.int64()), ("tags", pa.list_(pa.string()))]),
            ),
            "ignored": [1.5, 2.5, 3.5],
        }
    )
    path = write_parquet(tmp_path, "d.parquet", table)
    ds = open_ds(path)
    assert ds.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    rows = all_rows(ds)
    assert [r.label for r in rows] == ["4", "5", "True"]
    assert rows[0].metadata == {"a": 1, "tags": ["x"]}
    assert rows[1].metadata is None
    assert rows[2].initial_messages == [{"role": "user", "content": "q2"}]
    # Rows are rebuilt each time: a caller mutating one cannot change the next.
    assert rows[0].metadata is not None
    rows[0].metadata["tags"].append("mutated")
    assert ds.row(0).metadata == {"a": 1, "tags": ["x"]}


def test_parquet_floats_and_string_metadata(tmp_path: Path) -> None:
    table = pa.table({"user_prompt": ["q"], "ground_truth": [4.0], "metadata": ['{"k": 1}']})
    row = open_ds(write_parquet(tmp_path, "d.parquet", table)).row(0)
    assert (row.label, row.metadata) == ("4.0", {"k": 1})


def test_parquet_limit_and_rows_across_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = pa.table({"user_prompt": [f"q{i}" for i in range(50)], "label": ["a"] * 50})
    path = tmp_path / "d.parquet"
    pq.write_table(table, path, row_group_size=7)
    monkeypatch.setattr(dataset_parquet, "_PARQUET_BATCH", 6)
    assert open_ds(path, limit=9).selected_source_rows == list(range(9))
    ds = open_ds(path, rows="3,20-22,49")
    assert ds.total_dataset_rows == 50
    assert [r.initial_messages[0]["content"] for r in all_rows(ds)] == [
        "q3",
        "q20",
        "q21",
        "q22",
        "q49",
    ]


def test_parquet_repeated_column_last_wins_like_to_pylist(tmp_path: Path) -> None:
    table = pa.table(
        [pa.array(["first"]), pa.array(["a"]), pa.array(["second"])],
        names=["user_prompt", "label", "user_prompt"],
    )
    path = write_parquet(tmp_path, "d.parquet", table)
    # The official reader: ParquetFile(...).iter_batches() -> to_pylist().
    official = next(pq.ParquetFile(path).iter_batches()).to_pylist()[0]["user_prompt"]
    assert official == "second"
    assert open_ds(path).row(0).initial_messages == [{"role": "user", "content": official}]


def test_parquet_wrong_column_types_are_dataset_errors(tmp_path: Path) -> None:
    path = write_parquet(tmp_path, "a.parquet", pa.table({"user_prompt": ["q"], "metadata": [7]}))
    assert dataset_error(path) == f"{path}: row 0: metadata must be a JSON object, got int"
    huge = pa.array([2**62], pa.timestamp("us"))
    path = write_parquet(tmp_path, "b.parquet", pa.table({"user_prompt": huge, "label": ["a"]}))
    message = dataset_error(path)
    assert message.startswith(f"{path}: column 'user_prompt' of type timestamp[us] cannot be read")
    path = write_parquet(tmp_path, "c.parquet", pa.table({"other": [1, 2]}))
    assert dataset_error(path).startswith(f"{path}: row 0: user_prompt is required")


def test_parquet_garbage_is_a_dataset_error(tmp_path: Path) -> None:
    assert "not a readable Parquet file" in dataset_error(write(tmp_path, "d.parquet", b"PAR1x"))


def test_parquet_without_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_parquet(tmp_path, "d.parquet", pa.table({"user_prompt": ["q"], "label": ["a"]}))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert "pip install 'pytest-osmosis[parquet]'" in dataset_error(path)


# --------------------------------------------------------------------------- #
# --rows, format_row_selector, limit (§3.3)
# --------------------------------------------------------------------------- #


def test_parse_rows() -> None:
    assert parse_rows("3,7,10-12", 20) == [3, 7, 10, 11, 12]
    assert parse_rows("  5,1,1-3,2 ", 6) == [1, 2, 3, 5]
    assert parse_rows("4-4", 5) == [4]
    assert parse_rows("007", 8) == [7]


@pytest.mark.parametrize("spec", ["", " ", "1, 2", "-1", "1-", "-", "a", "1,,2", "1-2-3", "1;2"])
def test_parse_rows_grammar(spec: str) -> None:
    with pytest.raises(DatasetError, match="invalid rows selector"):
        parse_rows(spec, 10)


def test_parse_rows_inverted_and_out_of_range() -> None:
    with pytest.raises(DatasetError, match="range '5-3' is inverted; write it as 3-5"):
        parse_rows("1,5-3", 10)
    with pytest.raises(DatasetError) as info:
        parse_rows("1,7,9-12,30", 10)
    assert str(info.value) == (
        "rows selector selects 10-12,30 but the dataset has 10 rows (valid indices are 0-9)"
    )
    # Huge ranges are checked without being expanded.
    with pytest.raises(DatasetError, match="selects 10-99999999999999"):
        parse_rows("0-99999999999999", 10)
    with pytest.raises(DatasetError, match="selects 10-13 but"):
        parse_rows("12-13,10-11,1", 10)
    with pytest.raises(DatasetError, match="too large"):
        parse_rows("9" * 5000, 10)


def test_format_row_selector() -> None:
    assert format_row_selector([]) == ""
    assert format_row_selector([*range(10), 12]) == "0-9,12"
    assert format_row_selector([5, 3, 4, 4, 9, 0]) == "0,3-5,9"


@given(st.lists(st.integers(0, 300), min_size=1, max_size=60))
@settings(max_examples=100, deadline=None)
def test_format_then_parse_round_trips(indices: list[int]) -> None:
    assert parse_rows(format_row_selector(indices), 301) == sorted(set(indices))


def test_limit_semantics(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(*(prompt_row(i) for i in range(5))))
    assert open_ds(path, limit=2).selected_source_rows == [0, 1]
    assert open_ds(path, limit=99).selected_source_rows == [0, 1, 2, 3, 4]
    for no_limit in (None, 0, -3):
        ds = open_ds(path, limit=no_limit)
        assert ds.selected_source_rows == [0, 1, 2, 3, 4]
        assert ds.total_dataset_rows == 5
    limited = open_ds(path, limit=2)
    assert limited.total_dataset_rows == 5
    assert limited.selector == "0-1"


def test_rows_override_limit_and_row_index_is_position(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(*(prompt_row(i) for i in range(10))))
    ds = open_ds(path, rows="7,3", limit=1)
    assert ds.selected_source_rows == [3, 7]
    assert ds.selector == "3,7"
    assert [(r.row_index, r.source_row_index, r.label) for r in all_rows(ds)] == [
        (0, 3, "a3"),
        (1, 7, "a7"),
    ]
    assert ds.source_row_index(1) == 7
    # A blank selector is refused: only an absent one means "every row" (or the limit).
    with pytest.raises(DatasetError, match="invalid rows selector '  '"):
        open_ds(path, rows="  ", limit=1)


def test_rows_out_of_range_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(prompt_row(0), prompt_row(1)))
    assert dataset_error(path, rows="1,2,5-6") == (
        f"rows selector selects 2,5-6 but {path} has 2 rows (valid indices are 0-1)"
    )


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_zero_selected_rows(tmp_path: Path, content: str) -> None:
    path = write(tmp_path, "d.jsonl", content)
    assert dataset_error(path) == f"{path} selected no rows (it has 0 rows)"
    assert "it has no rows" in dataset_error(path, rows="0")


# --------------------------------------------------------------------------- #
# Sampling (a preview of platform sampling; not in the official local runner)
# --------------------------------------------------------------------------- #


def test_sample_is_seeded_ordered_and_sized(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(*(prompt_row(i) for i in range(200))))
    first = open_ds(path, sample=0.1, seed=1)
    clear_dataset_cache()
    again = open_ds(path, sample=0.1, seed=1)
    other = open_ds(path, sample=0.1, seed=2)
    assert first is not again
    assert first.selected_source_rows == again.selected_source_rows
    assert first.selected_source_rows != other.selected_source_rows
    assert len(first) == 20
    assert first.selected_source_rows == sorted(first.selected_source_rows)
    assert first.selected_source_rows != list(range(20))
    assert [r.row_index for r in all_rows(first)] == list(range(20))
    assert [r.source_row_index for r in all_rows(first)] == first.selected_source_rows
    assert first.total_dataset_rows == 200


def test_sample_rounding_and_bounds(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(*(prompt_row(i) for i in range(10))))
    assert len(open_ds(path, sample=0.25)) == 3  # 2.5 rounds up
    assert len(open_ds(path, sample=0.001)) == 1  # at least one row
    assert open_ds(path, sample=1.0).selected_source_rows == list(range(10))
    assert len(open_ds(path, sample=1)) == 10


def test_sample_applies_after_limit_and_rows(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(*(prompt_row(i) for i in range(100))))
    limited = open_ds(path, limit=30, sample=0.5, seed=4)
    assert len(limited) == 15
    assert set(limited.selected_source_rows) <= set(range(30))
    chosen = open_ds(path, rows="50-59,90-99", sample=0.5, seed=4)
    assert len(chosen) == 10
    assert set(chosen.selected_source_rows) <= set(range(50, 60)) | set(range(90, 100))


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, float("nan"), float("inf"), True])
def test_sample_must_be_a_fraction(tmp_path: Path, bad: Any) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(prompt_row(0)))
    with pytest.raises(ConfigError, match=r"sample must be a fraction in \(0, 1\]"):
        open_ds(path, sample=bad)


def test_sample_validates_only_sampled_rows(tmp_path: Path) -> None:
    good = [prompt_row(i) for i in range(40)]
    path = write(tmp_path, "good.jsonl", jsonl(*good))
    picked = open_ds(path, sample=0.25, seed=11).selected_source_rows
    outside = next(i for i in range(40) if i not in picked)
    inside = picked[len(picked) // 2]
    for bad_index, fails in ((outside, False), (inside, True)):
        rows = [dict(r) for r in good]
        rows[bad_index] = {"user_prompt": "no label"}
        bad_path = write(tmp_path, f"bad{bad_index}.jsonl", jsonl(*rows))
        if fails:
            assert dataset_error(bad_path, sample=0.25, seed=11).startswith(
                f"{bad_path}: row {inside} (line {inside + 1}): ground_truth (or label)"
            )
        else:
            assert open_ds(bad_path, sample=0.25, seed=11).selected_source_rows == picked


def test_sample_is_identical_in_other_processes(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(*(prompt_row(i) for i in range(500))))
    here = open_ds(path, sample=0.07, seed=123).selector
    code = (
        "import sys; from pathlib import Path; from pytest_osmosis.dataset import open_dataset;"
        "print(open_dataset(Path(sys.argv[1]), limit=None, rows=None, sample=0.07, seed=123)"
        ".selector)"
    )
    root = str(Path(pytest_osmosis.__file__).resolve().parents[1])
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": root}
        result = subprocess.run(
            [sys.executable, "-c", code, str(path)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert result.stdout.strip() == here


# --------------------------------------------------------------------------- #
# SelectedDataset: identity, caching, lazy rows
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_same_rows_from_every_format(tmp_path: Path, fmt: str) -> None:
    rows = [
        {"system_prompt": "s", "user_prompt": "q0", "ground_truth": "1", "metadata": '{"a": 1}'},
        {"system_prompt": "", "user_prompt": "q1", "ground_truth": "", "metadata": '{"b": 2}'},
    ]
    if fmt == "jsonl":
        path = write(tmp_path, "d.jsonl", jsonl(*rows))
    elif fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        path = write(tmp_path, "d.csv", out.getvalue())
    else:
        path = write_parquet(tmp_path, "d.parquet", pa.Table.from_pylist(rows))
    ds = open_ds(path)
    assert ds.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert all_rows(ds) == [
        EvalDatasetRow(
            0,
            0,
            [{"role": "system", "content": "s"}, {"role": "user", "content": "q0"}],
            "1",
            {"a": 1},
        ),
        EvalDatasetRow(1, 1, [{"role": "user", "content": "q1"}], None, {"b": 2}),
    ]
    with pytest.raises(IndexError):
        ds.row(2)
    with pytest.raises(IndexError):
        ds.row(-1)


def test_open_is_memoised_per_file_state_and_arguments(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(prompt_row(0), prompt_row(1)))
    first = open_ds(path)
    assert open_ds(path) is first
    assert open_ds(path, limit=0) is first  # same selection as no limit
    assert open_ds(path, limit=1) is not first
    write(tmp_path, "d.jsonl", jsonl(prompt_row(0), prompt_row(1), prompt_row(2)))
    changed = open_ds(path)
    assert changed is not first
    assert changed.total_dataset_rows == 3
    assert changed.sha256 != first.sha256


def test_row_after_the_file_changed_is_a_dataset_error(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", jsonl(prompt_row(0), prompt_row(1)))
    ds = open_ds(path)
    write(tmp_path, "d.jsonl", jsonl(prompt_row(0), prompt_row(1), prompt_row(2)))
    with pytest.raises(DatasetError, match="changed after it was opened"):
        ds.row(1)
    path.unlink()
    with pytest.raises(DatasetError, match="cannot read dataset"):
        ds.row(0)


def test_jsonl_rows_are_fresh_objects(tmp_path: Path) -> None:
    ds = open_ds(write(tmp_path, "d.jsonl", jsonl({"user_prompt": "u", "metadata": {"a": []}})))
    row = ds.row(0)
    assert row.metadata is not None
    row.metadata["a"].append(1)
    row.initial_messages.clear()
    assert ds.row(0) == EvalDatasetRow(0, 0, [{"role": "user", "content": "u"}], None, {"a": []})


# --------------------------------------------------------------------------- #
# Properties: any file is a dataset or a DatasetError, and matches the official reader
# --------------------------------------------------------------------------- #


Official = tuple[list[EvalDatasetRow] | None, str]


def official_jsonl(path: Path) -> Official:
    """What the official reader does with a JSONL file (text mode, universal newlines, strip).

    Returns the rows, or None and the start of the error it meets first ("" when the file
    is not UTF-8: text mode decodes ahead of the line it reports, so no line is certain).
    """
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None, f"{path}:"
    rows: list[EvalDatasetRow] = []
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            text = line.strip()
            if not text:
                continue
            try:
                payload = json.loads(text)
            except (ValueError, RecursionError):
                return None, f"{path}:{lineno}: invalid JSON ("
            if not isinstance(payload, dict):
                return None, f"{path}:{lineno}: each line must be a JSON object"
            try:
                rows.append(normalize_row(payload, len(rows), len(rows)))
            except DatasetError as exc:
                return (
                    None,
                    f"{path}: row {len(rows)} (line {lineno}): {str(exc).split(': ', 1)[1]}",
                )
    if not rows:
        return None, f"{path} selected no rows"
    return rows, ""


def official_csv(path: Path) -> Official:
    """What the official reader does with a CSV file (plus our deliberate refusals: a BOM, and
    a NUL anywhere, which Python 3.11+'s csv accepts and 3.10's refuses)."""
    if b"\0" in path.read_bytes():
        return None, f"{path}:"
    previous = csv.field_size_limit(16 * 1024 * 1024)
    rows: list[EvalDatasetRow] = []
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            if not reader.fieldnames:
                return None, f"{path}:"
            first = reader.fieldnames[0]
            if first.startswith("\ufeff") and first[1:] in (
                "system_prompt",
                "user_prompt",
                "ground_truth",
                "label",
                "metadata",
            ):
                return None, f"{path}: starts with a UTF-8 byte-order mark"
            for raw in reader:
                try:
                    row = {k: v for k, v in raw.items() if k is not None}
                    rows.append(normalize_row(row, len(rows), len(rows)))
                except DatasetError:
                    return None, f"{path}: row {len(rows)} (line "
    except (ValueError, csv.Error):  # UnicodeDecodeError is a ValueError
        return None, f"{path}:"
    finally:
        csv.field_size_limit(previous)
    if not rows:
        return None, f"{path} selected no rows"
    return rows, ""


def check_against_official(path: Path, official: Official) -> None:
    expected, error_start = official
    try:
        ds = open_ds(path)
    except DatasetError as exc:
        message = str(exc)
        assert "\n" not in message
        assert expected is None, f"the official reader accepted it, we said: {message}"
        assert message.startswith(error_start)
        return
    assert expected is not None, f"we accepted it, the official reader: {error_start}"
    assert ds.total_dataset_rows == len(expected)
    assert all_rows(ds) == expected
    assert ds.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


_counter = itertools.count()

json_line = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "user_prompt": st.one_of(st.text(max_size=5), st.integers(), st.none()),
            "ground_truth": st.one_of(st.text(max_size=3), st.floats(), st.booleans()),
            "label": st.text(max_size=3),
            "system_prompt": st.text(max_size=3),
            "metadata": st.one_of(
                st.none(),
                st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                st.sampled_from(["", "{}", '{"a": 1}', "[1]", "{bad"]),
                st.integers(),
            ),
        },
    ).map(lambda row: json.dumps(row, ensure_ascii=False)),
    st.sampled_from(["", " ", "\t", "\x0c", "\u3000", "[]", "1", "{", "null", '{"a":1} 2']),
    st.text(max_size=8),
)
jsonl_text = st.lists(
    st.tuples(json_line, st.sampled_from(["\n", "\r\n", "\r", ""])), max_size=6
).map(lambda parts: "".join(line + end for line, end in parts))
file_bytes = st.one_of(
    st.binary(max_size=64),
    jsonl_text.map(lambda text: text.encode("utf-8")),
    st.tuples(jsonl_text, st.binary(max_size=3), jsonl_text).map(
        lambda parts: parts[0].encode() + parts[1] + parts[2].encode()
    ),
)


@given(content=file_bytes, chunk=st.sampled_from([1, 2, 3, 7, 1 << 20]))
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_any_jsonl_file_matches_the_official_reader(
    tmp_path: Path, content: bytes, chunk: int
) -> None:
    path = write(tmp_path, f"p{next(_counter)}.jsonl", content)
    with mock.patch.object(dataset_jsonl, "_READ_CHUNK", chunk):
        check_against_official(path, official_jsonl(path))


csv_cell = st.one_of(
    st.text(max_size=6),
    st.sampled_from(['"', '""', '"a,b"', "{}", '"{""a"": 1}"', "\r", "\n", ",", "\x00"]),
)
csv_text = st.lists(st.lists(csv_cell, max_size=4).map(",".join), max_size=6).flatmap(
    lambda lines: st.sampled_from(
        [
            "user_prompt,label\n",
            "user_prompt,ground_truth,metadata\r\n",
            "metadata,system_prompt\n",
            "",
            "\n",
        ]
    ).map(lambda header: header + "\n".join(lines))
)


@given(content=st.one_of(csv_text.map(str.encode), st.binary(max_size=48)))
@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_any_csv_file_matches_the_official_reader(tmp_path: Path, content: bytes) -> None:
    path = write(tmp_path, f"p{next(_counter)}.csv", content)
    check_against_official(path, official_csv(path))


@given(
    content=jsonl_text,
    limit=st.one_of(st.none(), st.integers(-2, 8)),
    rows=st.one_of(st.none(), st.sampled_from(["", "0", "1-3", "0,2,4-5", "9", "x"])),
    sample=st.one_of(st.none(), st.floats(0.01, 1.0)),
    seed=st.integers(0, 5),
)
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_any_selection_is_a_dataset_or_a_dataset_error(
    tmp_path: Path,
    content: str,
    limit: int | None,
    rows: str | None,
    sample: float | None,
    seed: int,
) -> None:
    path = write(tmp_path, f"p{next(_counter)}.jsonl", content)
    try:
        ds = open_ds(path, limit=limit, rows=rows, sample=sample, seed=seed)
    except DatasetError as exc:
        assert "\n" not in str(exc)
        return
    selected = ds.selected_source_rows
    assert 1 <= len(ds) == len(selected) <= ds.total_dataset_rows
    assert selected == sorted(set(selected))
    assert selected[-1] < ds.total_dataset_rows
    if rows and rows.strip():
        assert set(selected) <= set(parse_rows(rows, ds.total_dataset_rows))
    elif limit is not None and limit > 0:
        assert selected[-1] < limit
    assert ds.selector == format_row_selector(selected)
    assert [r.source_row_index for r in all_rows(ds)] == selected


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789,- x", max_size=12))
def test_every_caller_reads_a_selector_by_one_grammar(spec: str) -> None:
    """The option check, the dataset and the run browser accept exactly the same selectors."""
    from pytest_osmosis.results import run_reader
    from pytest_osmosis.workspace import config

    try:
        ranges: list[tuple[int, int]] | None = parse_row_selector(spec)
    except RowSelectorError:
        ranges = None
    try:
        config._rows(spec)
        option_ok = True
    except ValueError:
        option_ok = False
    assert option_ok == (ranges is not None)
    huge = ranges is not None and any(end - start > run_reader.MAX_RANGE_ROWS for start, end in ranges)
    if huge or sum(end - start + 1 for start, end in ranges or []) > 100_000:
        return  # the run browser does not expand such a selector; nothing more to compare
    rows = run_reader.recorded_selection(spec)
    assert (rows is not None) == (ranges is not None)
    if rows is not None:
        assert format_row_selector(rows) == format_row_selector(
            index for start, end in ranges or [] for index in range(start, end + 1)
        )
        assert parse_rows(spec, max(rows) + 1) == rows


def test_one_formatter_writes_every_selector() -> None:
    from pytest_osmosis import results

    assert results.format_row_selector is format_row_selector
