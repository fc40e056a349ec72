"""The format registry: a dataset file's suffix names its reader.

Adding a format is one module with a `Reader` (see `scan.py`) and one line here. The order
is the lookup order of `data/<dataset>.<suffix>`.
"""

from __future__ import annotations

from pathlib import Path

from pytest_osmosis.core.errors import DatasetError
from pytest_osmosis.dataset.csv_format import scan_csv
from pytest_osmosis.dataset.jsonl import scan_jsonl
from pytest_osmosis.dataset.parquet import scan_parquet
from pytest_osmosis.dataset.scan import Reader

FORMATS: dict[str, Reader] = {
    "jsonl": scan_jsonl,
    "csv": scan_csv,
    "parquet": scan_parquet,
}


def suffixes(separator: str) -> str:
    """The accepted suffixes for a message or help text, e.g. `.jsonl, .csv, .parquet`."""
    return separator.join(f".{name}" for name in FORMATS)


def dataset_extension(path: Path) -> str:
    """The lower-cased extension, which decides the reader; anything else is refused."""
    extension = path.suffix.lstrip(".").lower()
    if extension not in FORMATS:
        raise DatasetError(
            f"{path}: unsupported dataset extension {extension or '(none)'!r}; "
            f"expected one of {suffixes(', ')}"
        )
    return extension
