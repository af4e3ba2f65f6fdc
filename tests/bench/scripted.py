"""A WebSocket channel whose answers are scripted, for the runner's chains on no network
(tests/bench/test_runner_chains.py, test_runner_responses.py)."""

from __future__ import annotations

import json
import time

from bench.client import ConnectionClosed
from bench.runner.channels import SHUTTING_DOWN, Connections, Reply, WsChannel, note_frame
from bench.runner.loop import Pace

CLOSED = "closed"  # the connection ends under the turn (1012)
SHUTTING = json.dumps(
    {"type": "error", "error": {"code": SHUTTING_DOWN, "message": "draining"}}, separators=(",", ":")
)
# A script's step: the final frame (or CLOSED), or (``response.created`` or None, that); None: the end
Step = str | tuple[str | None, str] | None


def frame(event: dict) -> str:
    return json.dumps(event, separators=(",", ":"))  # as the server writes it: the type at the head


class Scripted(WsChannel):
    """A connection answering each create with its script's next step, in order: ``None`` ends
    the run (the pace's end) instead, answered with ``last``; a step of CLOSED ends the
    connection under the turn; after ``server_shutting_down`` the server closes it with 1012."""

    def __init__(
        self,
        script: list[Step],
        sent: list[str],
        pace: Pace,
        connections: Connections,
        last: str | tuple[str | None, str],
    ) -> None:
        super().__init__("http://unused", None, connections=connections)
        self.script, self.sent, self.pace, self.last = script, sent, pace, last

    async def open(self) -> None:
        assert self.connections is not None
        self.record = self.connections.opened(0, 40000 + len(self.connections.records))

    async def send(self, body: str) -> Reply:
        assert self.record is not None
        self.sent.append(body)
        self.record.creates += 1
        step = self.script.pop(0)
        if step is None:
            self.pace.end_at = 0.0
            step = self.last
        self.created, final = step if isinstance(step, tuple) else (None, step)
        if final == CLOSED:
            self._ended(1012)
            raise ConnectionClosed(None, None)
        note_frame(self.record, final)
        return Reply(final, time.time(), 0.001, None)

    async def wait_closed(self) -> int:
        self._ended(1012)
        return 1012

    async def close(self) -> None:
        self._ended(None)
