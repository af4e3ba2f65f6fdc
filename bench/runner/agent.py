"""The ``rollouts`` workload's parts (:class:`~bench.runner.workloads.Rollouts`): the agentloop
kind's rollouts, each the same conversation on every transport, run by the runner's
:class:`~bench.runner.loop.Loop`.

- :class:`Jobs`: a client process's queue of (transport, rollout), its loops taking them in order;
- :class:`Conversation`: one rollout's creates on one transport, encoded as the transport
  sends them (``ws``, ``http-chained`` and ``http-full`` as bench/conversation.py says;
  ``append``: ``response.create`` then ``response.append``), the tool outputs made from the
  rollout, the turn and the call (:func:`bench.workload.tool_output`), the client's
  prompt-cache breakpoints placed when the workload asks (bench/breakpoints.py);
- :class:`Agent`: the channel of each transport (under its own key) and the resumed history's
  cache warm-up.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import breakpoints as bp
from .. import workload as wl
from ..client import frame_type
from ..conversation import TIMINGS_KEY, output_as_input, store_for
from .channels import OPEN_TIMEOUT_S, Channel, Connections, HttpChannel, Reply, WsChannel
from .connecting import ConnectLog
from .loop import Loop, Pace
from .model import LoadSpec, TurnRecord
from .workloads import Rollouts


def first_input(w: wl.Workload, rollout: int) -> list[dict[str, Any]]:
    """A rollout's first input: the resumed history (if any), then the task."""
    task = {"role": "user", "content": [{"type": "input_text", "text": wl.task(w, rollout)}]}
    return [*wl.history(w, rollout), task]


def short(w: wl.Workload) -> wl.Workload:
    """The warm-up's rollout: two tool rounds, no resumed history."""
    return replace(w, tool_rounds=2, shape=None, resume_tokens=0)


class Jobs:
    """The (transport, rollout) pairs still to run, taken in order by a process's loops."""

    def __init__(self, jobs: Sequence[tuple[str, int]]) -> None:
        self.left = deque(jobs)

    def take(self) -> tuple[str, int] | None:
        return self.left.popleft() if self.left else None


@dataclass
class Conversation:
    """Rollout ``rollout`` of ``w`` on ``transport``: :meth:`first`, then :meth:`next` with
    each answer until it returns None (no function call: the rollout is over)."""

    w: wl.Workload
    transport: str
    rollout: int
    turn: int = 0  # the turns sent so far
    pause_s: float = 0.0  # the tools' time after the turn last answered
    base: dict[str, Any] = field(default_factory=dict)
    previous: str | None = None  # ws, http-chained: the last response; append: the one response
    history: list[dict[str, Any]] = field(default_factory=list)  # http-full: every item so far

    def __post_init__(self) -> None:
        meta = {**wl.metadata(self.w, self.rollout), TIMINGS_KEY: "1"}
        self.base = {**wl.fixed(self.w), "metadata": meta}

    @property
    def rounds(self) -> int:
        return wl.rounds(self.w, self.rollout)

    def first(self) -> str:
        items = first_input(self.w, self.rollout)
        if self.w.breakpoints:
            items = bp.place(items, first=True, ttl=self.w.breakpoint_ttl, resumed=len(items) - 1)
        return self._body(items)

    def tool_time_s(self) -> float:
        """The tools' time after the turn last answered (:meth:`next`'s)."""
        return self.pause_s

    def next(self, response: dict[str, Any]) -> str | None:
        """The next create, answering ``response``'s function calls (None: it made none, or the
        rollout's turns are done)."""
        output = response.get("output", [])
        calls = [o for o in output if o.get("type") == "function_call"]
        if self.transport == "http-full":
            self.history.extend(output_as_input(output))
        if self.transport in ("ws", "http-chained"):
            self.previous = response.get("id")
        elif self.transport == "append":
            self.previous = response.get("id") or self.previous
        if not calls or self.turn > self.rounds:
            return None
        self.pause_s = wl.tool_time_s(self.w, self.rollout, self.turn)
        items = [
            {
                "type": "function_call_output",
                "call_id": c["call_id"],
                "output": wl.tool_output(self.w, self.rollout, self.turn, i, c["name"]),
            }
            for i, c in enumerate(calls)
        ]
        if self.w.breakpoints:
            items = bp.place(items, first=False)
        return self._body(items)

    def note(self, record: TurnRecord, create: str, response: dict[str, Any] | None) -> None:
        """A turn's record with what the agentloop kind reports beside its times."""
        record.transport, record.rollout, record.turn = self.transport, self.rollout, self.turn
        record.request_bytes = len(create)  # JSON is ASCII: characters are bytes
        usage = (response or {}).get("usage") or {}
        if usage:
            record.cached_tokens, record.write_30m_tokens, record.write_12h_tokens = bp.figures(usage)
        record.calls = sum(1 for o in (response or {}).get("output", []) if o.get("type") == "function_call")

    def _body(self, items: list[dict[str, Any]]) -> str:
        """The create (or append) of this turn, as the transport sends it."""
        self.turn += 1
        t = self.transport
        if t == "append":
            if self.turn > 1:
                return json.dumps({"type": "response.append", "response_id": self.previous, "input": items})
            return json.dumps(
                {"type": "response.create", **self.base, "input": items, "store": store_for("ws")}
            )
        if t == "http-full":
            self.history.extend(items)
            return json.dumps({**self.base, "input": self.history, "store": store_for(t), "stream": True})
        body: dict[str, Any] = {**self.base, "input": items, "store": store_for(t)}
        if self.previous:
            body["previous_response_id"] = self.previous
        return json.dumps({"type": "response.create", **body} if t == "ws" else {**body, "stream": True})


