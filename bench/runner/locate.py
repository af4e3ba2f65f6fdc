"""Where each connection went, from outside the connection: a lookup (the balancer's runtime
API, bench/multinode/balancer.py) that maps the local ports of the connections it knows to
the server serving each.  It blocks (it runs in a thread) and may be slow, so one reading at
a time serves every connection waiting; a connection is found only in a reading begun after
it opened (a port is reused once its connection ended), looked up again every
:data:`EVERY_S` for at most :data:`TIMEOUT_S` (then it stays unknown).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

TIMEOUT_S = 5.0
EVERY_S = 0.1


class Locator:
    def __init__(
        self,
        servers: Callable[[], dict[int, str]],
        *,
        timeout_s: float = TIMEOUT_S,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.servers = servers
        self.timeout_s, self.every_s, self.clock = timeout_s, every_s, clock
        self.seen: dict[int, str] = {}
        self.read_began = float("-inf")  # when the reading ``seen`` came from began
        self.failures = 0  # readings that raised (counted; the lookup goes on)
        self._reading: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        began = self.clock()
        try:
            self.seen = await asyncio.to_thread(self.servers)
        except Exception:  # noqa: BLE001 - an unreadable view is no answer: counted, read again
            self.failures += 1
            return
        self.read_began = began

    async def find(self, port: int) -> str | None:
        """The server of the connection from local ``port`` (opened just now), or None."""
        opened = self.clock()
        deadline = opened + self.timeout_s
        while True:
            if self._reading is None or self._reading.done():
                self._reading = asyncio.create_task(self._read())
            await asyncio.shield(self._reading)
            fresh = self.read_began >= opened
            if fresh and (server := self.seen.get(port)) is not None:
                return server
            if self.clock() >= deadline:
                return None
            await asyncio.sleep(self.every_s)
