"""Parquet (needs pyarrow): kept rows are their contract columns as Arrow data."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import DatasetError
from pytest_osmosis.dataset.rows import CONTRACT_COLUMNS, one_line
from pytest_osmosis.dataset.scan import Scan, read_all
from pytest_osmosis.dataset.select import Selection

_PARQUET_BATCH = 1 << 16


class _ParquetRows:
    """The contract columns present (`names`) of the kept rows, far smaller than dicts."""

    __slots__ = ("names", "table", "_combined")

    def __init__(self) -> None:
        self.names: tuple[str, ...] = ()
        self.table: Any = None
        self._combined: Any = None

    def keep(self, positions: list[int]) -> None:
        if self.table is not None:
            self.table = self.table.take(positions)

    def raw(self, position: int) -> Mapping[str, Any]:
        if self._combined is None and self.table is not None:
            self._combined = self.table.combine_chunks()  # one chunk makes column[i] O(1)
        table = self._combined
        return {
            name: None if table is None else table.column(at)[position].as_py()
            for at, name in enumerate(self.names)
        }


def scan_parquet(path: Path, selection: Selection) -> Scan:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            f"{path}: reading Parquet datasets needs pyarrow: pip install 'pytest-osmosis[parquet]'"
        ) from None
    store = _ParquetRows()
    scan = Scan(store, selection.sampling)
    data, scan.sha256, scan.identity = read_all(path)
    kept: list[Any] = []
    # pyarrow parses untrusted bytes: whatever it raises means "this file is unreadable".
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        present = set(parquet.schema_arrow.names)
        total = int(parquet.metadata.num_rows)
    except Exception as exc:
        raise DatasetError(
            f"{path}: not a readable Parquet file ({type(exc).__name__}: {one_line(exc)})"
        ) from None
    columns = [name for name in CONTRACT_COLUMNS if name in present]
    store.names = tuple(columns)
    batches = iter(parquet.iter_batches(batch_size=_PARQUET_BATCH, columns=columns))
    offset = 0
    exhausted = False
    while selection.last is None or offset <= selection.last:
        try:
            batch = next(batches, None)
        except Exception as exc:
            raise DatasetError(
                f"{path}: cannot read Parquet rows from {offset} on "
                f"({type(exc).__name__}: {one_line(exc)})"
            ) from None
        if batch is None:
            exhausted = True
            break
        size = int(batch.num_rows)
        wanted = [at for at in range(size) if selection.pick(offset + at)]
        if wanted:
            # A repeated column name comes back twice; like to_pylist(), the last one wins.
            batch_names = list(batch.schema.names)
            arrays = [
                batch.column(len(batch_names) - 1 - batch_names[::-1].index(name))
                for name in columns
            ]
            values: list[list[Any]] = []
            for name, column in zip(columns, arrays, strict=True):
                try:
                    values.append(column.to_pylist())
                except Exception as exc:
                    raise DatasetError(
                        f"{path}: column {name!r} of type {column.type} cannot be read as "
                        f"Python values ({type(exc).__name__}: {one_line(exc)})"
                    ) from None
            for at in wanted:
                raw = {
                    name: column_values[at]
                    for name, column_values in zip(columns, values, strict=True)
                }
                scan.add(raw, offset + at, (path, None))
            if columns:
                selected = pa.RecordBatch.from_arrays(arrays, names=columns)
                kept.append(selected if len(wanted) == size else selected.take(pa.array(wanted)))
        offset += size
    if offset > total or (exhausted and offset != total):
        # A damaged footer: the row count the contract reports must be the real one.
        held = offset if exhausted else f"at least {offset}"
        raise DatasetError(
            f"{path}: corrupt Parquet file: its footer says {total} rows, its row groups "
            f"hold {held}"
        )
    scan.total = total
    if kept:
        store.table = pa.Table.from_batches(kept)
    return scan
