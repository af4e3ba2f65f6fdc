"""Where a connection tokenises a large input (a :class:`~actors.core.turn.Render` effect),
and the count of this process's work in flight that decides it."""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import Executor, ThreadPoolExecutor

from ..core.render import MarkedTokens, render_marked
from ..core.turn import RENDER_SITE, Render, RenderSite

log = logging.getLogger(__name__)


class RenderPool:
    """Where this process's connections tokenise their large inputs (:attr:`site`, as
    :data:`~actors.core.turn.RENDER_SITE` says: tiktoken is slower off the main thread,
    docs/performance.md), and the worker threads for it: one per core, at most four, made on
    first use.  One per process."""

    def __init__(self, executor: Executor | None = None) -> None:
        self._executor = executor
        self.in_flight = 0  # model calls and renders of this process's connections
        self.streaming = 0  # of those model calls, the ones whose output has begun and not ended

    @property
    def site(self) -> RenderSite:
        """Where a render starting now runs."""
        return RENDER_SITE[self.in_flight > 0]

    async def render(self, job: Render) -> MarkedTokens | None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="render")
        return await asyncio.get_running_loop().run_in_executor(self._executor, tokens_of, job)

    def track(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        """Count ``task`` as work in flight from now until it is done (or cancelled, even
        before it ran)."""
        self.in_flight += 1
        task.add_done_callback(self._done)
        return task

    def _done(self, _: object) -> None:
        self.in_flight -= 1


def tokens_of(job: Render) -> MarkedTokens | None:
    """A job's input rendered (its token ids and breakpoints); ``None`` (logged) if a bug
    the input hit raised."""
    try:
        return render_marked(job.items, job.fmt)
    except Exception:
        log.exception("rendering an input failed")
        return None


RENDER_POOL = RenderPool()