class AppendChannel(WsChannel):
    """The opt-in ``response.append`` mode (docs/append-mode.md): one response a rollout, its
    first create a ``response.create``, then ``response.append`` events with the tool results.
    An answer runs from the send to the pause on the next function call, or to the terminal
    event; its output items are parsed (the next append answers its calls: :class:`Reply`'s
    ``segment``)."""

    def __init__(self, base_url: str, api_key: str | None, open_timeout_s: float = OPEN_TIMEOUT_S, **kw: Any):
        super().__init__(base_url, api_key, open_timeout_s, query="?mode=append", **kw)
        self.response_id: str | None = None
        self._segment: list[dict[str, Any]] = []  # the answer under way's output items

    async def send(self, body: str) -> Reply:
        self._segment = []
        return await super().send(body)

    def _pauses(self, raw: str) -> bool:
        kind = frame_type(raw)
        if kind == "response.created":
            self.response_id = json.loads(raw)["response"]["id"]
        elif kind == "response.output_item.done":
            item = json.loads(raw)["item"]
            self._segment.append(item)
            return bool(item.get("type") == "function_call")  # paused until the append answers it
        return False

    def _reply(
        self, raw: str, sent: float, total_s: float, ttft: float | None, gap_s: float, first_s: float | None
    ) -> Reply:
        return Reply(raw, sent, total_s, ttft, segment=self._segment, response_id=self.response_id)


class Agent:
    """What a process's loops share for the rollouts workload: the jobs, the workload, the
    channel of each transport (a new one a rollout, under the transport's key)."""

    def __init__(
        self,
        w: wl.Workload,
        shape: Rollouts,
        jobs: Jobs,
        connections: Connections,
        open_timeout_s: float,
    ) -> None:
        self.w, self.shape, self.jobs = w, shape, jobs
        self.connections, self.open_timeout_s = connections, open_timeout_s

    def take(self) -> tuple[str, int] | None:
        return self.jobs.take()

    def conversation(self, transport: str, rollout: int) -> Conversation:
        return Conversation(self.w, transport, rollout)

    def channel(self, target: str, transport: str, loop: int) -> Channel:
        key = self.shape.key(transport)
        if transport == "ws":
            return WsChannel(target, key, self.open_timeout_s, connections=self.connections, loop=loop)
        if transport == "append":
            return AppendChannel(target, key, self.open_timeout_s, connections=self.connections, loop=loop)
        return HttpChannel(own=(target, key))

    async def warm(self, target: str, transport: str, rollout: int) -> str | None:
        """Put the rollout's resumed history in the prefix cache under the transport's key, as
        a session resumed within the provider's retention finds it (its first turn then hits on
        every transport alike, not on whichever ran it second): one ``generate:false`` create
        (docs/protocol.md §4.11) on a connection of its own.  What went wrong, or None."""
        history = wl.history(self.w, rollout)
        if self.w.breakpoints:  # marked as the first turn sends it, so that turn reads it
            history = bp.place(history, first=True, ttl=self.w.breakpoint_ttl, resumed=len(history))
        body = {"type": "response.create", **wl.fixed(self.w), "input": history, "store": False}
        channel = WsChannel(target, self.shape.key(transport), self.open_timeout_s)
        try:
            await channel.open()
            reply = await channel.send(json.dumps({**body, "generate": False}))
        except Exception as exc:  # noqa: BLE001 - the rollout's failure, said
            return f"warm: {type(exc).__name__}: {exc}"[:300]
        finally:
            await channel.close()
        final = json.loads(reply.raw) if reply.raw else {}
        if (final.get("response") or {}).get("status") != "completed":
            return f"warm: rollout {rollout}'s history: {reply.raw[:200]}"
        return None


async def agent_loops(
    spec: LoadSpec,
    indices: list[int],
    pace: Pace,
    sink: list[TurnRecord],
    connections: Connections,
    connects: ConnectLog,
) -> list[Loop]:
    """A client process's loops of the rollouts workload (``indices``, sharing its jobs); with
    the shape's ``warmup`` one short rollout per transport first, one after another, its turns
    not kept (first-use costs: actors, handles, store, tokenizer), then the settle time."""
    from .loop import workload

    shape = spec.rollouts
    w = spec.custom_workload or workload(spec.preset, spec.seed, spec.resume_tokens)
    if shape.warmup:
        jobs = Jobs([(t, -1) for t in shape.transports])
        warm = Agent(short(w), shape, jobs, Connections(), spec.open_timeout_s)
        await Loop(0, spec.target(0), None, Pace(1), [], Channel, fresh_connection=True, agent=warm).run(
            time.time()
        )
        # a session actor ends with its socket and the gateway's pool starts a replacement: let it refill
        await asyncio.sleep(shape.settle_s)
    jobs = Jobs([j for k, j in enumerate(shape.jobs()) if k % spec.loops in indices])
    agent = Agent(w, shape, jobs, connections, spec.open_timeout_s)
    return [
        Loop(
            i,
            spec.target(i),
            None,
            pace,
            sink,
            Channel,
            fresh_connection=True,
            connects=connects,
            agent=agent,
        )
        for i in indices
    ]
