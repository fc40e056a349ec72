"""Row selection (contract §3.3): the one row-selector grammar, and the seeded sample.

A selector is 0-based indices and inclusive ranges joined by commas, e.g. `3,7,10-20`. The
option check, the dataset reader and the run browser all parse it with
`parse_row_selector`; the manifest and the dataset write it with `format_row_selector`.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pytest_osmosis.core.errors import DatasetError

_SELECTOR_RE = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")

Ranges = list[tuple[int, int]]


class RowSelectorError(ValueError):
    """A selector breaks the grammar; `inverted` is the (start, end) written backwards."""

    def __init__(self, message: str, inverted: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.inverted = inverted


def parse_row_selector(spec: str) -> Ranges:
    """`3,7,10-20` to sorted, merged inclusive ranges (never materialised)."""
    text = spec.strip()
    if not _SELECTOR_RE.fullmatch(text):
        raise RowSelectorError("must be comma-separated row indices or ranges such as '0-9,12'")
    ranges: Ranges = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        try:
            start = int(first)
            end = int(last) if last else start
        except ValueError:  # more digits than int() accepts
            raise RowSelectorError("an index is too large") from None
        if start > end:
            raise RowSelectorError(
                f"range {part} is inverted (start must not exceed end)", (start, end)
            )
        ranges.append((start, end))
    ranges.sort()
    merged: Ranges = []
    for start, end in ranges:
        if merged and start <= merged[-1][1] + 1:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def format_row_selector(indices: Iterable[int]) -> str:
    """Compact form the manifest stores, e.g. `0-9,12` (sorted, unique, runs as a-b)."""
    ranges: Ranges = []
    for index in sorted(set(indices)):
        if ranges and index == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], index)
        else:
            ranges.append((index, index))
    return _ranges_text(ranges)


def _ranges_text(ranges: Iterable[tuple[int, int]]) -> str:
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def dataset_ranges(spec: str) -> Ranges:
    """`parse_row_selector` for the dataset reader, failing as a `DatasetError`."""
    try:
        return parse_row_selector(spec)
    except RowSelectorError as exc:
        if exc.inverted is not None:
            start, end = exc.inverted
            raise DatasetError(
                f"rows selector range '{start}-{end}' is inverted; write it as {end}-{start}"
            ) from None
        raise DatasetError(f"invalid rows selector {spec!r}: {exc}") from None


def check_in_range(ranges: Ranges, total: int, name: str) -> None:
    beyond = [(max(start, total), end) for start, end in ranges if end >= total]
    if beyond:
        valid = f"valid indices are 0-{total - 1}" if total else "it has no rows"
        raise DatasetError(
            f"rows selector selects {_ranges_text(beyond)} but {name} has {total} rows ({valid})"
        )


def parse_rows(spec: str, total: int) -> list[int]:
    """Parse a `--rows` value like `3,7,10-20` into sorted unique indices below `total`."""
    ranges = dataset_ranges(spec)
    check_in_range(ranges, total, "the dataset")
    return [index for start, end in ranges for index in range(start, end + 1)]


@dataclass(frozen=True)
class Selection:
    """What a reader is told: which source rows are candidates, and whether it samples.

    `pick` is called with increasing source indices; `last` is the last index any candidate
    can have (None: read to the end); when `sampling`, a bad candidate is recorded in the
    scan's `errors` rather than raised, since the sample may not keep it.
    """

    pick: Callable[[int], bool]
    last: int | None
    sampling: bool


def make_selection(ranges: Ranges | None, limit: int | None, sampling: bool) -> Selection:
    """Candidates are the `ranges` if given, else the first `limit` rows (positive), else all."""
    if ranges is not None:
        state = {"at": 0}

        def in_ranges(source: int) -> bool:
            at = state["at"]
            while at < len(ranges) and ranges[at][1] < source:
                at += 1
            state["at"] = at
            return at < len(ranges) and ranges[at][0] <= source

        return Selection(in_ranges, ranges[-1][1], sampling)
    if limit is not None and limit > 0:
        bound = limit
        return Selection(lambda source: source < bound, bound - 1, sampling)
    return Selection(lambda source: True, None, sampling)


def sample_positions(count: int, fraction: float, seed: int) -> list[int]:
    """A seeded subset of `range(count)`: round(count * fraction) rows, at least one."""
    wanted = min(count, max(1, math.floor(count * fraction + 0.5)))
    if wanted >= count:
        return list(range(count))
    # random.Random(int) is identical in every process; hash() and the global RNG are not.
    return sorted(random.Random(seed).sample(range(count), wanted))
