"""The selected dataset: identity (path, sha256), sizes, and rows built on demand."""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import ConfigError, DatasetError
from pytest_osmosis.dataset.formats import dataset_extension, readers
from pytest_osmosis.dataset.rows import (
    EvalDatasetRow,
    RowProblem,
    normalise,
    row_digest,
    row_place,
)
from pytest_osmosis.dataset.scan import Identity, RowStore, Scan, identity, read_error
from pytest_osmosis.dataset.select import (
    check_in_range,
    dataset_ranges,
    format_row_selector,
    make_selection,
    sample_positions,
)

_CACHE_SIZE = 16


class SelectedDataset:
    """The rows a run executes: identity (path, sha256), sizes, and rows built on demand."""

    __slots__ = (
        "path",
        "format",
        "sha256",
        "total_dataset_rows",
        "selector",
        "identity",
        "_sources",
        "_store",
    )

    def __init__(self, path: Path, format: str, scan: Scan) -> None:
        self.path = path
        self.format = format
        self.sha256 = scan.sha256
        self.total_dataset_rows = scan.total
        self.identity: Identity = scan.identity
        self._sources = scan.sources
        self._store: RowStore = scan.store
        self.selector = format_row_selector(scan.sources)

    def __len__(self) -> int:
        return len(self._sources)

    def __repr__(self) -> str:
        return (
            f"SelectedDataset({str(self.path)!r}, rows={self.selector!r}, "
            f"total_dataset_rows={self.total_dataset_rows})"
        )

    @property
    def selected_source_rows(self) -> list[int]:
        """Source indices of the selection, in order (a fresh list: O(selected))."""
        return self._sources.tolist()

    def source_row_index(self, row_index: int) -> int:
        """O(1) source index of one selected row."""
        return self._sources[self._check(row_index)]

    def line(self, row_index: int) -> int | None:
        """The line of the dataset file where selected row `row_index` is, where the format
        has lines it keeps (JSONL and CSV); None for a columnar file (parquet)."""
        lines = getattr(self._store, "lines", None)
        return int(lines[self._check(row_index)]) if lines is not None else None

    def _check(self, row_index: int) -> int:
        if not 0 <= row_index < len(self._sources):
            raise IndexError(f"row_index {row_index} outside 0..{len(self._sources) - 1}")
        return row_index

    def row(self, row_index: int) -> EvalDatasetRow:
        """Build selected row `row_index` (fresh objects each call, safe to mutate)."""
        source = self._sources[self._check(row_index)]
        raw = self._store.raw(row_index)
        try:
            messages, label, metadata = normalise(raw)
        except RowProblem as problem:  # pragma: no cover - validated at open
            raise DatasetError(f"{row_place(self.path, source, None)}: {problem}") from None
        return EvalDatasetRow(row_index, source, messages, label, metadata)

    def close(self) -> None:
        """Release what reading rows keeps open (the JSONL file's descriptor) now, not at
        garbage collection: a dataset is memoised for the process, so it outlives the
        session. A row read after this opens the file again (and checks it is the same)."""
        close = getattr(self._store, "close", None)
        if close is not None:
            close()

    def row_digests(self, rows: Iterable[int] | None = None) -> dict[int, str]:
        """Dataset row -> :func:`row_digest` of the selected *rows* (row_index; default all)."""
        chosen = range(len(self)) if rows is None else rows
        return {self.source_row_index(index): row_digest(self.row(index)) for index in chosen}


_cache: OrderedDict[tuple[Any, ...], SelectedDataset] = OrderedDict()


def clear_dataset_cache() -> None:
    """Forget memoised datasets (tests, or a long-lived process that edits files)."""
    _cache.clear()


def open_dataset(
    path: Path,
    *,
    limit: int | None,
    rows: str | None,
    sample: float | None,
    seed: int,
) -> SelectedDataset:
    """Read, hash and select a dataset; every selected row is validated here.

    Selection: `rows` (if given) wins over `limit`; a positive `limit` keeps the first N
    rows, otherwise all. `sample` (a fraction in (0, 1]) then keeps a `seed`-determined
    subset, in dataset order, so every xdist worker selects the same rows.
    """
    if sample is not None and (
        isinstance(sample, bool)
        or not isinstance(sample, (int, float))
        or not math.isfinite(sample)
        or not 0 < sample <= 1
    ):
        raise ConfigError(f"sample must be a fraction in (0, 1], got {sample!r}")
    if sample is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    extension = dataset_extension(path)
    ranges = dataset_ranges(rows) if rows is not None else None
    try:
        resolved = path.resolve()
        stat = resolved.stat()
    except OSError as exc:
        raise read_error(path, exc) from None
    key = (
        str(resolved),
        identity(stat),
        None if ranges is not None else (limit if limit is not None and limit > 0 else None),
        tuple(ranges) if ranges is not None else None,
        sample,
        seed if sample is not None else None,
    )
    cached = _cache.get(key)
    if cached is not None:
        _cache.move_to_end(key)
        return cached

    selection = make_selection(ranges, limit if ranges is None else None, sample is not None)
    try:
        scan = readers()[extension](path, selection)
    except OSError as exc:
        raise read_error(path, exc) from None

    if ranges is not None:
        check_in_range(ranges, scan.total, str(path))
    if sample is not None:
        _keep(scan, sample_positions(len(scan.sources), sample, seed))
    if scan.errors:
        raise DatasetError(scan.errors[min(scan.errors)])
    if not scan.sources:
        raise DatasetError(f"{path} selected no rows (it has {scan.total} rows)")

    selected = SelectedDataset(path, extension, scan)
    _cache[key] = selected
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return selected


def _keep(scan: Scan, positions: list[int]) -> None:
    """Narrow a scan's candidates to `positions` (sorted), errors included."""
    if len(positions) == len(scan.sources):
        return
    scan.errors = {new: scan.errors[old] for new, old in enumerate(positions) if old in scan.errors}
    scan.sources = array("q", (scan.sources[at] for at in positions))
    scan.store.keep(positions)
