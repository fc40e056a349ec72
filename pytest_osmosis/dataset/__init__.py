"""Dataset files to selected, normalised rows (contract §3), cheap enough for 100k rows.

Collection must reject a bad row (file, row, key) before any model call, yet an item must
not carry its row. So every selected row is validated when the dataset is opened, and then
only what is needed to rebuild it is kept: byte offsets for JSONL (re-parsed on demand), the
contract columns of the selected rows for CSV and Parquet.

Layout: `rows` normalises a raw row (§3.2), `select` owns the row-selector grammar and the
sample (§3.3), `scan` the reader protocol, one module per format (`jsonl`, `csv_format`,
`parquet`) registered by suffix in `formats` (an installed distribution adds one through
the `pytest_osmosis.dataset_formats` entry points), `resolve` finds the file, `selected` opens it.
"""

from __future__ import annotations

from pytest_osmosis.dataset.formats import ENTRY_POINT_GROUP, FORMATS, dataset_extension, readers
from pytest_osmosis.dataset.jsonl import DatasetChangedError
from pytest_osmosis.dataset.resolve import resolve_dataset_path
from pytest_osmosis.dataset.rows import EvalDatasetRow, normalize_row
from pytest_osmosis.dataset.scan import Reader, RowList, RowStore, Scan, read_all
from pytest_osmosis.dataset.select import (
    RowSelectorError,
    format_row_selector,
    parse_row_selector,
    parse_rows,
)
from pytest_osmosis.dataset.selected import SelectedDataset, clear_dataset_cache, open_dataset

__all__ = [
    "ENTRY_POINT_GROUP",
    "FORMATS",
    "DatasetChangedError",
    "EvalDatasetRow",
    "Reader",
    "RowList",
    "RowSelectorError",
    "RowStore",
    "Scan",
    "SelectedDataset",
    "clear_dataset_cache",
    "dataset_extension",
    "format_row_selector",
    "normalize_row",
    "open_dataset",
    "parse_row_selector",
    "parse_rows",
    "read_all",
    "readers",
    "resolve_dataset_path",
]
