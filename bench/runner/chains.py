"""The ``chains`` workload: a client of a server that may lose its nodes (bench/multinode's
fault load).  Each loop runs ``store:false`` chains (every turn sends only its new input and
``previous_response_id``), one connection a chain; a connection the server or the network
ended is recorded (its :class:`~bench.runner.model.ConnectionRecord`: the close code, 1006
without a close frame) and replaced after ``reconnect_s``, as a client that lost its
connection must (``store:false`` ids die with their connection).

With ``resend_history`` the loop is Codex: one conversation across its connections, each turn
resending all of it with a ``prompt_cache_key``, a turn that got no ``response.completed``
sent again on the next connection; after ``server_shutting_down`` it waits for the server's
close.  What it resends is encoded once (each item as it joins the conversation).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from ..client import ConnectionClosed, output_text
from .channels import SHUTTING_DOWN, Channel, WsChannel
from .connecting import ConnectLog, open_with_retry
from .loop import Pace, parse_reply
from .model import Chains, TurnRecord

# Codex's instructions: a prefix of >1024 tokens, so a resumed conversation's turns can be cached
PREFIX = " ".join(["the quick brown fox jumps over a lazy dog"] * 150)


class ChainLoop:
    """One client's chains until the pace's end.  The same surface as
    :class:`~bench.runner.loop.Loop` for the worker: ``run``, ``channel``, ``in_turn``, ``errors``."""

    def __init__(
        self,
        index: int,
        target: str,
        chains: Chains,
        pace: Pace,
        sink: list[TurnRecord],
        new_channel: Callable[[], WsChannel],
        connects: ConnectLog,
    ) -> None:
        self.index, self.target, self.chains = index, target, chains
        self.pace, self.sink, self.new_channel, self.connects = pace, sink, new_channel, connects
        self.channel: Channel = Channel()  # none open yet
        self.in_turn = False
        self.errors: list[str] = []
        self.turns = 0
        fixed: dict[str, object] = {"type": "response.create", "model": chains.model, "store": False}
        if chains.max_tokens is not None:
            fixed["max_output_tokens"] = chains.max_tokens
        if chains.resend_history:
            fixed["prompt_cache_key"] = f"client-{index}"
        self.head = json.dumps(fixed)[:-1]  # no closing brace
        self.history: list[str] = []  # with resend_history: the conversation's items, encoded
        if chains.resend_history:
            first = {"role": "developer", "content": f"Conversation {index}. {PREFIX}"}
            self.history.append(json.dumps(first))
        self.done = 0  # with resend_history: the conversation's completed turns
        self._first = True

    def body(self, text: str, previous: str | None) -> str:
        items = ",".join([*self.history, json.dumps({"role": "user", "content": text})])
        tail = "" if previous is None else f',"previous_response_id":{json.dumps(previous)}'
        return f'{self.head},"input":[{items}]{tail}}}'

    async def open(self) -> None:
        """Nothing to open before the release: the loop opens a connection for each chain."""

    def _first_done(self) -> None:
        if self._first:
            self._first = False
            self.pace.first_done()

    async def run(self, release_at: float) -> None:
        """Chains from ``release_at`` until the pace's end."""
        await asyncio.sleep(max(0.0, release_at - time.time()))
        try:
            while time.time() < self.pace.end_at:
                channel = self.new_channel()
                try:
                    await open_with_retry(channel.open, self.connects.failures, attempts=1)
                except Exception as exc:  # noqa: BLE001 - counted by type in connects.failures
                    self.errors.append(f"connect: {exc!r}"[:200])
                    await asyncio.sleep(self.chains.reconnect_s)
                    continue
                self.channel = channel
                try:
                    ended = await self.chain(channel)
                except ConnectionClosed:
                    ended = True
                if ended:
                    await asyncio.sleep(self.chains.reconnect_s)
        except asyncio.CancelledError:
            record = self.channel.record
            if record is not None and record.closed is None:
                record.stopped = True  # the run ended before this connection's chain did
            raise
        finally:
            self._first_done()

    async def chain(self, channel: WsChannel) -> bool:
        """One chain on ``channel``; whether the server ended it (else the client closed it).
        Raises ConnectionClosed when the server or the network ends it under a turn."""
        c, record = self.chains, channel.record
        assert record is not None
        previous: str | None = None
        for i in range(c.turns_per_chain):
            if time.time() >= self.pace.end_at:
                record.stopped = True
                break
            text = f"client {self.index} turn {self.done if c.resend_history else i}"
            kind = "first" if self._first else "rollout_first" if i == 0 else "steady"
            body = self.body(text, None if c.resend_history else previous)
            reply, response, code = await self.turn(channel, body, kind)
            if response is None:
                if c.resend_history and code == SHUTTING_DOWN:
                    await channel.wait_closed()  # the server's close (1012, once its node drained)
                    return True
                self.errors.append(f"turn: {reply[:300]}")
                break
            previous = response["id"]
            if c.resend_history:
                self.history += [
                    json.dumps({"role": "user", "content": text}),
                    json.dumps({"role": "assistant", "content": output_text(response)}),
                ]
                self.done += 1
            await asyncio.sleep(c.think_s)
        await channel.close()
        return False

    async def turn(self, channel: WsChannel, body: str, kind: str) -> tuple[str, dict | None, str | None]:
        """One create and its answer, recorded: the final event's text, the Response when it
        completed, the error's code when not."""
        record = channel.record
        assert record is not None
        sent = time.time()
        self.in_turn = True
        try:
            reply = await channel.send(body)
        except ConnectionClosed:
            total = (time.time() - sent) * 1000
            closed = f"closed_{record.close_code}"
            self.sink.append(TurnRecord(self.index, kind, sent, total, None, False, None, self.target,
                                        error_code=closed, connection=record.index))  # fmt: skip
            raise
        finally:
            self.in_turn = False
            self._first_done()
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
                None,
                self.target,
                None if reply.ttft_s is None else reply.ttft_s * 1000,
                code,
                output_tokens=usage.get("output_tokens"),
                connection=record.index,
                cached_tokens=None if cached is None else int(cached),
            )
        )
        self.turns += 1
        return reply.raw, response if ok else None, code
