"""The Codex-like loop: one agent's turns, its creates pre-encoded.

A loop runs rollouts of a :mod:`bench.workload` preset one after another: a rollout's first
create resends the instructions, the tools and a resumed history (the ``codex`` preset's
~60k tokens: what a client reconnecting after a node drain sends) and the task; then turns
carrying the tool outputs, each after the tool's time.  What a create holds beyond the
new items is encoded once (:class:`Encoder`): the fixed part (model, instructions, tools),
each resumed history, the tool outputs (a pool of :data:`OUTPUT_POOL` drawn from the
preset's sizes; generating one costs the tokenizer's time).  Only the final event of each
answer is parsed.

The transports continue a conversation as bench/conversation.py says (``ws``'s ``store`` is
the spec's).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from .. import workload as wl
from ..conversation import RESENDS, TIMINGS_KEY, model_seconds, output_as_input, server_timings, store_for
from .channels import Channel
from .connecting import ConnectLog, open_with_retry
from .model import TurnRecord
from .replies import answered, parse_reply, usage_fields

OUTPUT_POOL = 48  # distinct tool outputs per client process (drawn from the preset's sizes)
HISTORY_POOL = 8  # distinct resumed histories (generating one costs the client ~0.1 s of CPU)
ROLLOUT_STRIDE = 100_003  # a loop's next rollout index
FAILED_TURN_PAUSE_S = 1.0  # before a loop that opens a connection per rollout starts the next after a failure


def workload(preset: str, seed: int, resume_tokens: int | None) -> wl.Workload:
    w = replace(wl.PRESETS[preset], seed=seed)
    return w if resume_tokens is None else replace(w, resume_tokens=resume_tokens)


@dataclass
class Encoder:
    """A client process's pre-encoded parts of its creates for one transport."""

    w: wl.Workload
    transport: str
    store: bool
    outputs: list[str]  # tool outputs, each JSON-encoded
    head: str = ""  # '{"type":"response.create","model":...,"tools":[...]' (no closing brace)
    histories: dict[int, str] = field(default_factory=dict)  # pool index -> encoded items, comma-joined

    def __post_init__(self) -> None:
        store = store_for(self.transport, self.store)
        fixed: dict[str, Any] = {"model": self.w.model, "store": store}
        if self.w.system_tokens > 0:  # a workload of none sends none (a bare create)
            fixed["instructions"] = wl.instructions(self.w.system_tokens, self.w.seed)
        if self.w.tool_def_tokens > 0:
            fixed["tools"] = wl.tools(self.w)
        opening = '{"type":"response.create",' if self.transport == "ws" else '{"stream":true,'
        self.head = opening + json.dumps(fixed)[1:-1]

    @classmethod
    def build(cls, w: wl.Workload, transport: str, store: bool, seed_key: str) -> Encoder:
        rng = random.Random(f"capacity-outputs/{seed_key}")
        outputs = [
            json.dumps(wl.tool_output(w, rng.randrange(10**6), 0, 0, "shell")) for _ in range(OUTPUT_POOL)
        ]
        return cls(w, transport, store, outputs)

    @property
    def full(self) -> bool:
        return self.transport in RESENDS

    def history(self, rollout: int) -> tuple[str, int]:
        """A resumed history's items, encoded (comma-joined, no brackets), and how many tool
        results it holds."""
        key = rollout % HISTORY_POOL
        items = wl.history(self.w, key)
        if key not in self.histories:
            self.histories[key] = ",".join(json.dumps(i) for i in items)
        return self.histories[key], sum(1 for i in items if i.get("type") == "function_call_output")

    def body(self, items: str, meta_json: str, previous: str | None = None) -> str:
        tail = "" if previous is None else f',"previous_response_id":{json.dumps(previous)}'
        return f'{self.head},"input":[{items}],"metadata":{meta_json}{tail}}}'


@dataclass
class Pace:
    """A client process's shared clock: when its loops stop, and its first turns' count."""

    firsts: int
    end_at: float = float("inf")
    rollouts: int | None = None  # a loop's rollouts before it stops (None: until ``end_at``)
    storm_over: asyncio.Event = field(default_factory=asyncio.Event)

    def first_done(self) -> None:
        self.firsts -= 1
        if self.firsts <= 0:
            self.storm_over.set()


class Script(Protocol):
    """An agent's rollout's creates (bench/runner/agent.py's ``Conversation``)."""

    def first(self) -> str: ...
    def next(self, response: dict[str, Any]) -> str | None: ...
    def tool_time_s(self) -> float: ...
    def note(self, record: TurnRecord, create: str, response: dict[str, Any] | None) -> None: ...


class Agent(Protocol):
    """Where an agent's loops take their rollouts (bench/runner/agent.py's ``Agent``)."""

    w: wl.Workload

    def take(self) -> tuple[str, int] | None: ...
    def conversation(self, transport: str, rollout: int) -> Script: ...
    async def warm(self, target: str, transport: str, rollout: int) -> str | None: ...
    def channel(self, target: str, transport: str, loop: int) -> Channel: ...


