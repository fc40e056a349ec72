"""``--osmosis-shard K/N``: the stable 1/N of a run's work items one CI job runs.

An item belongs to a shard by a digest of its dataset row's content plus its attempt, not
by its position: adding rows elsewhere in the dataset moves no recorded item to another
shard, and the attempts of one row go to consecutive shards (a row with n = N attempts
puts one in every shard). Each shard writes a run directory of its own,
``<run name>-shard-K-of-N``, whose manifest inputs are the unsharded run's;
``pytest-osmosis merge`` (results/merge.py) joins the shards into the run one session
would have written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_osmosis.core.errors import ConfigError

if TYPE_CHECKING:
    from pytest_osmosis.dataset import SelectedDataset

_SPEC = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")
_SUFFIX = re.compile(r"-shard-(\d+)-of-(\d+)$")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"shard {self.index} of {self.count}"

    @property
    def suffix(self) -> str:
        """What a shard's run name ends with."""
        return f"-shard-{self.index}-of-{self.count}"

    def as_provenance(self) -> dict[str, int]:
        """``manifest.provenance.shard``: what merge reads to tell the shards apart."""
        return {"index": self.index, "count": self.count}

    def owns(self, row_digest: str, run_index: int) -> bool:
        """Whether attempt ``run_index`` of the row with content digest ``row_digest`` is ours."""
        return (int(row_digest[:16], 16) + run_index) % self.count == self.index - 1


def parse_shard(text: str, source: str = "--osmosis-shard") -> Shard:
    """``K/N`` with 1 <= K <= N; anything else is one line naming the option."""
    match = _SPEC.fullmatch(str(text))
    if match is None:
        raise ConfigError(f"{source}: expected K/N (e.g. 2/4), got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise ConfigError(f"{source}: K must be from 1 to N and N at least 1, got {text!r}")
    return Shard(index, count)


def unsharded_name(run_name: str) -> str:
    """A shard's run name without its ``-shard-K-of-N`` suffix (the merged run's default)."""
    return _SUFFIX.sub("", run_name)


def row_digests(dataset: SelectedDataset) -> list[str]:
    """Every selected row's content digest, by selection position."""
    return list(dataset.row_digests().values())


def shard_keys(digests: list[str], n: int, shard: Shard) -> list[tuple[int, int]]:
    """The ``(row_index, run_index)`` work items of ``shard`` (rows by content *digests*)."""
    return [
        (position, attempt)
        for position, digest in enumerate(digests)
        for attempt in range(n)
        if shard.owns(digest, attempt)
    ]
