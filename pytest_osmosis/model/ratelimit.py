"""Shared back-off after a provider says 429: the whole process slows down, no row fails.

One ``Backoff`` per model route. A 429 (or a ``Retry-After``) from any call pauses every
call to that model until the provider's wait is over; the call that hit it is retried
while the rollout is still open. Rate limits are counted so the results can show them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

MIN_WAIT_S = 0.05
MAX_WAIT_S = 60.0


class Backoff:
    """A pause shared by every call to one model."""

    def __init__(self) -> None:
        self._until = 0.0
        self._streak = 0
        self.hits = 0

    async def wait(self) -> None:
        """Sleep until the shared pause is over (no-op when there is none)."""
        while (delay := self._until - time.monotonic()) > 0:
            await asyncio.sleep(delay)

    def hit(self, retry_after: float | None) -> float:
        """Record a 429 and extend the shared pause; returns the pause chosen."""
        self.hits += 1
        self._streak += 1
        if retry_after is None:
            retry_after = min(MAX_WAIT_S, 0.5 * 2 ** min(self._streak - 1, 7))
        delay = min(MAX_WAIT_S, max(MIN_WAIT_S, retry_after))
        self._until = max(self._until, time.monotonic() + delay)
        return delay

    def ok(self) -> None:
        self._streak = 0


def is_rate_limit(exc: BaseException) -> bool:
    return type(exc).__name__ == "RateLimitError" or getattr(exc, "status_code", None) == 429


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
