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
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..client import ConnectionClosed, frame_type, output_text
from .channels import SHUTTING_DOWN, Channel, Reply, WsChannel
from .connecting import ConnectLog, open_with_retry
from .loop import Pace
from .model import TurnRecord
from .replies import answered, parse_reply, usage_fields
from .workloads import Chains

# Codex's instructions: a prefix of >1024 tokens, so a resumed conversation's turns can be cached
PREFIX = " ".join(["the quick brown fox jumps over a lazy dog"] * 150)


@dataclass(frozen=True)
class Create:
    """One create's own parts (its text, ``store`` and asked-for output tokens): the same when
    it is sent again."""

    text: str
    store: bool
    tokens: int | None


def started(channel: Channel) -> dict[str, Any] | None:
    """The Response the channel's last create started (its ``response.created``), if it came."""
    return None if channel.created is None else json.loads(channel.created).get("response")


class ChainTurns:
    """What a ``chains`` loop's turns share over any transport: the creates' fixed head (its
    :meth:`fields`, a stored one's ``store`` flipped), each create's own parts drawn per turn,
    the think time, the answered turn's record.  The same surface as
    :class:`~bench.runner.loop.Loop` for the worker: ``run``, ``channel``, ``in_turn``, ``errors``."""

    def __init__(
        self, index: int, target: str, chains: Chains, pace: Pace, sink: list[TurnRecord], seed: int = 0
    ) -> None:
        self.index, self.target, self.chains = index, target, chains
        self.pace, self.sink = pace, sink
        self.channel: Channel = Channel()  # none open yet
        self.in_turn = False
        self.errors: list[str] = []
        self.turns = 0
        fixed = self.fields()
        self.head = json.dumps(fixed)[:-1]  # no closing brace
        self.stored_head = json.dumps({**fixed, "store": True})[:-1]
        self.rng = random.Random(f"chains/{seed}/{index}")
        self.history: list[str] = []  # a conversation resent whole (ChainLoop's resend_history), encoded
        self._first = True

    def fields(self) -> dict[str, object]:
        """The fixed fields of every create (``store`` false)."""
        fixed: dict[str, object] = {"model": self.chains.model, "store": False}
        if self.chains.max_tokens is not None:
            fixed["max_output_tokens"] = self.chains.max_tokens
        return fixed

    def body(self, text: str, previous: str | None, create: Create | None = None) -> str:
        items = ",".join([*self.history, json.dumps({"role": "user", "content": text})])
        tail = "" if previous is None else f',"previous_response_id":{json.dumps(previous)}'
        head = self.head
        if create is not None:
            head = self.stored_head if create.store else self.head
            if create.tokens is not None:
                meta = {"emulator.tool_rounds": "0", "emulator.text_tokens": str(create.tokens)}
                if self.chains.reasoning_tokens is not None:
                    meta["emulator.reasoning_tokens"] = str(self.chains.reasoning_tokens)
                tail += f',"metadata":{json.dumps(meta)}'
        return f'{head},"input":[{items}]{tail}}}'

    def new_create(self, text: str) -> Create:
        c = self.chains
        store = c.store_share > 0 and self.rng.random() < c.store_share
        tokens = None if c.text_tokens is None else self.rng.randint(*c.text_tokens)
        return Create(text, store, tokens)

    def think_s(self) -> float:
        c = self.chains
        return c.think_s * (1 + self.rng.uniform(-c.think_spread, c.think_spread) if c.think_spread else 1)

    async def open(self) -> None:
        """Nothing to open before the release: the loop opens its connections itself."""

    async def run(self, release_at: float) -> None:
        """Turns from ``release_at`` until the pace's end."""
        raise NotImplementedError

    def _first_done(self) -> None:
        if self._first:
            self._first = False
            self.pace.first_done()

    def record(
        self,
        channel: Channel,
        reply: Reply,
        parsed: tuple[dict[str, Any] | None, bool, str | None],
        kind: str,
        resent: bool,
    ) -> TurnRecord:
        """The answered turn's record: its times, how it ended, its response and usage."""
        response, ok, code = parsed
        begun = started(channel) or {}
        terminal = frame_type(reply.raw) if response is not None else None
        store = (response or begun).get("store")
        return answered(
            self.index,
            kind,
            reply,
            ok,
            self.target,
            code,
            connection=None if channel.record is None else channel.record.index,
            response_id=(response or begun).get("id"),
            store=None if store is None else bool(store),
            terminal=terminal,
            resent=resent,
            **usage_fields(response),
        )


