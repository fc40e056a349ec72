"""The model-call cache: what the bridge answered, kept by row, attempt and call, replayed.

One SQLite file per output root (``<output root>/.cache/model-calls.sqlite``, outside every
run directory, so ``osmosis eval upload`` never sees it), shared by every process of a
session (xdist workers too) and by later sessions. The bridge is its only writer: each
call it serves for a rollout is looked up before the provider is called and stored after
(`CachedAttempt.serve`), so a second run of the same rows answers from the file, and a
``replay`` run answers from it alone, offline, or fails the row in one line (`cache_miss`).

A key is the sha256 of: the model as resolved (the run's model or the judge a request
named), the request body without its envelope (``model``, ``stream``, ``stream_options``:
the answer does not depend on them), the row's identity in its dataset, the attempt index
and which repeat of that same request within the attempt this is. Counting repeats of one
request, not calls, keeps concurrent calls of one attempt (parallel tools, sub-agents) on
their own entries whatever order they arrive in, while a multi-turn agent still replays
turn by turn (each turn's request differs) and ``n`` attempts stay independent.

SQLite in WAL mode: readers never wait for the writer, a writer killed mid-write leaves
nothing torn (its transaction is rolled back on the next open). Lookups run on the
caller's thread (the bridge's loop) on a reader connection; stores are queued to one
writer thread per process, batched into one transaction, so a rollout never waits for a
write (nor for another process holding the write lock). Nothing secret is stored: a call
whose request or answer holds a value `results.redact.scrub` would redact is not cached, and
headers (the bridge's bearer, provider keys) are never part of an entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_osmosis.core.errors import ConfigError
from pytest_osmosis.model.ratelimit import Backoff
from pytest_osmosis.model.routes import ModelRoute, _Target
from pytest_osmosis.model.wire import _plain, _usage

__all__ = [
    "CACHE_FILENAME",
    "MODES",
    "CacheCorrupt",
    "CacheMiss",
    "CachedAttempt",
    "CallCache",
    "cache_path",
    "cache_size",
    "cache_stats",
    "offline_judge",
    "parse_max_age",
    "remove_entries",
]

logger = logging.getLogger(__name__)

MODES = ("off", "use", "record", "replay")
"""``off``: no cache; ``use``: serve hits, call and store on a miss; ``record``: always call
and store; ``replay``: serve hits only, a miss fails the row and no model is called."""
CACHE_DIRNAME = ".cache"
CACHE_FILENAME = "model-calls.sqlite"
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0
"""How long a connection waits for another process's write lock before giving up."""
_ENVELOPE = ("model", "stream", "stream_options")
_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    key BLOB PRIMARY KEY,
    model TEXT NOT NULL,
    attempt TEXT NOT NULL,
    response TEXT NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    total_tokens INTEGER,
    latency_ms REAL NOT NULL,
    created REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS calls_created ON calls (created);
