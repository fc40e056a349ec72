"""A run's rows by content: ``osmosis_rows.json``, the one store of its row digests.

Each selected dataset row's content digest (``dataset.rows.row_digest``), by dataset row:
what a later run finds its rows by, as ``--osmosis-reuse`` (results/reuse.py) and as a
regression gate's baseline (baseline.py) alike. Ours; the upload ignores the file.

:func:`read_row_digests` is the one reader. It also reads what runs wrote before this
store: ``osmosis_rows.json`` as a list by row index (mapped to dataset rows through the
journal), and the ``row_digests`` field of ``osmosis_metrics.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_osmosis.results.atomic import atomic_write_json

ROWS_FILENAME = "osmosis_rows.json"
_KEY = "rows"
#: Where runs written before this store kept their digests (dataset row -> digest).
_OLD_METRICS_FILENAME, _OLD_KEY = "osmosis_metrics.json", "row_digests"


def write_row_digests(run_dir: Path, digests: Mapping[int, str]) -> None:
    """``osmosis_rows.json``: dataset row -> content digest of every selected row."""
    # JSON writes int keys as their digits: no string key a row (the dataset's order is
    # usually the rows' already, and then no sorted copy either).
    rows = digests if list(digests) == sorted(digests) else dict(sorted(digests.items()))
    atomic_write_json(run_dir / ROWS_FILENAME, {_KEY: rows})


def read_row_digests(run_dir: Path) -> dict[int, str] | None:
    """Dataset row -> content digest of a run's rows; None when the run names none."""
    document = _read(run_dir / ROWS_FILENAME)
    found = _by_dataset_row(document.get(_KEY))
    if found is not None:
        return found
    old = document.get(_OLD_KEY)
    if isinstance(old, list) and all(isinstance(d, str) for d in old):
        return _by_journal(run_dir, old)
    return _by_dataset_row(_read(run_dir / _OLD_METRICS_FILENAME).get(_OLD_KEY))


def _read(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def _by_dataset_row(value: Any) -> dict[int, str] | None:
    if not isinstance(value, dict) or not value:
        return None
    try:
        return {int(row): str(digest) for row, digest in value.items()}
    except ValueError:
        return None


def _by_journal(run_dir: Path, by_position: list[str]) -> dict[int, str]:
    """The first store's list (by row index): its journal says each row's dataset row."""
    from pytest_osmosis.results.journal import replay_journal

    found: dict[int, str] = {}
    for record in replay_journal(run_dir / "events.jsonl").latest.values():
        row, source = record.get("row_index"), record.get("source_row_index")
        if isinstance(row, int) and isinstance(source, int) and 0 <= row < len(by_position):
            found[source] = by_position[row]
    return found