class ChainLoop(ChainTurns):
    """One client's chains over WebSocket connections, one a chain, until the pace's end."""

    def __init__(
        self,
        index: int,
        target: str,
        chains: Chains,
        pace: Pace,
        sink: list[TurnRecord],
        new_channel: Callable[[], WsChannel],
        connects: ConnectLog,
        seed: int = 0,
    ) -> None:
        super().__init__(index, target, chains, pace, sink, seed)
        self.new_channel, self.connects = new_channel, connects
        self.pending: Create | None = None  # continue_stored: a create to send again on the next connection
        self.last: tuple[str, bool] | None = None  # continue_stored: the last completed response, stored
        if chains.resend_history:
            first = {"role": "developer", "content": f"Conversation {index}. {PREFIX}"}
            self.history.append(json.dumps(first))
        self.done = 0  # with resend_history: the conversation's completed turns

    def fields(self) -> dict[str, object]:
        fixed: dict[str, object] = {"type": "response.create", **super().fields()}
        if self.chains.resend_history:
            fixed["prompt_cache_key"] = f"client-{self.index}"
        return fixed

    async def run(self, release_at: float) -> None:
        """Chains from ``release_at`` until the pace's end."""
        await asyncio.sleep(max(0.0, release_at - time.time()))
        try:
            while time.time() < self.pace.end_at:
                # ours from its open on: the run's end may catch it in its open (the lookup of
                # where it went), and it is marked stopped and closed like any other
                channel = self.channel = self.new_channel()
                try:
                    await open_with_retry(channel.open, self.connects.failures, attempts=1)
                except Exception as exc:  # noqa: BLE001 - counted by type in connects.failures
                    self.connects.refused(exc)
                    self.errors.append(f"connect: {exc!r}"[:200])
                    await asyncio.sleep(self.chains.reconnect_s)
                    continue
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
        if c.continue_stored and self.last is not None and self.last[1]:
            previous = self.last[0]  # a stored response outlives its connection
        for n in range(c.turns_per_chain * c.chains_per_connection):
            if time.time() >= self.pace.end_at:
                record.stopped = True
                break
            i = n % c.turns_per_chain
            if n and not i:
                previous = None  # a new chain on the same connection
            text = f"client {self.index} turn {self.done if c.resend_history else i}"
            kind = "first" if self._first else "rollout_first" if i == 0 else "steady"
            resent = self.pending is not None
            create = self.pending or self.new_create(text)
            if c.resend_unstarted:
                self.pending = create  # until it is started: sent again on the next connection
            body = self.body(create.text, None if c.resend_history else previous, create)
            reply, response, code = await self.turn(channel, body, kind, resent=resent)
            if c.resend_unstarted and code == SHUTTING_DOWN and channel.created is None:
                await self.await_close(channel)
                return True
            self.pending = None
            if response is None:
                if c.resend_history and code == SHUTTING_DOWN:
                    await self.await_close(channel)  # the server's close (1012, once its node drained)
                    return True
                self.errors.append(f"turn: {reply[:300]}")
                self.last = None
                if c.continue_stored:
                    previous = None
                    await asyncio.sleep(self.think_s())
                    continue
                break
            previous = response["id"]
            self.last = (previous, bool(response.get("store", create.store)))
            if c.resend_history:
                self.history += [
                    json.dumps({"role": "user", "content": text}),
                    json.dumps({"role": "assistant", "content": output_text(response)}),
                ]
                self.done += 1
            await asyncio.sleep(self.think_s())
        await channel.close()
        return False

    async def await_close(self, channel: WsChannel) -> None:
        """Told ``server_shutting_down``: the server closes the connection once nothing runs
        on it; at most ``close_wait_s`` when given (then it is ``left_open`` and the client
        closes it)."""
        try:
            async with asyncio.timeout(self.chains.close_wait_s):
                await channel.wait_closed()
        except TimeoutError:
            assert channel.record is not None
            channel.record.left_open = True
            await channel.close()

    async def turn(
        self, channel: WsChannel, body: str, kind: str, *, resent: bool = False
    ) -> tuple[str, dict | None, str | None]:
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
            begun = started(channel)
            if begun is not None:
                self.pending = None  # it ran: lost, never sent again
            self.sink.append(TurnRecord(self.index, kind, sent, total, None, False, None, self.target,
                                        error_code=f"closed_{record.close_code}", connection=record.index,
                                        response_id=None if begun is None else begun.get("id"),
                                        store=None if begun is None else begun.get("store"),
                                        resent=resent))  # fmt: skip
            raise
        finally:
            self.in_turn = False
            self._first_done()
        response, ok, code = parse_reply(reply)
        self.sink.append(self.record(channel, reply, (response, ok, code), kind, resent))
        self.turns += 1
        return reply.raw, response if ok else None, code


class HttpChainLoop(ChainTurns):
    """The chains over ``http-full``: every turn a streamed ``POST /v1/responses`` of its own
    (no ``previous_response_id``) through the client process's pool for the target, recorded
    as a ws chain's turn is (its response, ``store``, terminal event and usage); a request
    that failed is recorded with the error ``http_error:<type>`` and the next one sent
    ``reconnect_s`` later."""

    def __init__(
        self,
        index: int,
        target: str,
        chains: Chains,
        pace: Pace,
        sink: list[TurnRecord],
        new_channel: Callable[[], Channel],
        seed: int = 0,
    ) -> None:
        super().__init__(index, target, chains, pace, sink, seed)
        self.new_channel = new_channel

    def fields(self) -> dict[str, object]:
        return {**super().fields(), "stream": True}

    async def run(self, release_at: float) -> None:
        """Turns from ``release_at`` until the pace's end."""
        await asyncio.sleep(max(0.0, release_at - time.time()))
        channel = self.channel = self.new_channel()
        try:
            n = 0
            while time.time() < self.pace.end_at:
                kind = "first" if self._first else "steady"
                create = self.new_create(f"client {self.index} turn {n}")
                n += 1
                sent = time.time()
                self.in_turn = True
                try:
                    reply = await channel.send(self.body(create.text, None, create))
                except Exception as exc:  # noqa: BLE001 - recorded as the turn's error, by type
                    total = (time.time() - sent) * 1000
                    begun = started(channel) or {}
                    self.sink.append(TurnRecord(self.index, kind, sent, total, None, False, None, self.target,
                                                error_code=f"http_error:{type(exc).__name__}",
                                                response_id=begun.get("id"), store=begun.get("store")))  # fmt: skip
                    await asyncio.sleep(self.chains.reconnect_s)
                    continue
                finally:
                    self.in_turn = False
                    self._first_done()
                self.sink.append(self.record(channel, reply, parse_reply(reply), kind, False))
                self.turns += 1
                await asyncio.sleep(self.think_s())
        finally:
            self._first_done()
