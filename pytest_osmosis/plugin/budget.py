"""Hard budgets (``--osmosis-max-tokens``, ``--osmosis-max-cost``): which rows may start.

The rule: a row starts only while what this session's recorded rows spent, plus a reserve
for every row in flight, stays below the budget. A row's reserve is the most any recorded
row of this session spent; until one row is recorded nothing is known, so the first row runs
alone. Rows in flight always finish, so when rows spend alike the session ends at most one
row's spend over the budget (a row that spends more than every row before it can add the
difference). Each session has its own budget: running the same command again resumes.

The controller alone decides. In one process it admits each row as the executor starts it.
Under xdist it publishes how many rows may have started in all (``limit``) in a directory the
workers share; a worker takes the next numbered ticket (a file created exclusively, holding
its id) before it starts a row, so two workers never start on the same room. Once a budget is
spent and no row is in flight, the controller writes the stop line, with the final spend.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: How often a worker waiting to start a row looks at what the controller published.
POLL_S = 0.02

_LIMIT = "limit"
_STOP = "spent"
_TICKETS = "tickets"


class Budget:
    """Controller: what this session's rows spent, and how many rows may have started."""

    def __init__(
        self, max_tokens: int | None, max_cost: float | None, shared: Path | None = None
    ) -> None:
        self.max_tokens = max_tokens
        self.max_cost = max_cost
        self.tokens = 0
        self.cost = 0.0
        self._largest_tokens = 0
        self._largest_cost = 0.0
        #: Rows recorded that held a start (a ticket), plus a lost worker's unrecorded ones.
        self.settled = 0
        self.started = 0  # one process: rows admitted so far
        self._lock = threading.Lock()
        #: xdist: the directory the workers read ``limit`` and ``spent`` from.
        self.shared = shared
        self._by_worker: dict[str, int] = {}  # worker id -> its rows recorded
        if shared is not None:
            (shared / _TICKETS).mkdir(parents=True, exist_ok=True)
            self._publish()

    # -- what was spent -------------------------------------------------------------

    def record(self, tokens: int, cost: float | None, worker: str | None = None) -> None:
        """A row this session started finished and was journalled."""
        with self._lock:
            self.tokens += tokens
            self.cost += cost or 0.0
            self._largest_tokens = max(self._largest_tokens, tokens)
            self._largest_cost = max(self._largest_cost, cost or 0.0)
            self.settled += 1
            if worker is not None:
                self._by_worker[worker] = self._by_worker.get(worker, 0) + 1
        if self.shared is not None:
            self._publish()

    def worker_gone(self, worker: str) -> None:
        """xdist: a worker is down; the rows it started and never reported are not in flight."""
        if self.shared is None:
            return
        with self._lock:
            held = sum(1 for who in _ticket_owners(self.shared) if who == worker)
            self.settled += max(0, held - self._by_worker.get(worker, 0))
            self._by_worker[worker] = held
        self._publish()

    def spent(self) -> bool:
        """Whether a budget is spent: no row starts any more."""
        return (self.max_tokens is not None and self.tokens >= self.max_tokens) or (
            self.max_cost is not None and self.cost >= self.max_cost
        )

    def spend_text(self) -> str:
        """``233 tokens of --osmosis-max-tokens 100``: each budget and what this session spent."""
        from pytest_osmosis.core.words import dollars

        parts = []
        if self.max_tokens is not None:
            parts.append(f"{self.tokens} tokens of --osmosis-max-tokens {self.max_tokens}")
        if self.max_cost is not None:
            parts.append(f"{dollars(self.cost)} of --osmosis-max-cost {dollars(self.max_cost)}")
        return ", ".join(parts)

    def stop_line(self) -> str:
        """The line a spent budget stops the session with."""
        return (
            f"osmosis: budget spent ({self.spend_text()}): rows in flight finished, rows not "
            "started stay pending; run the same command again to resume"
        )

    # -- who may start --------------------------------------------------------------

    def room(self) -> int:
        """Rows that may be in flight now: each reserves the largest spend of a row so far."""
        if self.spent():
            return 0
        if self.settled == 0:
            return 1  # nothing is known yet: the first row runs alone
        rooms = []
        for limit, spent, largest in (
            (self.max_tokens, float(self.tokens), float(self._largest_tokens)),
            (self.max_cost, self.cost, self._largest_cost),
        ):
            if limit is not None and largest > 0:
                rooms.append(math.ceil((limit - spent) / largest))
        return max(1, min(rooms)) if rooms else 1_000_000_000

    def limit(self) -> int:
        """How many rows may have started in all (started ones that finished included)."""
        return self.settled + self.room()

    def admit(self) -> bool:
        """One process: whether the next row may start now (it counts as started if so)."""
        with self._lock:
            if self.started < self.limit():
                self.started += 1
                return True
            return False

    def in_flight(self) -> int:
        """Rows started and not yet recorded (xdist: every ticket taken counts)."""
        started = len(_ticket_owners(self.shared)) if self.shared is not None else self.started
        return max(0, started - self.settled)

    def _publish(self) -> None:
        assert self.shared is not None
        from pytest_osmosis.results.atomic import atomic_write_bytes

        atomic_write_bytes(self.shared / _LIMIT, str(self.limit()).encode(), durable=False)

    def publish_stop(self, line: str) -> None:
        """xdist: tell every worker no row starts any more."""
        if self.shared is not None:
            from pytest_osmosis.results.atomic import atomic_write_bytes

            atomic_write_bytes(self.shared / _STOP, line.encode(), durable=False)


def _ticket_owners(shared: Path) -> list[str]:
    """The worker id in each ticket taken so far ("" while one is being written)."""
    owners = []
    for entry in os.scandir(shared / _TICKETS):
        try:
            owners.append(Path(entry.path).read_text())
        except OSError:
            owners.append("")
    return owners


class Tickets:
    """An xdist worker's side: take a ticket before starting a row; read the stop line."""

    def __init__(self, shared: Path, worker: str) -> None:
        self.shared = shared
        self.worker = worker
        self._next = 0  # tickets below this one are taken

    def take(self) -> bool:
        """Whether this worker may start a row now (it holds a ticket for it if so)."""
        try:
            limit = int((self.shared / _LIMIT).read_text() or 0)
        except (OSError, ValueError):
            return False
        while self._next < limit:
            path = self.shared / _TICKETS / str(self._next)
            self._next += 1
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue  # another worker took it
            with os.fdopen(fd, "w") as handle:
                handle.write(self.worker)
            return True
        return False

    def stop_line(self) -> str | None:
        try:
            return (self.shared / _STOP).read_text() or None
        except OSError:
            return None


def wait_between_looks() -> None:
    """A worker waits for the controller to record rows in flight elsewhere."""
    time.sleep(POLL_S)


def budget_values(values: Mapping[str, Any]) -> tuple[int | None, float | None]:
    """The session's (max tokens, max cost) from the gate's option values."""
    tokens, cost = values.get("max_tokens"), values.get("max_cost")
    return (int(tokens) if tokens is not None else None, float(cost) if cost is not None else None)
