"""The load runner's connection open: a bounded retry of what a later attempt can change, every
failed attempt counted by type and shown in the summary's failures."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest

from bench.runner import LoadResult
from bench.runner.connecting import (
    ATTEMPTS,
    BACKOFF_S,
    RETRY_AFTER_CAP_S,
    failure,
    open_with_retry,
    retry_delay,
)

pytestmark = pytest.mark.unit


def refused(status: int, retry_after: str | None = None) -> Exception:
    """An exception shaped as websockets' ``InvalidStatus`` (its ``response``)."""
    exc = Exception(f"server rejected WebSocket connection: HTTP {status}")
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    exc.response = SimpleNamespace(status_code=status, headers=headers)  # type: ignore[attr-defined]
    return exc


def test_a_failed_open_is_typed_by_its_status_or_its_exception():
    assert failure(refused(503, "1")) == ("http_503", 1.0)
    assert failure(refused(401)) == ("http_401", None)
    assert failure(refused(503, "soon")) == ("http_503", None)
    assert failure(ConnectionRefusedError(111, "refused")) == ("ConnectionRefusedError", None)
    assert failure(TimeoutError()) == ("TimeoutError", None)


@pytest.mark.parametrize(
    ("kind", "attempt", "after", "delay"),
    [
        ("http_503", 1, None, BACKOFF_S[0]),
        ("http_503", 2, 0.1, 0.1),  # the server's Retry-After
        ("http_503", 1, 30.0, RETRY_AFTER_CAP_S),  # capped
        ("ConnectionRefusedError", 3, None, BACKOFF_S[2]),
        ("TimeoutError", 1, None, BACKOFF_S[0]),
        ("http_503", ATTEMPTS, None, None),  # the attempts are spent
        ("http_401", 1, None, None),  # a bad key: another attempt changes nothing
        ("http_404", 1, None, None),
        ("ValueError", 1, None, None),
    ],
)
def test_what_is_retried_and_after_how_long(kind, attempt, after, delay):
    assert retry_delay(kind, attempt, after) == delay


def test_fewer_attempts_when_asked_and_one_means_no_retry():
    assert retry_delay("http_503", 1, None, attempts=1) is None
    assert retry_delay("http_503", 1, None, attempts=2) == BACKOFF_S[0]
    assert retry_delay("http_503", 2, None, attempts=2) is None


def run_opens(outcomes: list[Exception | None], attempts: int = ATTEMPTS) -> tuple[Counter[str], list[float]]:
    failures: Counter[str] = Counter()
    slept: list[float] = []

    async def open_once() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    async def sleep(s: float) -> None:
        slept.append(s)

    async def main() -> None:
        await open_with_retry(open_once, failures, attempts=attempts, sleep=sleep)

    asyncio.run(main())
    return failures, slept


def test_an_open_refused_by_a_stopping_gateway_is_retried_and_counted():
    failures, slept = run_opens([refused(503, "1"), ConnectionRefusedError(), None])
    assert failures == {"connect:http_503": 1, "connect:ConnectionRefusedError": 1}
    assert slept == [1.0, BACKOFF_S[1]]


def test_a_bad_key_is_not_retried_and_the_failure_is_raised():
    with pytest.raises(Exception, match="HTTP 401"):
        run_opens([refused(401), None])


def test_the_retries_are_bounded_and_every_attempt_counted():
    outcomes: list[Exception | None] = [refused(503) for _ in range(10)]
    with pytest.raises(Exception, match="HTTP 503"):
        run_opens(outcomes)
    assert len(outcomes) == 10 - ATTEMPTS


def test_connect_failures_show_in_the_summary_beside_the_failed_turns():
    result = LoadResult([], [], window=(0.0, 1.0), loops=2, connected=2)
    result.connect_failures = {"connect:http_503": 2}
    assert result.summary()["failures"] == {"connect:http_503": 2}
