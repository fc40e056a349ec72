"""``osmosis_metrics.json``: what we measure beyond the SDK's ``metrics.json``, in a file of ours.

``metrics.json`` keeps the SDK's shape byte for byte (the platform recomputes it), so the
per-row view of ``n`` attempts (pass^k, flaky rows, the ``--osmosis-row-pass`` verdicts) and
the run's cost in dollars live beside it. The upload ignores the file (contract §14 D50).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_osmosis.core.outcome import (
    PASSED,
    ROW_CLASSES,
    ROW_FLAKY,
    SKIPPED,
    classify,
    row_class,
    row_passes,
)
from pytest_osmosis.results.metrics import ks_up_to, pass_hat_k

ROW_METRICS_FILENAME = "osmosis_metrics.json"


def cost_of(value: Any) -> float | None:
    """A recorded cost as a float; None for anything else (unpriced, or not recorded)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def per_row_passes(
    rows: Iterable[Mapping[str, Any]],
    key: Callable[[Mapping[str, Any]], Any] = lambda row: row.get("row_index"),
) -> dict[int, tuple[int, int]]:
    """``{row: (passes, attempts)}`` over non-skipped attempts (skips are not attempts).

    *key* names a row (default its selection position; the report passes the dataset row).
    """
    counts: dict[int, tuple[int, int]] = {}
    for row in rows:
        index = key(row)
        if not isinstance(index, int):
            continue
        passes, attempts = counts.get(index, (0, 0))
        if row.get("outcome") == SKIPPED:
            counts[index] = (passes, attempts)
            continue
        counts[index] = (passes + int(row.get("outcome") == PASSED), attempts + 1)
    return counts


def attempts_by_row(
    records: Iterable[Mapping[str, Any]], threshold: float
) -> dict[int, tuple[int, int]]:
    """Dataset row -> (passing attempts, attempts not skipped) of journal or index rows."""
    from pytest_osmosis.results.run_reader import dataset_row

    return per_row_passes(
        ({**record, "outcome": classify(record, threshold)} for record in records),
        key=dataset_row,
    )


def row_metrics(
    counts: Mapping[int, tuple[int, int]],
    *,
    n: int,
    row_pass: tuple[int, int] | None = None,
    costs: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """The ``osmosis_metrics.json`` document for one run's per-row counts.

    ``costs`` maps each recorded attempt's rollout id to its cost in dollars (None: the
    model has no price); the run's cost is unknown when any attempt's is.
    """
    classes = dict.fromkeys(ROW_CLASSES, 0)
    flaky: list[int] = []
    skipped: list[int] = []  # every attempt skipped: no class, yet the row is in the run
    for row in sorted(counts):  # the keys alone: a sorted copy of the items was 64 B a row
        found = row_class(*counts[row])
        if found is None:
            skipped.append(row)
        else:
            classes[found] += 1
        if found == ROW_FLAKY:
            flaky.append(row)
    # ``skipped_rows`` came later than the rest: readers take its absence for none.
    doc: dict[str, Any] = {"rows": classes, "flaky_rows": flaky, "skipped_rows": skipped}
    points = []
    for k in ks_up_to(n) if n >= 2 else []:
        values = [
            pass_hat_k(attempts=attempts, passes=passes, k=k)
            for passes, attempts in counts.values()
            if attempts >= k
        ]
        if values:
            points.append({"k": k, "value": statistics.fmean(values)})
    if points:
        doc["pass_hat_k"] = points
    if row_pass is not None:
        need, of = row_pass
        verdicts = [row_passes(p, a, need) for p, a in counts.values() if a > 0]
        doc["row_pass"] = {
            "k": need,
            "n": of,
            "passed": sum(verdicts),
            "failed": len(verdicts) - sum(verdicts),
        }
    if costs is not None:
        known = [cost for cost in costs.values() if cost is not None]
        doc["cost_usd"] = math.fsum(known) if len(known) == len(costs) else None
        # Written in rollout id order; a map already in that order is not copied again.
        ordered = all(a < b for a, b in itertools.pairwise(costs))
        doc["cost_usd_by_rollout"] = costs if ordered else dict(sorted(costs.items()))
    return doc


def recorded_cost(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run's cost from an ``osmosis_metrics.json`` document: dollars of the priced
    attempts (None when none was priced), how many were priced, of how many; None when the
    run recorded no costs (the SDK's own runs, runs written before costs were)."""
    from pytest_osmosis.core.words import priced_costs

    costs = doc.get("cost_usd_by_rollout")
    if not isinstance(costs, dict):
        return None
    total, priced, attempts = priced_costs(costs.values())
    return {"usd": total if priced else None, "priced_attempts": priced, "attempts": attempts}


def cost_text(cost: Mapping[str, Any] | None) -> str | None:
    """:func:`recorded_cost` in the words the results table and ``info`` both show
    (``$0.000123 for 3 of 5 priced attempts``, ``unknown``); None when nothing was recorded."""
    from pytest_osmosis.core.words import cost_words

    if cost is None:
        return None
    return cost_words(cost["usd"] or 0.0, cost["priced_attempts"], cost["attempts"])


def read_row_metrics(run_dir: Path) -> dict[str, Any]:
    """The run's ``osmosis_metrics.json`` ({} when absent or unreadable: it is only ours)."""
    from pytest_osmosis.results import stdjson as json
    from pytest_osmosis.results.run_reader import read_bytes

    try:
        value = json.loads(read_bytes(run_dir, ROW_METRICS_FILENAME))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write_row_metrics(run_dir: Path, doc: Mapping[str, Any]) -> None:
    from pytest_osmosis.results.atomic import atomic_write_json

    atomic_write_json(run_dir / ROW_METRICS_FILENAME, dict(doc))