class Loop:
    """One agent's turns.  ``new_channel`` makes its channel (opened before its first turn
    by the client process; by the loop itself for each rollout when ``fresh_connection``).

    With ``agent`` (the rollouts workload, bench/runner/agent.py) the loop takes its rollouts
    from the agent's jobs until none is left, each on its transport's channel of its own (opened
    inside the rollout's time), its creates the agent's :class:`~bench.runner.agent.Conversation`;
    a rollout's turns reach ``sink`` when it ends (each with its tool's measured time, the last
    with the rollout's)."""

    def __init__(
        self,
        index: int,
        target: str,
        enc: Encoder | None,  # None: an agent's (its creates are the agent's)
        pace: Pace,
        sink: list[TurnRecord],
        new_channel: Callable[[], Channel],
        *,
        fresh_connection: bool = False,
        connects: ConnectLog | None = None,
        continues: str | None = None,
        agent: Agent | None = None,
    ) -> None:
        self.index = index
        self.target = target
        self.enc = enc
        self.pace = pace
        self.sink = sink
        self.new_channel = new_channel
        self.fresh_connection = fresh_connection
        self.connects = ConnectLog() if connects is None else connects
        self.channel = new_channel()
        self.rollout = index
        self.turns = 0
        self.errors: list[str] = []
        self.rng = random.Random(f"capacity/{index}")
        self.meta_json = "{}"
        self.conversation: list[str] = []  # http-full: every item so far, encoded
        self.in_turn = False  # a create sent, its final event not yet received
        self.rollouts_done = 0
        self._connect_ms: float | None = None
        self.continues = continues  # the stored response the first rollout continues (LoadSpec.continues)
        self.agent = agent
        self.conv: Script | None = None  # the agent's rollout now
        self.shared = sink  # the process's records (an agent's rollout collects its own in ``sink``)
        self._began = 0.0  # the agent's rollout's start (perf_counter)

    def first_create(self) -> str:
        """The rollout's first create: a resumed history (one of :data:`HISTORY_POOL`) and
        the task; the model is told to call tools while the context holds fewer tool
        results than that history's plus the rollout's rounds.  The loop's first rollout,
        when it continues a stored response (``continues``), sends the task alone with it."""
        if self.conv is not None:
            return self.conv.first()
        assert self.enc is not None
        w, rollout = self.enc.w, self.rollout
        previous, self.continues = self.continues, None
        history, resumed = self.enc.history(rollout) if previous is None else ("", 0)
        task = json.dumps({"role": "user", "content": [{"type": "input_text", "text": wl.task(w, rollout)}]})
        meta = wl.metadata(replace(w, resume_tokens=0), rollout)
        meta["emulator.tool_rounds"] = str(int(meta["emulator.tool_rounds"]) + resumed)
        self.meta_json = json.dumps({**meta, TIMINGS_KEY: "1"})
        items = f"{history},{task}" if history else task
        self.conversation = [items]
        return self.enc.body(items, self.meta_json, previous)

    def next_create(self, response: dict[str, Any]) -> str | None:
        if self.conv is not None:
            return self.conv.next(response)
        assert self.enc is not None
        calls = [o for o in response.get("output", []) if o.get("type") == "function_call"]
        if not calls:
            return None
        outputs = self.enc.outputs
        items = ",".join(
            f'{{"type":"function_call_output","call_id":{json.dumps(c["call_id"])},'
            f'"output":{outputs[self.rng.randrange(len(outputs))]}}}'
            for c in calls
        )
        if self.enc.full:
            self.conversation += [*map(json.dumps, output_as_input(response.get("output", []))), items]
            return self.enc.body(",".join(self.conversation), self.meta_json)
        return self.enc.body(items, self.meta_json, response["id"])

    async def open(self) -> None:
        """Open the channel, retried (bench/runner/connecting.py); each failed attempt and
        the open's time logged in ``connects``."""
        began, t0 = time.time(), time.perf_counter()
        await open_with_retry(self.channel.open, self.connects.failures, attempts=self.connects.attempts)
        self._connect_ms = (time.perf_counter() - t0) * 1000
        self.connects.opened.append((began, self._connect_ms))

    def held_create(self) -> str:
        """A new rollout's first create, for a connection held open (no new connection)."""
        self.rollout += ROLLOUT_STRIDE
        return self.first_create()

    async def turn(self, create: str, kind: str) -> dict[str, Any] | None:
        """Send ``create`` and wait for its final event; the Response when it completed."""
        connect_ms, self._connect_ms = self._connect_ms, None
        sent = time.time()
        self.in_turn = True
        try:
            reply = await self.channel.send(create)
            response, ok, code = parse_reply(reply)
        except Exception as exc:  # noqa: BLE001 - a failed turn is a record, not a crash
            self.in_turn = False
            total = (time.time() - sent) * 1000
            self.sink.append(
                TurnRecord(
                    self.index,
                    kind,
                    sent,
                    total,
                    None,
                    False,
                    None,
                    self.target,
                    error_code=type(exc).__name__,
                    connection=None if self.channel.record is None else self.channel.record.index,
                )
            )
            self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            self._note(create, None)
            return None
        self.in_turn = False
        server = server_timings(response) if response else None
        model = model_seconds(server)
        conn = self.channel.record
        self.sink.append(
            answered(
                self.index,
                kind,
                reply,
                ok,
                self.target,
                code,
                model_ms=None if model is None else model * 1000,
                server=server,
                connect_ms=connect_ms,
                connection=None if conn is None else conn.index,
                **usage_fields(response),
            )
        )
        self._note(create, response)
        self.turns += 1
        if not ok:
            self.errors.append(reply.raw[:200])
            return None
        return response

    def _note(self, create: str, response: dict[str, Any] | None) -> None:
        if self.conv is not None:
            self.conv.note(self.sink[-1], create, response)

    def rollout_over(self) -> None:
        """An agent's rollout ended: its time on its last turn, its turns to the process's."""
        if self.conv is not None and self.sink:
            self.sink[-1].rollout_s = time.perf_counter() - self._began
            self.shared.extend(self.sink)
            self.sink = []

    async def next_job(self) -> str | None:
        """The agent's next rollout's first create, its channel opened (None: no job left).
        A rollout whose warm-up or open failed is recorded as failed and the next one taken."""
        assert self.agent is not None
        agent = self.agent
        while (job := agent.take()) is not None:
            transport, self.rollout = job
            await self.channel.close()
            self.sink, self.turns = [], 0
            self.conv = agent.conversation(transport, self.rollout)
            failed = await agent.warm(self.target, transport, self.rollout) if agent.w.resume_tokens else None
            self.channel = agent.channel(self.target, transport, self.index)
            self._began = time.perf_counter()
            if failed is None:
                try:
                    await self.open()
                    return self.first_create()
                except Exception as exc:  # noqa: BLE001 - a failed rollout is a record
                    failed = f"connect: {type(exc).__name__}: {exc}"[:300]
            self.errors.append(failed)
            self.sink.append(
                TurnRecord(
                    self.index,
                    "rollout_first",
                    time.time(),
                    0.0,
                    None,
                    False,
                    target=self.target,
                    error_code=failed,
                )
            )
            self._note("", None)
            self.rollout_over()
        return None

    async def next_rollout(self) -> str | None:
        if self.agent is not None:
            return await self.next_job()
        self.rollout += ROLLOUT_STRIDE
        if self.fresh_connection:
            await self.channel.close()
            self.channel = self.new_channel()
            await self.open()
        return self.first_create()

    async def run(self, release_at: float) -> None:
        """Turns from ``release_at`` until the pace's end (a turn in flight then completes).
        A failed turn ends the loop, unless it opens a connection per rollout: then the
        next rollout starts on a new one (an agent's at once).  The tool's time after a turn
        includes making its outputs."""
        agent = self.agent
        create = None if agent is not None else self.first_create()
        await asyncio.sleep(max(0.0, release_at - time.time()))
        if agent is not None and (create := await self.next_job()) is None:
            return
        kind = "first"
        while create is not None and time.time() < self.pace.end_at:
            try:
                response = await self.turn(create, kind)
            finally:
                if kind == "first":
                    self.pace.first_done()
            tool_began = time.perf_counter()
            nxt = None if response is None else self.next_create(response)
            if response is None:
                if not self.fresh_connection:
                    return
                if (
                    agent is None
                ):  # a new rollout on a new connection, after a pause (no storm of failing turns)
                    await asyncio.sleep(max(0.0, min(FAILED_TURN_PAUSE_S, self.pace.end_at - time.time())))
            if nxt is None:  # the rollout ended (or failed): the next one
                self.rollouts_done += 1
                self.rollout_over()
                if time.time() >= self.pace.end_at or self.rollouts_done == self.pace.rollouts:
                    return
                create, kind = await self.next_rollout(), "rollout_first"
                continue
            if self.conv is not None:
                pause = self.conv.tool_time_s()
            else:
                assert self.enc is not None
                pause = wl.tool_time_s(self.enc.w, self.rollout, self.turns)
            left = self.pace.end_at - time.time()
            if pause >= left:  # the tool would still run at the end: no more turns
                await asyncio.sleep(max(0.0, left))
                return
            await asyncio.sleep(max(0.0, pause - (time.perf_counter() - tool_began)))
            if self.conv is not None:
                self.sink[-1].tool_ms = (time.perf_counter() - tool_began) * 1000
            create, kind = nxt, "steady"
