"""Shared pacing after a provider says 429: the whole process slows down, no row fails.

One ``Backoff`` per model route (the run's model, each judge model). Until the provider
first answers 429 nothing is held back. From then on:

- **Paced releases.** Calls to that model leave one *interval* apart, in arrival order,
  never all at once when a pause ends; a ``Retry-After`` holds every call until it is
  over. The interval is learned: a 429 to a call sent at the current pace slows the pace
  (much at first, while no call at that pace has succeeded, then by a little), each call
  that succeeds at the current pace speeds it up (quickly back to within a fifth of the pace
  that last met a 429, then by a little), so the pace settles just under what the
  provider accepts. A 429 to a call sent before the last slow-down says
  nothing new and changes nothing (Inspect AI's cooldown, by call instead of by clock).
  The pace is never slower than twice the longest ``Retry-After`` seen, so a provider
  that refuses everything for a while cannot stretch it for ever.
- **An adaptive in-flight count.** Calls at the provider at once are capped from the
  first 429 on, at what was in flight then (the pace alone keeps a fast provider busy);
  a call that succeeds while the cap is full raises it by one, a fresh 429 while it is
  full cuts it by a fifth: the provider, not the rows' concurrency, decides how many
  calls it holds.
- **Retries owned here.** The provider client's own retries are turned off
  (``max_retries=0``, `Backoff.call`), so every 429 passes through the pacing and is
  counted; a 429 is retried while the caller says the row is still open (its own budget
  ends it), and transient failures (a timeout, a dropped connection, 408, 409, 5xx) are
  retried twice, as the OpenAI client would have.

Only upstream model calls wait here; rows keep running their own code meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

MIN_WAIT_S = 0.05
MAX_WAIT_S = 60.0
TRANSIENT_RETRIES = 2
"""Retries of a timeout, dropped connection, 408, 409 or 5xx (the OpenAI client's default)."""
_FIRST_SLOWDOWN = 1.5
"""Interval factor for a 429 before any call at the current pace succeeded (searching down)."""
_SLOWDOWN = 1.1
"""Interval factor for a 429 once the pace was known to work (probing the limit)."""
_SPEEDUP = 0.998
"""Interval factor per call that succeeded at the current pace (about 4 %/s at 20 calls/s)."""
_CATCH_UP = 0.98
"""The same while the pace is more than 20 % slower than the one that last met a 429."""
_MIN_INTERVAL_S = 0.001
"""Below this the pace holds nothing back: it is dropped until the next 429."""
_TRANSIENT = frozenset(
    {
        "APIConnectionError",
        "APITimeoutError",
        "Timeout",
        "InternalServerError",
        "ServiceUnavailableError",
        "BadGatewayError",
    }
)

T = TypeVar("T")
logger = logging.getLogger(__name__)


class Backoff:
    """The pace and in-flight cap shared by every call to one model (see the module doc)."""

    def __init__(self) -> None:
        self.hits = 0
        """429s the provider answered (every one, whether or not it changed the pace)."""
        self.interval = 0.0
        """Seconds between two releases; 0 until the first 429."""
        self.cap: int | None = None
        """Calls at the provider at once; None (the rows' concurrency) until the first 429."""
        self.in_flight = 0
        self._until = 0.0
        self._next = 0.0
        self._epoch = 0
        self._paced_ok = False
        self._streak = 0
        self._slowest = 0.0
        self._refused = 0.0
        self._sent: deque[float] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gate: asyncio.Lock | None = None
        self._freed: asyncio.Event | None = None

    # ---------------------------------------------------------------- one call

    async def call(
        self,
        send: Callable[[], Awaitable[T]],
        *,
        retry_rate_limit: Callable[[], bool],
        on_rate_limit: Callable[[], None] = lambda: None,
    ) -> T:
        """``await send()`` when the pace allows, retrying 429s while `retry_rate_limit()`."""
        transient = 0
        while True:
            epoch = await self.acquire()
            try:
                result = await send()
            except Exception as exc:
                self.release()
                if is_rate_limit(exc):
                    self.hit(retry_after(exc), epoch)
                    on_rate_limit()
                    if retry_rate_limit():
                        continue
                elif is_transient(exc) and transient < TRANSIENT_RETRIES:
                    await asyncio.sleep(0.5 * 2**transient)
                    transient += 1
                    continue
                raise
            except BaseException:
                self.release()
                raise
            self.release()
            self.ok(epoch)
            return result

    async def acquire(self) -> int:
        """Wait for this call's turn; returns the pace's epoch it leaves under."""
        gate, freed = self._primitives()
        async with gate:  # FIFO: calls leave in the order they asked
            while True:
                now = time.monotonic()
                due = max(self._until, self._next)
                if due > now:
                    await asyncio.sleep(due - now)
                    continue  # a 429 meanwhile may have moved `due`
                if self.cap is not None and self.in_flight >= self.cap:
                    freed.clear()
                    await freed.wait()
                    continue
                break
            self._next = now + self.interval if self.interval else 0.0
            self.in_flight += 1
            if self.cap is None:  # before the first 429: how fast calls go (see `hit`)
                self._sent.append(now)
                while self._sent[0] < now - 1.0:
                    self._sent.popleft()
            return self._epoch

    def release(self) -> None:
        """A call acquired with `acquire` is back from the provider."""
        self.in_flight -= 1
        if self._freed is not None:
            self._freed.set()

    # ---------------------------------------------------------------- learning

    def hit(self, retry_after: float | None, epoch: int | None = None) -> float:
        """Record a 429 to a call sent under `epoch`; returns the pause it imposes."""
        self.hits += 1
        self._streak += 1
        if retry_after is None:
            retry_after = min(MAX_WAIT_S, 0.5 * 2 ** min(self._streak - 1, 7))
        delay = min(MAX_WAIT_S, max(MIN_WAIT_S, retry_after))
        now = time.monotonic()
        self._until = max(self._until, now + delay)
        # Never pace slower than twice the longest wait the provider asked for: a provider
        # that refuses everything for a while (not a rate) must not stretch the pace for
        # ever, and a token bucket's wait is one interval at most.
        self._slowest = max(self._slowest, 2 * delay)
        if epoch is not None and epoch != self._epoch:
            return delay  # sent before the last slow-down: already accounted for
        self._epoch += 1
        if not self.interval:
            # The first 429: pace at the rate calls were sent over the last second, then
            # search down from there.
            recent = sum(1 for t in self._sent if t > now - 1.0)
            self.interval = min(self._slowest, 1.0 / max(1, recent))
            self._refused = self.interval
            self.cap = max(1, self.in_flight + 1)
            self._sent.clear()
        else:
            self._refused = self.interval
            factor = _SLOWDOWN if self._paced_ok else _FIRST_SLOWDOWN
            self.interval = min(self._slowest, self.interval * factor)
            if self.cap is not None and self.in_flight + 1 >= self.cap:
                self.cap = max(1, int(self.cap * 0.8))
        self._paced_ok = False
        logger.debug(
            "rate limited: pacing one call every %.1f ms, at most %s at the provider",
            self.interval * 1000,
            self.cap,
        )
        return delay

    def ok(self, epoch: int | None = None) -> None:
        """Record a call that succeeded (sent under `epoch`)."""
        self._streak = 0
        if epoch is not None and epoch != self._epoch:
            return
        if self.interval:
            self._paced_ok = True
            # Back quickly to just above the pace that last met a 429, then probe slowly.
            self.interval *= _CATCH_UP if self.interval > 1.2 * self._refused else _SPEEDUP
            if self.interval < _MIN_INTERVAL_S:
                self.interval = 0.0
        if self.cap is not None and self.in_flight + 1 >= self.cap:
            self.cap += 1

    # ---------------------------------------------------------------- plumbing

    def _primitives(self) -> tuple[asyncio.Lock, asyncio.Event]:
        """The FIFO gate of the running loop (a new loop, e.g. a test's, gets its own)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._gate is None or self._freed is None:
            self._loop, self._gate, self._freed = loop, asyncio.Lock(), asyncio.Event()
        return self._gate, self._freed


def is_rate_limit(exc: BaseException) -> bool:
    return type(exc).__name__ == "RateLimitError" or getattr(exc, "status_code", None) == 429


def is_transient(exc: BaseException) -> bool:
    """A failure the provider's own client would have retried (timeouts, 408, 409, 5xx)."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and (status in (408, 409) or status >= 500):
        return True
    return type(exc).__name__ in _TRANSIENT


def retry_after(exc: BaseException) -> float | None:
    """Seconds from a ``Retry-After`` header on the provider's answer, if it sent one."""
    for source in (getattr(exc, "response", None), exc):
        headers: Any = getattr(source, "headers", None) or getattr(
            source, "litellm_response_headers", None
        )
        if headers is None:
            continue
        try:
            value = headers.get("retry-after") or headers.get("Retry-After")
        except AttributeError:
            continue
        if value is None:
            continue
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    return None
