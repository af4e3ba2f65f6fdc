"""The ``resume`` workload: each loop one session resumed across dropped connections
(:class:`~bench.runner.model.Resume`), every turn recorded with the time to its first event and,
after a resume, the reconnect's handshake (``connect_ms``); each connection's
:class:`~bench.runner.model.ConnectionRecord` says where it went (the spec's ``locate``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from ..client import frame_type
from .channels import Channel, WsChannel
from .connecting import ConnectLog, open_with_retry
from .loop import Pace, parse_reply
from .model import TurnRecord
from .workloads import Resume


class ResumeLoop:
    """One session's turns and resumes.  The same surface as :class:`~bench.runner.loop.Loop`
    for the worker: ``open``, ``run``, ``channel``, ``in_turn``, ``errors``."""

    def __init__(
        self,
        index: int,
        target: str,
        resume: Resume,
        pace: Pace,
        sink: list[TurnRecord],
        new_channel: Callable[[dict[str, str] | None], WsChannel],
        connects: ConnectLog,
    ) -> None:
        self.index, self.target, self.resume = index, target, resume
        self.pace, self.sink, self.new_channel, self.connects = pace, sink, new_channel, connects
        self.channel: Channel = Channel()  # none open yet
        self.in_turn = False
        self.errors: list[str] = []

    async def open(self) -> None:
        """Nothing to open before the release: the loop opens its session's first connection."""

    def body(self, turn: int, previous: str | None) -> str:
        r = self.resume
        text = (
            r.first_input.replace("{loop}", str(self.index)) if turn == 0 else r.next_input.format(turn=turn)
        )
        out: dict[str, Any] = {"type": "response.create", "model": r.model, "store": False, "input": text}
        if r.text_tokens is not None:
            out["metadata"] = {"emulator.tool_rounds": "0", "emulator.text_tokens": str(r.text_tokens)}
        if previous is not None:
            out["previous_response_id"] = previous
        return json.dumps(out)

    async def turn(self, channel: WsChannel, body: str, kind: str, connect_ms: float | None = None) -> str:
        """One create on ``channel``, recorded; its response's id (RuntimeError if it did not complete)."""
        assert channel.record is not None
        self.in_turn = True
        try:
            reply = await channel.send(body)
        finally:
            self.in_turn = False
        response, ok, code = parse_reply(reply)
        usage = (response or {}).get("usage") or {}
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
        self.sink.append(
            TurnRecord(
                self.index,
                kind,
                reply.sent,
                reply.total_s * 1000,
                None,
                ok,
                target=self.target,
                ttft_ms=None if reply.ttft_s is None else reply.ttft_s * 1000,
                error_code=code,
                connect_ms=connect_ms,
                output_tokens=usage.get("output_tokens"),
                connection=channel.record.index,
                cached_tokens=None if cached is None else int(cached),
                response_id=(response or {}).get("id"),
                store=False,
                terminal=None if response is None else frame_type(reply.raw),
                input_tokens=usage.get("input_tokens"),
                first_event_ms=None if reply.first_s is None else reply.first_s * 1000,
            )
        )
        if not ok or response is None:
            raise RuntimeError(f"turn failed: {reply.raw[:300]}")
        return str(response["id"])

    def stopped(self) -> bool:
        return time.time() >= self.pace.end_at

    async def run(self, release_at: float) -> None:
        """The session from ``release_at``: its first turn, then its steady turns and resumes."""
        r = self.resume
        await asyncio.sleep(max(0.0, release_at - time.time()))
        try:
            channel = self.new_channel(None)
            self.channel = channel
            await open_with_retry(channel.open, self.connects.failures, attempts=self.connects.attempts)
            token = channel.upgrade_header(r.header)
            if token is None:
                raise RuntimeError(f"the upgrade's answer has no {r.header}: resume is off on the server")
            previous = await self.turn(channel, self.body(0, None), "first")
        finally:
            self.pace.first_done()
        turn = 1
        for k in range(r.resumes + 1):
            for _ in range(r.steady):
                if self.stopped():
                    return
                previous = await self.turn(channel, self.body(turn, previous), "steady")
                turn += 1
            if k == r.resumes or self.stopped():
                break
            channel.abort()
            await asyncio.sleep(r.pause_s)
            channel = self.new_channel({r.header: token})
            self.channel = channel
            await channel.open()  # then, with the spec's locate, where it went (not timed)
            previous = await self.turn(channel, self.body(turn, previous), "resume", channel.open_ms)
            turn += 1
        await channel.close()
