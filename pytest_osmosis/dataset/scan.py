"""The reader protocol: one pass over a file that hashes, counts and validates candidates.

A format is a `Reader`: given the path and a `Selection`, it returns a `Scan` whose `store`
rebuilds any kept candidate's raw mapping later (`RowStore`), so an item never carries its
row. Everything else (selection, sampling, normalisation, caching) is shared.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_osmosis.core.errors import DatasetError
from pytest_osmosis.dataset.rows import RowProblem, normalise, row_place
from pytest_osmosis.dataset.select import Selection

Identity = tuple[int, int, int, int]


class RowStore(Protocol):
    """Rebuilds the raw mapping of a kept candidate, by its position among the candidates.

    A store that keeps a file open between reads also has ``close()`` (called when the
    session ends; a read after it opens the file again): ``SelectedDataset.close``."""

    def raw(self, position: int) -> Mapping[str, Any]: ...

    def keep(self, positions: list[int]) -> None:
        """Narrow to `positions` (sorted) when sampling; positions renumber from 0."""


class RowList:
    """A `RowStore` that keeps each kept candidate's mapping: enough for a small format
    (a plugin's reader appends to `values` after `Scan.add`)."""

    def __init__(self) -> None:
        self.values: list[Mapping[str, Any]] = []

    def raw(self, position: int) -> Mapping[str, Any]:
        return dict(self.values[position])

    def keep(self, positions: list[int]) -> None:
        self.values = [self.values[at] for at in positions]


@dataclass
class Scan:
    """What one read pass leaves behind, for the candidate rows (before sampling)."""

    store: RowStore
    sampling: bool
    sha256: str = ""
    identity: Identity = (0, 0, 0, 0)
    total: int = 0
    sources: array[int] = field(default_factory=lambda: array("q"))
    errors: dict[int, str] = field(default_factory=dict)  # candidate -> message, when sampling

    def add(self, raw: Mapping[str, Any], source: int, where: tuple[Path, int | None]) -> None:
        """Validate candidate `source` and count it; the reader then stores what it needs.

        When sampling, only a problem in a sampled row is fatal, so it is kept for later.
        """
        try:
            normalise(raw)
        except RowProblem as problem:
            message = f"{row_place(where[0], source, where[1])}: {problem}"
            if not self.sampling:
                raise DatasetError(message) from None
            self.errors[len(self.sources)] = message
        self.sources.append(source)


class Reader(Protocol):
    """A dataset format: `formats.readers()` maps a file suffix to one."""

    def __call__(self, path: Path, selection: Selection) -> Scan: ...


def identity(stat: os.stat_result) -> Identity:
    """What says a file is the one that was read: device, inode, size, mtime."""
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def read_error(path: Path, exc: OSError) -> DatasetError:
    return DatasetError(f"cannot read dataset {path}: {exc.strerror or exc}")


def changed(path: Path) -> DatasetError:
    return DatasetError(f"{path} changed while it was being read; run again on a stable file")


def read_all(path: Path) -> tuple[bytes, str, Identity]:
    """The whole file, its sha256 and identity, refusing a file that changes meanwhile."""
    with path.open("rb") as handle:
        before = identity(os.fstat(handle.fileno()))
        data = handle.read()
        if identity(os.fstat(handle.fileno())) != before:
            raise changed(path)
    return data, hashlib.sha256(data).hexdigest(), before
