"""The ``resume`` workload: each loop one session resumed across dropped connections
(:class:`~bench.runner.workloads.Resume`), every turn recorded with the time to its first event
and, after a resume, the reconnect's handshake (``connect_ms``); each connection's
:class:`~bench.runner.model.ConnectionRecord` says where it went (the spec's ``locate``).

With ``Resume.steps`` a loop only opens its session; the driver steps it (:meth:`ResumeLoop.step`,
:meth:`ResumeLoop.resume_on`, :meth:`ResumeLoop.go`, :meth:`ResumeLoop.halt`) through its
worker, every loop of the run at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..client import frame_type
from .channels import Channel, WsChannel
from .connecting import ConnectLog, open_with_retry
from .loop import Pace
from .model import TurnRecord
from .replies import answered, parse_reply, usage_fields
from .workloads import Resume

# a resume step's target for a connection whose server is not known (Mapping key)
UNKNOWN = None


class ResumeLoop:
    """One session's turns and resumes.  The same surface as :class:`~bench.runner.loop.Loop`
    for the worker: ``open``, ``run``, ``channel``, ``in_turn``, ``errors``.  ``new_channel``
    makes a connection to a target URL with the upgrade's headers (the resume token)."""

    def __init__(
        self,
        index: int,
        target: str,
        resume: Resume,
        pace: Pace,
        sink: list[TurnRecord],
        new_channel: Callable[[str, dict[str, str] | None], WsChannel],
        connects: ConnectLog,
    ) -> None:
        self.index, self.target, self.resume = index, target, resume
        self.pace, self.sink, self.new_channel, self.connects = pace, sink, new_channel, connects
        self.channel: Channel = Channel()  # none open yet
        self.ws: WsChannel | None = None  # the session's connection now
        self.in_turn = False
        self.errors: list[str] = []
        self.token: str | None = None
        self.previous: str | None = None  # the chain's last response
        self.turns = 0  # creates sent
        self.completed = 0  # turns completed
        self._free: asyncio.Task[None] | None = None
        self._halt = asyncio.Event()

    async def open(self) -> None:
        """Nothing to open before the release: the loop opens its session's first connection."""

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    def body(self, turn: int, previous: str | None) -> str:
        r = self.resume
        text = (
            r.first_input.replace("{loop}", str(self.index))
            if turn == 0
            else r.next_input.replace("{turn}", str(turn)).replace("{loop}", str(self.index))
        )
        out: dict[str, Any] = {"type": "response.create", "model": r.model, "store": False, "input": text}
        if r.text_tokens is not None:
            out["metadata"] = {"emulator.tool_rounds": "0", "emulator.text_tokens": str(r.text_tokens)}
        if r.seeded:
            out.setdefault("metadata", {})["emulator.seed"] = str(self.index)
        if previous is not None:
            out["previous_response_id"] = previous
        return json.dumps(out)

    async def turn(self, channel: WsChannel, body: str, kind: str, connect_ms: float | None = None) -> str:
        """One create on ``channel``, recorded; its response's id (RuntimeError if it did not
        complete, or ``Resume.inspect`` failed on it)."""
        assert channel.record is not None
        self.in_turn = True
        try:
            reply = await channel.send(body)
        finally:
            self.in_turn = False
        response, ok, code = parse_reply(reply)
        note, failure = None, None
        inspect = self.resume.inspect
        if ok and response is not None and inspect is not None and self.token is not None:
            try:
                note = await asyncio.to_thread(inspect, self.token, str(response["id"]))
            except Exception as exc:  # noqa: BLE001 - the turn fails with it
                ok, code, failure = False, "inspect", f"inspect: {type(exc).__name__}: {exc}"
        self.sink.append(
            answered(
                self.index,
                kind,
                reply,
                ok,
                self.target,
                code,
                connect_ms=connect_ms,
                connection=channel.record.index,
                response_id=(response or {}).get("id"),
                store=False,
                terminal=None if response is None else frame_type(reply.raw),
                note=note,
                **usage_fields(response),
            )
        )
        if not ok or response is None:
            raise RuntimeError(failure or f"turn failed: {reply.raw[:300]}")
        return str(response["id"])

    def stopped(self) -> bool:
        return time.time() >= self.pace.end_at

    async def open_session(self) -> None:
        """The session's first connection, at the loop's target; its resume token kept."""
        r = self.resume
        channel = self.new_channel(self.target, None)
        self.channel = self.ws = channel
        await open_with_retry(channel.open, self.connects.failures, attempts=self.connects.attempts)
        self.token = channel.upgrade_header(r.header)
        if self.token is None:
            raise RuntimeError(f"the upgrade's answer has no {r.header}: resume is off on the server")

    async def next_turn(self, kind: str | None = None, connect_ms: float | None = None) -> None:
        """The chain's next create on the session's connection (``first`` for its first)."""
        assert self.ws is not None, "open_session() first"
        kind = kind or ("first" if self.turns == 0 else "steady")
        body = self.body(self.turns, self.previous)
        self.turns += 1
        self.previous = await self.turn(self.ws, body, kind, connect_ms)
        self.completed += 1

    async def resume_on(self, target: str) -> None:
        """Drop the connection (a TCP abort, no close frame: a lost network), open a new one
        at ``target`` with the session's token ``pause_s`` later, and send the next turn on
        it (kind ``resume``, its ``connect_ms`` the reconnect's handshake)."""
        assert self.ws is not None and self.token is not None, "open_session() first"
        r = self.resume
        self.ws.abort()
        await asyncio.sleep(r.pause_s)
        channel = self.new_channel(target, {r.header: self.token})
        self.channel = self.ws = channel
        await channel.open()  # then, with the spec's locate, where it went (not timed)
        await self.next_turn("resume", channel.open_ms)

    async def run(self, release_at: float) -> None:
        """The session from ``release_at``: its first turn, then its steady turns and resumes
        (with ``Resume.steps``: its connection only, the driver steps it)."""
        r = self.resume
        await asyncio.sleep(max(0.0, release_at - time.time()))
        try:
            await self.open_session()
            if not r.steps:
                await self.next_turn("first")
        finally:
            self.pace.first_done()
        if r.steps:
            return
        for k in range(r.resumes + 1):
            for _ in range(r.steady):
                if self.stopped():
                    return
                await self.next_turn("steady")
            if k == r.resumes or self.stopped():
                break
            await self.resume_on(self.target)
        await self.channel.close()

    # ---- the driver's steps (Resume.steps): a failure ends the session's steps, in ``errors``

    async def step(self, action: Callable[[], Any]) -> bool:
        """``action`` unless the session failed before; whether the session is still well."""
        if self.failed or self.ws is None:
            return False
        try:
            await action()
        except Exception as exc:  # noqa: BLE001 - the session's error; the others go on
            self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            return False
        return True

    async def resume_by_server(self, targets: Mapping[str | None, str]) -> bool:
        """Resume at ``targets[the server its connection went to]`` (``targets[None]`` when
        that is not known)."""

        async def action() -> None:
            assert self.ws is not None
            record = await self.ws.located()
            server = None if record is None else record.server
            await self.resume_on(targets.get(server, targets[UNKNOWN]))

        return await self.step(action)

    def go(self, think_s: float) -> None:
        """Turns one after another, ``think_s`` apart, until :meth:`halt` (or the run's end)."""
        self._halt.clear()

        async def free() -> None:
            while not self._halt.is_set() and not self.stopped():
                if not await self.step(self.next_turn):
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._halt.wait(), think_s)

        if not self.failed:
            self._free = asyncio.create_task(free())

    async def halt(self) -> None:
        """Stop :meth:`go`'s turns (a turn in flight completes)."""
        self._halt.set()
        if self._free is not None:
            await asyncio.gather(self._free, return_exceptions=True)
            self._free = None
