"""Waiting in a test for a condition, never for a fixed time: :func:`wait_until` (a thread)
and :func:`until` (a coroutine) look at ``predicate`` until it holds, and fail with ``what``
once ``timeout_s`` has passed.  The deadline bounds a test that would otherwise hang; it is
not what the test checks, so it is generous.  A test that checks time itself injects a clock
instead (see tests/actors/host/test_resume.py)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TypeVar

T = TypeVar("T")


class TimedOut(AssertionError):
    """What the test waited for did not happen in time."""


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str, *, every_s: float = 0.1) -> T:
    """``predicate()``'s first true value, looked at every ``every_s``; :class:`TimedOut`
    naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimedOut(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)  # polling, under the deadline above


async def until(
    predicate: Callable[[], T | Awaitable[T]], timeout_s: float, what: str, *, every_s: float = 0.001
) -> T:
    """:func:`wait_until` on the running event loop: other tasks run between looks;
    ``predicate`` may be a coroutine function (its answer is awaited)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        answer = predicate()
        value = await answer if inspect.isawaitable(answer) else answer
        if value:
            return value
        if loop.time() >= deadline:
            raise TimedOut(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(every_s)  # polling, under the deadline above


async def turns(n: int = 10) -> None:
    """Let the running loop turn ``n`` times with no time passing: every task ready now takes
    its next steps.  For a check that something did *not* happen: what would have happened at
    once (a call, a task's end) has happened by then."""
    for _ in range(n):
        await asyncio.sleep(0)


class MovableClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock a test moves on (:meth:`advance`), as a loop that lagged
    behind sees it: every timer due in the meantime fires at once, with no wall time passing.
    Run a coroutine on it with ``asyncio.Runner(loop_factory=MovableClockLoop)``."""

    offset_s = 0.0

    def time(self) -> float:
        return super().time() + self.offset_s

    async def advance(self, seconds: float, *, turns: int = 2) -> None:
        """Move the clock on by ``seconds``, and let the loop turn ``turns`` times: the
        timers due by then, and the callbacks they call at once, have run on return."""
        self.offset_s += seconds
        for _ in range(turns):
            await asyncio.sleep(0)


def run_with_movable_clock(main: Callable[[MovableClockLoop], Coroutine[object, object, T]]) -> T:
    """``main(loop)`` run to its end on a :class:`MovableClockLoop`."""
    with asyncio.Runner(loop_factory=MovableClockLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, MovableClockLoop)
        return runner.run(main(loop))
