"""The shared pacing after a 429 (model/ratelimit.py), decided without a clock.

The end-to-end claim (a rate-limited provider gets at most 1.2 requests a row, every 429
counted) is tests/test_concurrency.py::test_a_rate_limited_provider_is_paced_not_hammered;
these pin the rules that make it so.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pytest_osmosis.model.ratelimit import Backoff, is_transient


class _RateLimited(Exception):
    status_code = 429

    def __init__(self, retry_after: float) -> None:
        super().__init__("rate limited")
        self.response = type("Response", (), {"headers": {"retry-after": str(retry_after)}})()


def test_nothing_is_held_back_before_the_first_429() -> None:
    backoff = Backoff()

    async def go() -> list[int]:
        return [await backoff.acquire() for _ in range(100)]

    assert asyncio.run(go()) == [0] * 100
    assert (backoff.interval, backoff.cap, backoff.in_flight) == (0.0, None, 100)


def test_the_first_429_paces_at_the_rate_calls_went_and_caps_what_was_in_flight() -> None:
    backoff = Backoff()

    async def go() -> int:
        for _ in range(40):
            await backoff.acquire()
        backoff.release()
        return await backoff.acquire()

    epoch = asyncio.run(go())
    backoff.release()
    backoff.hit(0.05, epoch)
    # 41 calls went within the last second: one every 1/41 s from now on, and no more at
    # the provider at once than the 40 there were when the refused one went.
    assert backoff.interval == pytest.approx(1 / 41)
    assert backoff.cap == 40


def test_a_429_to_a_call_sent_before_the_last_slow_down_changes_nothing() -> None:
    backoff = Backoff()
    backoff.hit(1.0, 0)
    interval, cap = backoff.interval, backoff.cap
    for _ in range(10):  # calls sent under the old pace, refused after it changed
        backoff.hit(1.0, 0)
    assert (backoff.interval, backoff.cap, backoff.hits) == (interval, cap, 11)
    backoff.ok(0)  # an old call's success does not speed the new pace up either
    assert backoff.interval == interval


def test_the_pace_slows_on_fresh_429s_speeds_up_on_successes_and_has_a_floor() -> None:
    backoff = Backoff()
    backoff.hit(1.0, 0)
    first = backoff.interval
    backoff.hit(1.0, 1)
    assert backoff.interval == pytest.approx(first * 1.5)  # nothing at this pace worked yet
    backoff.ok(2)
    slower = backoff.interval
    backoff.hit(1.0, 2)
    assert backoff.interval == pytest.approx(slower * 1.1)  # it did: probe gently
    before = backoff.interval
    backoff.ok(3)
    assert backoff.interval < before


def test_a_provider_refusing_everything_cannot_stretch_the_pace_past_its_retry_after() -> None:
    backoff = Backoff()
    for epoch in range(60):  # sixty 429s in a row, each to a call sent at the newest pace
        backoff.hit(0.05, epoch)
    assert backoff.interval <= 2 * 0.05


def test_waiting_calls_leave_in_order_and_a_retry_is_counted() -> None:
    backoff = Backoff()
    answers: list[Any] = [_RateLimited(0), "first", "second"]
    counted: list[int] = []

    async def send() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def go() -> list[Any]:
        return list(
            await asyncio.gather(
                *(
                    backoff.call(
                        send, retry_rate_limit=lambda: True, on_rate_limit=lambda: counted.append(1)
                    )
                    for _ in range(2)
                )
            )
        )

    assert sorted(asyncio.run(go())) == ["first", "second"]
    assert counted == [1] and backoff.hits == 1 and backoff.in_flight == 0


def test_a_429_is_raised_once_the_row_is_closed() -> None:
    backoff = Backoff()

    async def send() -> Any:
        raise _RateLimited(0)

    with pytest.raises(_RateLimited):
        asyncio.run(backoff.call(send, retry_rate_limit=lambda: False))
    assert backoff.in_flight == 0


@pytest.mark.parametrize(
    ("status", "transient"), [(500, True), (503, True), (408, True), (409, True), (400, False)]
)
def test_what_the_provider_client_would_have_retried(status: int, transient: bool) -> None:
    error = type("ProviderError", (Exception,), {"status_code": status})()
    assert is_transient(error) is transient