CREATE INDEX IF NOT EXISTS calls_model ON calls (model);
"""


def cache_path(output_root: Path) -> Path:
    """Where the cache of runs under `output_root` lives (beside them, never inside one)."""
    return output_root / CACHE_DIRNAME / CACHE_FILENAME


def parse_max_age(text: str, where: str = "--osmosis-cache-max-age") -> float:
    """Seconds from ``30m``, ``12h``, ``7d``, ``2w`` (Inspect's spelling); one line if bad."""
    match = _AGE.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(f"{where}: expected a positive age like 30m, 12h, 7d or 2w, got {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2).lower()]


class CacheMiss(Exception):
    """``replay`` has no recorded answer for a call: the bridge answers 404, the row fails."""

    status_code = 404
    error_type = "cache_miss"


class CacheCorrupt(CacheMiss):
    """``replay`` found an entry that is not an answer (damaged or edited): the row fails."""

    error_type = "cache_corrupt"


_TOKEN_FIELDS = (
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "input_tokens",
    "output_tokens",
)


def answer_problem(response: Any) -> str | None:
    """Why ``response`` is not a chat completion the bridge could serve, else None.

    What every entry is checked against when it is read (and before it is stored): a JSON
    object with a non-empty ``choices`` list of objects with a ``message`` object, and a
    ``usage``, when present, whose token counts are non-negative integers.
    """
    if not isinstance(response, dict):
        return f"not a JSON object but {type(response).__name__}"
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no choices"
    for at, choice in enumerate(choices):
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            return f"choice {at} has no message object"
    usage = response.get("usage")
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return "usage is not an object"
    for name in _TOKEN_FIELDS:
        value = usage.get(name)
        if value is not None and (type(value) is not int or value < 0):
            return f"usage.{name} is {value!r}, not a non-negative integer"
    return None


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(
        str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    return conn


@dataclass(frozen=True)
class _Entry:
    key: bytes
    model: str
    attempt: str
    """Which (row, attempt) made the call (``gsm8k#7:0``): what a plan counts as answered."""
    response: dict[str, Any]
    latency_ms: float
    checked: tuple[str, ...]
    """Texts that must hold no secret for the entry to be stored (the request's key text)."""
    secrets: tuple[str, ...]


class CallCache:
    """One cache file, as one process uses it: a reader connection and a writer thread."""

    def __init__(self, path: Path, mode: str, max_age_s: float | None = None) -> None:
        if mode not in MODES or mode == "off":
            raise ValueError(f"cache mode must be one of use, record, replay, got {mode!r}")
        self.path = path
        self.mode = mode
        self.max_age_s = max_age_s
        self.hits = 0
        self.misses = 0
        self.stored = 0
        self.refused = 0
        """Calls not stored because their request or answer held a secret value."""
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Entry | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._failed_write: str | None = None
        self._failed_read = False

    @property
    def replay(self) -> bool:
        """Only recorded answers are served; no call reaches a model."""
        return self.mode == "replay"

    # ----------------------------------------------------------------- opening

    def open(self) -> CallCache:
        """Create the file (and its schema) or open it; ``replay`` needs it to exist."""
        if self._reader is not None:
            return self
        if self.replay and not self.path.is_file():
            raise ConfigError(
                f"--osmosis-cache replay: no model-call cache at {self.path} "
                "(record one first with --osmosis-cache use or record)"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = _connect(self.path)
            if not self.replay:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.executescript(_SCHEMA)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"model-call cache {self.path}: cannot open it: {exc}") from None
        if version != SCHEMA_VERSION:
            conn.close()
            raise ConfigError(
                f"model-call cache {self.path}: schema version {version}, this plugin reads "
                f"{SCHEMA_VERSION} (clear it with `pytest-osmosis cache clear`)"
            )
        self._reader = conn
        return self

    def attempt(self, dataset: str, source_row: int, attempt: int) -> CachedAttempt:
        """The view of one (row, attempt): its calls are keyed by this row and attempt."""
        return CachedAttempt(self, row_id(dataset, source_row), source_row, attempt)

    # ----------------------------------------------------------------- reading

    def lookup(self, key: bytes) -> dict[str, Any] | None:
        """The recorded answer for `key`, or None (absent, or older than the max age).

        Raises :class:`CacheCorrupt` (one line naming the file and the key) for an entry
        that is not an answer: never served.
        """
        reader = self._reader if self._reader is not None else self.open()._reader
        assert reader is not None
        try:
            with self._read_lock:
                row = reader.execute(
                    "SELECT response, created FROM calls WHERE key = ?", (key,)
                ).fetchone()
        except sqlite3.Error as exc:  # a damaged file: a miss (use calls the model), said once
            if not self._failed_read:
                self._failed_read = True
                logger.warning("model-call cache %s: cannot read it: %s", self.path, exc)
            return None
        if row is None:
            return None
        if self.max_age_s is not None and time.time() - row[1] > self.max_age_s:
            return None
        try:
            response = json.loads(row[0])
        except (TypeError, ValueError, RecursionError) as exc:
            problem: str | None = f"not JSON ({type(exc).__name__})"
        else:
            problem = answer_problem(response)
        if problem is not None:
            raise CacheCorrupt(
                f"model-call cache {self.path}: entry {key.hex()} is damaged: {problem} "
                "(remove it with `pytest-osmosis cache clear`, or run with --osmosis-cache use "
                "to record it again)"
            )
        answer: dict[str, Any] = response
        return answer

    # ----------------------------------------------------------------- writing

    def store(self, entry: _Entry) -> None:
        """Queue `entry` for the writer thread; the caller never waits for the disk."""
        with self._writer_lock:
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_loop, name="osmosis-cache-writer", daemon=True
                )
                self._writer.start()
        self._queue.put(entry)

    def _write_loop(self) -> None:
        from pytest_osmosis.results.redact import scrub

        conn: sqlite3.Connection | None = None
        while True:
            first = self._queue.get()
            batch = [first]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = None in batch
            rows = []
            for entry in batch:
                if entry is None:
                    continue
                try:
                    text = json.dumps(entry.response, ensure_ascii=False, allow_nan=False)
                except (TypeError, ValueError):  # not JSON: served once, never replayed
                    self.refused += 1
                    continue
                if answer_problem(entry.response) is not None:  # replay would refuse it
                    self.refused += 1
                    continue
                if any(scrub(t, entry.secrets) != t for t in (text, *entry.checked)):
                    if not self.refused:  # once: which call it was would name the secret's row
                        logger.warning(
                            "model-call cache %s: calls whose request or answer holds a secret "
                            "value are not stored (replay will miss them)",
                            self.path,
                        )
                    self.refused += 1
                    continue
                usage = _usage(entry.response) or {}
                rows.append(
                    (
                        entry.key,
                        entry.model,
                        entry.attempt,
                        text,
                        usage.get("prompt_tokens"),
                        usage.get("completion_tokens"),
                        usage.get("total_tokens"),
                        entry.latency_ms,
                        time.time(),
                    )
                )
            if rows:
                try:
                    if conn is None:
                        conn = _connect(self.path)
                    conn.execute("BEGIN IMMEDIATE")
                    conn.executemany(
                        "INSERT OR REPLACE INTO calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
                    )
                    conn.execute("COMMIT")
                    self.stored += len(rows)
                except sqlite3.Error as exc:
                    if conn is not None and conn.in_transaction:
                        conn.execute("ROLLBACK")
                    if self._failed_write is None:  # once, not once per call
                        logger.warning("model-call cache %s: cannot store: %s", self.path, exc)
                    self._failed_write = str(exc)
            if done:
                if conn is not None:
                    conn.close()
                return

    def close(self) -> None:
        """Write what is queued, then close (a session's end; the file stays for the next)."""
        with self._writer_lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            self._queue.put(None)
            writer.join(timeout=BUSY_TIMEOUT_S + 5)
        reader, self._reader = self._reader, None
        if reader is not None:
            with self._read_lock:
                reader.close()


@dataclass
class CachedAttempt:
    """One (row, attempt) as the cache sees it: its calls are numbered as they come."""

    cache: CallCache
    row: str
    """The row's identity: its dataset and its row number there (``gsm8k#7``)."""
    source_row: int
    attempt: int
    calls: int = 0
    hits: int = 0
    """Calls answered from the cache."""
    failure: tuple[str, str] | None = None
    """The first call `replay` could not answer, as (error type, one line): the row's
    ``cache_miss`` (no entry) or ``cache_corrupt`` (an entry that is not an answer)."""
    _repeats: dict[bytes, set[int]] = field(default_factory=dict)
    """Per request: the repeat numbers its calls hold (answered, or waiting for an answer)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def key(self, model: str, body: dict[str, Any]) -> tuple[bytes, bytes, int, int]:
        """``(key, request text, call number, repeat)`` of the next call with `body` to `model`.

        The repeat is the lowest one of this request not held by another call: a call that
        got no answer gives its number back (:meth:`release`), so the client's retry of a
        failed call is keyed as the call it repeats, and a replay finds its answer there.
        """
        request = _canonical(
            {"model": model, "request": {k: v for k, v in body.items() if k not in _ENVELOPE}}
        )
        digest = hashlib.sha256(request).digest()
        with self._lock:
            self.calls += 1
            number = self.calls
            held = self._repeats.setdefault(digest, set())
            repeat = next(n for n in range(len(held) + 1) if n not in held)
            held.add(repeat)
        where = f"{SCHEMA_VERSION}\0{self.row}\0{self.attempt}\0{repeat}\0".encode()
        return hashlib.sha256(where + digest).digest(), request, number, repeat

    def release(self, request: bytes, repeat: int) -> None:
        """A call with no answer gives its repeat number back to the next one like it."""
        with self._lock:
            self._repeats.get(hashlib.sha256(request).digest(), set()).discard(repeat)

    async def serve(
        self,
        model: str,
        body: dict[str, Any],
        call: Callable[[], Awaitable[Any]],
        secrets: tuple[str, ...] = (),
    ) -> tuple[Any, bool]:
        """``(answer, hit)``: the recorded answer, or `call`'s (stored after it returns).

        `replay` raises :class:`CacheMiss` (or :class:`CacheCorrupt`) instead of calling, and
        remembers the first as the row's failure; `use` calls the model for a damaged entry
        and records the answer over it.
        """
        cache = self.cache
        key, request, number, repeat = self.key(model, body)
        try:
            if cache.mode != "record":
                try:
                    found = cache.lookup(key)
                except CacheCorrupt as exc:
                    if cache.replay:
                        self._failed(exc)
                        raise
                    logger.warning("%s; calling the model and recording its answer", exc)
                    found = None
                if found is not None:
                    cache.hits += 1
                    self.hits += 1
                    return found, True
                cache.misses += 1
                if cache.replay:
                    line = (
                        f"no recorded answer for row {self.source_row} run {self.attempt} call "
                        f"{number} ({model}) in {cache.path}; record it with --osmosis-cache use"
                    )
                    from pytest_osmosis.results.redact import scrub

                    if scrub(request.decode(), secrets) != request.decode():
                        line += " (a call whose request holds a secret value is never cached)"
                    miss = CacheMiss(line)
                    self._failed(miss)
                    raise miss
            started = time.perf_counter()
            response = await call()
        except BaseException:
            self.release(request, repeat)
            raise
        latency_ms = (time.perf_counter() - started) * 1000.0
        cache.store(
            _Entry(
                key,
                model,
                attempt_id(self.row, self.attempt),
                _plain(response),
                latency_ms,
                (request.decode(),),
                secrets,
            )
        )
        return response, False

    def _failed(self, exc: CacheMiss) -> None:
        if self.failure is None:
            self.failure = (exc.error_type, str(exc))


def offline_judge(model: str) -> _Target:
    """A judge model as `replay` needs it: named, never resolved (no key, no engine)."""
    return _Target(ModelRoute(model_path=model, litellm_model=model), Backoff(), judge=True)


def offline_route(model: str) -> ModelRoute:
    """The run's model as `replay` needs it: its name keys the cache; nothing is started."""
    return ModelRoute(model_path=model, litellm_model=model)


# ----------------------------------------------------------------- maintenance (the command)


def row_id(dataset: str, source_row: int) -> str:
    """How the cache names a row: its dataset and its row number there (``gsm8k#7``)."""
    return f"{dataset}#{source_row}"


def attempt_id(row: str, attempt: int) -> str:
    """How the cache names one (row, attempt): ``<dataset>#<dataset row>:<attempt>``."""
    return f"{row}:{attempt}"


def answered_attempts(path: Path, model: str, max_age_s: float | None = None) -> set[str]:
    """The (row, attempt) ids with at least one answer of `model` (a plan's expected hits)."""
    conn = _existing(path)
    if conn is None:
        return set()
    oldest = time.time() - max_age_s if max_age_s is not None else 0.0
    try:
        found = conn.execute(
            "SELECT DISTINCT attempt FROM calls WHERE model = ? AND created >= ?", (model, oldest)
        )
        return {str(attempt) for (attempt,) in found}
    except sqlite3.Error as exc:
        raise ConfigError(f"model-call cache {path}: cannot read it: {exc}") from None
    finally:
        conn.close()


def _existing(path: Path) -> sqlite3.Connection | None:
    if not path.is_file():
        return None
    try:
        return _connect(path)
    except sqlite3.Error as exc:
        raise ConfigError(f"model-call cache {path}: cannot open it: {exc}") from None


def cache_stats(path: Path) -> list[dict[str, Any]]:
    """Per model: entries, bytes of answers, tokens recorded, oldest and newest (unix time)."""
    conn = _existing(path)
    if conn is None:
        return []
    try:
        rows = conn.execute(
            "SELECT model, COUNT(*), SUM(LENGTH(response)), SUM(COALESCE(total_tokens, 0)), "
            "SUM(latency_ms), MIN(created), MAX(created) FROM calls GROUP BY model ORDER BY model"
        ).fetchall()
    except sqlite3.Error as exc:
        raise ConfigError(f"model-call cache {path}: cannot read it: {exc}") from None
    finally:
        conn.close()
    keys = ("model", "entries", "bytes", "tokens", "latency_ms", "oldest", "newest")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def remove_entries(
    path: Path, *, model: str | None = None, older_than_s: float | None = None
) -> int:
    """Delete entries (of `model`, older than `older_than_s`, or all); returns how many."""
    conn = _existing(path)
    if conn is None:
        return 0
    where: list[str] = []
    params: list[Any] = []
    if model is not None:
        where.append("model = ?")
        params.append(model)
    if older_than_s is not None:
        where.append("created < ?")
        params.append(time.time() - older_than_s)
    sql = "DELETE FROM calls" + (" WHERE " + " AND ".join(where) if where else "")
    try:
        removed = int(conn.execute(sql, params).rowcount)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        if removed:
            conn.execute("VACUUM")  # give the space back (waits for other sessions' writes)
    except sqlite3.Error as exc:
        raise ConfigError(f"model-call cache {path}: cannot remove entries: {exc}") from None
    finally:
        conn.close()
    return removed


def cache_size(path: Path) -> int:
    """Bytes the cache takes on disk: the file and its WAL."""
    total = 0
    for suffix in ("", "-wal", "-shm"):
        try:
            total += os.stat(f"{path}{suffix}").st_size
        except OSError:
            pass
    return total
