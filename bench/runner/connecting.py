"""A loop's connection open, retried a bounded number of times, every failed attempt counted
by type (never hidden: the step's ``failures`` show them as ``connect:<type>``).

A failure is retried when a later attempt can succeed: the server refused for now (HTTP 503
``server_shutting_down`` from a stopping gateway, whose port's other listeners take the retry;
429, 502, 504), the connection was refused or reset (a listener changing hands), or the open
timed out.  A refusal that another attempt cannot change (401, 403, 404, 400: a bad key or
URL) is not retried.  The wait before attempt ``n`` (from 1) is :data:`BACKOFF_S` ``[n-1]``,
or the server's ``Retry-After`` when it gave one, at most :data:`RETRY_AFTER_CAP_S`.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

PREFIX = "connect:"
BACKOFF_S = (0.25, 0.5, 1.0, 2.0)  # before the 2nd, 3rd, ... attempt
ATTEMPTS = len(BACKOFF_S) + 1  # at most, in all
RETRY_AFTER_CAP_S = 2.0
RETRIED_STATUS = frozenset({429, 502, 503, 504})
RETRIED_ERRORS = frozenset(
    {"ConnectionRefusedError", "ConnectionResetError", "ConnectionAbortedError", "TimeoutError",
     "ConnectionClosedError", "InvalidMessage", "EOFError"}
)  # fmt: skip


def failure(exc: BaseException) -> tuple[str, float | None]:
    """A failed open's type (``http_503``, ``ConnectionRefusedError``, ...) and the server's
    ``Retry-After`` seconds when it gave one."""
    response = getattr(exc, "response", None)  # websockets' InvalidStatus: the refusal's response
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        after = None
        raw = (getattr(response, "headers", None) or {}).get("Retry-After")
        try:
            after = float(raw) if raw is not None else None
        except ValueError:
            after = None
        return f"http_{status}", after
    return type(exc).__name__, None


TYPED_CODES = frozenset({"server_shutting_down", "server_overloaded"})  # a 503's codes that ask for a retry


def typed_refusal(exc: BaseException) -> bool | None:
    """Whether a refused upgrade asked for a retry as docs/reliability.md says (a 503 with
    ``Retry-After`` and an OpenAI error body whose code is one of :data:`TYPED_CODES`); None
    when ``exc`` is no HTTP refusal (reset, refused port, timeout)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if not isinstance(status, int):
        return None
    try:
        code = json.loads(getattr(response, "body", None) or b"{}")["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    headers = getattr(response, "headers", None) or {}
    return status == 503 and "Retry-After" in headers and code in TYPED_CODES


def retry_delay(kind: str, attempt: int, retry_after: float | None, attempts: int = ATTEMPTS) -> float | None:
    """How long to wait before the attempt after failed attempt ``attempt`` (from 1) of type
    ``kind``, of at most ``attempts`` (at most :data:`ATTEMPTS`); ``None``: give up (not
    retryable, or the attempts are spent)."""
    if attempt >= min(attempts, ATTEMPTS):
        return None
    status = int(kind[5:]) if kind.startswith("http_") and kind[5:].isdigit() else None
    if status is not None and status not in RETRIED_STATUS:
        return None
    if status is None and kind not in RETRIED_ERRORS:
        return None
    if retry_after is not None:
        return max(0.0, min(retry_after, RETRY_AFTER_CAP_S))
    return BACKOFF_S[attempt - 1]


async def open_with_retry(
    open_once: Callable[[], Awaitable[None]],
    failures: Counter[str],
    *,
    attempts: int = ATTEMPTS,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """``open_once()`` until it succeeds, at most ``attempts`` times (1: no retry); each
    failure counted in ``failures`` as ``connect:<type>``; the last failure raised when no
    more attempts are due."""
    attempt = 0
    while True:
        attempt += 1
        try:
            await open_once()
            return
        except Exception as exc:
            kind, after = failure(exc)
            failures[PREFIX + kind] += 1
            delay = retry_delay(kind, attempt, after, attempts)
            if delay is None:
                raise
        await sleep(delay)


@dataclass
class ConnectLog:
    """A client process's opens: at most ``attempts`` each, the failed attempts by type and
    every successful open as (when it began, time.time(); how long it took, ms); the chains
    count the refusals that were not typed (``untyped``, by type)."""

    attempts: int = ATTEMPTS
    failures: Counter[str] = field(default_factory=Counter)
    opened: list[tuple[float, float]] = field(default_factory=list)
    untyped: Counter[str] = field(default_factory=Counter)  # HTTP refusals not typed (typed_refusal)

    def refused(self, exc: BaseException) -> None:
        """Count a failed open that was an HTTP refusal without a typed ask to retry."""
        if typed_refusal(exc) is False:
            self.untyped[PREFIX + failure(exc)[0]] += 1
