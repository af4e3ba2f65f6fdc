"""One conversation's turns, one at a time, over a transport: one class per transport,
registered by name (floor length's growing conversations, the replay's recorded sessions; the
agentloop kind's rollouts run on the load runner, bench/runner/agent.py).

A transport owns whatever state its way of continuing a conversation needs and turns
"here are this turn's new items" into a request, returning the terminal ``Response`` and
client-side timings.  To add one, subclass :class:`Transport` and decorate it with
:func:`register`.

- ``ws``: one WebSocket per rollout (and ``append``, its opt-in append mode);
- ``http-chained`` and ``http-full``: ``POST /v1/responses`` (SSE).

How each continues a conversation (its ``store``, ``previous_response_id`` or the whole
conversation resent) is bench/conversation.py's, the load runner's too.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from .client import Answer, Event, ResponsesSocket, connect, is_final
from .conversation import output_as_input, store_for

TRANSPORTS: dict[str, type[Transport]] = {}


def register(cls: type[Transport]) -> type[Transport]:
    TRANSPORTS[cls.name] = cls
    return cls


@dataclass
class TurnOutcome:
    response: dict[str, Any] | None  # the terminal Response object (None on a transport error)
    ttft_s: float | None  # send → first output delta
    total_s: float  # send → terminal event
    request_bytes: int
    error: str | None = None

    @classmethod
    def of(cls, answer: Answer) -> TurnOutcome:
        """A turn answered by ``answer``: its Response, or what went wrong."""
        out = cls(answer.response, answer.ttft_s, answer.total_s, answer.request_bytes)
        last = answer.last
        if last is None or not is_final(last):
            out.error = "stream ended early"
        elif last["type"] == "error":
            out.error = json.dumps(last.get("error"))[:300]
        elif last["type"] != "response.completed":
            out.error = last["type"]
        return out


class Transport(ABC):
    name: ClassVar[str]
    # The Response that covers the whole rollout, for a transport whose server reports
    # timings only once (append mode: its terminal response); ``None``: per turn.
    rollout_response: dict[str, Any] | None = None

    def __init__(self, base_url: str, api_key: str = "sk-bench") -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Called once before the rollout's first turn (inside its measured time)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def new_chain(self) -> None:
        """Start a new conversation on the same transport (after a compaction): the next turn
        continues nothing (no ``previous_response_id``, no history resent)."""
        raise NotImplementedError(f"{self.name} cannot start a new chain")

    @abstractmethod
    async def turn(self, base: dict[str, Any], new_items: list[dict[str, Any]]) -> TurnOutcome:
        """Send one ``response.create`` with ``base`` (model, instructions, tools, metadata)
        and this turn's new input items; wait for the terminal event."""


@register
class WebSocketTransport(Transport):
    name = "ws"
    query: ClassVar[str] = ""  # the upgrade URL's query (append mode opts in there)

    async def open(self) -> None:
        self.socket: ResponsesSocket = await connect(self.base_url, api_key=self.api_key, query=self.query)
        self._prev: str | None = None

    async def close(self) -> None:
        await self.socket.close()

    def new_chain(self) -> None:
        self._prev = None

    async def turn(self, base, new_items):
        body = {**base, "input": new_items, "store": store_for(self.name)}
        if self._prev:
            body["previous_response_id"] = self._prev
        out = TurnOutcome.of(await self.socket.create(**body))
        self._prev = out.response["id"] if out.response and not out.error else None
        return out


class _HttpTransport(Transport):
    async def open(self) -> None:
        self._client = httpx.AsyncClient(
            base_url=self.base_url, timeout=120.0, headers={"Authorization": f"Bearer {self.api_key}"}
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def _post(self, body: dict) -> TurnOutcome:
        data = json.dumps({**body, "stream": True}).encode()
        answer = Answer(time.perf_counter(), len(data))
        async with self._client.stream(
            "POST", "/v1/responses", content=data, headers={"Content-Type": "application/json"}
        ) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                return TurnOutcome(
                    None,
                    None,
                    time.perf_counter() - answer.sent_at,
                    len(data),
                    error=f"{r.status_code} {text[:300]}",
                )
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    answer.add(json.loads(line[5:]))
                    if is_final(answer.events[-1]):
                        break
        return TurnOutcome.of(answer)


@register
class HttpChainedTransport(_HttpTransport):
    name = "http-chained"

    async def open(self) -> None:
        await super().open()
        self._prev: str | None = None

    def new_chain(self) -> None:
        self._prev = None

    async def turn(self, base, new_items):
        body = {**base, "input": new_items, "store": store_for(self.name)}
        if self._prev:
            body["previous_response_id"] = self._prev
        out = await self._post(body)
        self._prev = out.response["id"] if out.response and not out.error else None
        return out


@register
class HttpFullTransport(_HttpTransport):
    name = "http-full"

    async def open(self) -> None:
        await super().open()
        self._history: list[dict] = []

    def new_chain(self) -> None:
        self._history = []

    async def turn(self, base, new_items):
        self._history.extend(new_items)
        out = await self._post({**base, "input": self._history, "store": store_for(self.name)})
        if out.response:
            self._history.extend(output_as_input(out.response.get("output", [])))
        return out


@register
class AppendTransport(WebSocketTransport):
    """The opt-in ``response.append`` rollout mode (docs/append-mode.md): one response per
    rollout; a "turn" runs from sending the create (or the tool results) to the pause on the
    next function call, or to the terminal event.  The lower bound for ``ws``.

    Usage and server phase timings exist only for the whole rollout (on the terminal
    response), so per-turn records carry none and the report falls back to its estimate;
    the terminal response is kept as :attr:`rollout_response` (the rollout's floor)."""

    name = "append"
    query = "?mode=append"
    _response_id: str | None = None

    def new_chain(self) -> None:
        raise NotImplementedError("append mode keeps one response per rollout: no new chain")

    async def turn(self, base, new_items):
        if self._response_id is None:
            event = {"type": "response.create", **base, "input": new_items, "store": store_for("ws")}
        else:
            event = {"type": "response.append", "response_id": self._response_id, "input": new_items}
        answer = await self.socket.request(event, until=_paused_or_final)
        self._response_id = next(
            (e["response"]["id"] for e in answer.events if e["type"] == "response.created"), self._response_id
        )
        segment = [e["item"] for e in answer.events if e["type"] == "response.output_item.done"]
        assert answer.last is not None  # request returns on the event it waits for
        if not is_final(answer.last):  # paused on a function call until our response.append
            return TurnOutcome({"output": segment}, answer.ttft_s, answer.total_s, answer.request_bytes)
        out = TurnOutcome.of(answer)
        if out.response is not None:
            self.rollout_response = out.response
            out.response = {**out.response, "output": segment, "metadata": {}}
        return out


def _paused_or_final(event: Event) -> bool:
    return is_final(event) or (
        event["type"] == "response.output_item.done" and event["item"].get("type") == "function_call"
    )
