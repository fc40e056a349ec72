"""The format registry: a dataset file's suffix names its reader.

A built-in format is one module with a `Reader` (see `scan.py`) and one line here. The order
is the lookup order of `data/<dataset>.<suffix>`. An installed distribution adds a format
through the entry-point group :data:`ENTRY_POINT_GROUP` (the entry point's name is the
suffix, its object the reader); those are loaded when a dataset is first looked up, so a
pytest run without ``--osmosis-eval`` never imports them.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

from pytest_osmosis.core.errors import DatasetError
from pytest_osmosis.dataset.csv_format import scan_csv
from pytest_osmosis.dataset.jsonl import scan_jsonl
from pytest_osmosis.dataset.parquet import scan_parquet
from pytest_osmosis.dataset.scan import Reader

ENTRY_POINT_GROUP = "pytest_osmosis.dataset_formats"

FORMATS: dict[str, Reader] = {
    "jsonl": scan_jsonl,
    "csv": scan_csv,
    "parquet": scan_parquet,
}

_plugins_loaded: list[bool] = []  # non-empty once the entry points are in FORMATS


def readers() -> dict[str, Reader]:
    """Every format: the built-in ones, then the installed distributions' (loaded once).

    A plugin's format that cannot load, or names a suffix already taken, is one line
    naming the entry point and its distribution.
    """
    if not _plugins_loaded:
        found: dict[str, Reader] = {}
        for point in entry_points(group=ENTRY_POINT_GROUP):
            suffix = point.name.lstrip(".").lower()
            dist = point.dist.name if point.dist is not None else "an unnamed distribution"
            where = f"dataset format entry point {point.name!r} = {point.value!r} ({dist})"
            if suffix in FORMATS or suffix in found:
                raise DatasetError(f"{where}: the suffix .{suffix} already has a reader")
            try:
                found[suffix] = point.load()
            except Exception as exc:  # noqa: BLE001 - a plugin's import error, in one line
                raise DatasetError(f"{where}: cannot load: {type(exc).__name__}: {exc}") from None
        FORMATS.update(found)
        _plugins_loaded.append(True)
    return FORMATS


def suffixes(separator: str) -> str:
    """The accepted suffixes for a message or help text, e.g. `.jsonl, .csv, .parquet`
    (a plugin's too once :func:`readers` has loaded them)."""
    return separator.join(f".{name}" for name in FORMATS)


def dataset_extension(path: Path) -> str:
    """The lower-cased extension, which decides the reader; anything else is refused."""
    extension = path.suffix.lstrip(".").lower()
    if extension not in readers():
        raise DatasetError(
            f"{path}: unsupported dataset extension {extension or '(none)'!r}; "
            f"expected one of {suffixes(', ')}"
        )
    return extension
