"""The inference seam (actors.backend) with a fake backend behind it driving a real
Connection: the hook runs before each model call and sees what is new to it, closing the
connection closes the backend's stream, and a failing hook fails only its response."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from actors.backend import InferenceClient, ModelCall
from actors.backend.canned import CannedClient
from actors.config import SessionConfig
from actors.core.session import Session
from actors.host.connection import Connection
from inference.types import Done, InferenceEvent, InferenceRequest, Prefilled, TextDelta
from store import StoreConfig, StoreWriter, open_store
from tests.support.waiting import until

MODEL = "emu-fast"
HOLD = "test.hold"  # metadata: the call waits after its first delta until the connection closes


class FakeBackend(CannedClient):
    """Answers "Hi there"; logs each hook call, model call and stream close in order."""

    def __init__(self, fail_hook_for: str | None = None) -> None:
        super().__init__([MODEL], self._answer, before_call=self._hook)
        self.log: list[tuple[str, str]] = []
        self.calls: list[ModelCall] = []
        self._fail_hook_for = fail_hook_for

    async def _hook(self, call: ModelCall) -> None:
        self.log.append(("hook", call.request.request_id))
        self.calls.append(call)
        if (self._fail_hook_for, "1") in call.request.metadata:
            raise ConnectionError("service unreachable")

    async def _answer(self, request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        self.log.append(("stream", request.request_id))
        try:
            yield [Prefilled(len(request.prompt_token_ids), 0, 0.0, 0.0), TextDelta("Hi", 1)]
            if (HOLD, "1") in request.metadata:
                await asyncio.Event().wait()
            yield [TextDelta(" there", 1), Done("stop", 2, 1.0)]
        finally:
            self.log.append(("closed", request.request_id))


def create(**body) -> str:
    return json.dumps({"type": "response.create", "model": MODEL, "input": "hello", "store": False, **body})


def run(
    backend: InferenceClient, scenario: Callable[[Connection, list[dict]], Awaitable[None]], tmp_path
) -> list[dict]:
    """Run ``scenario`` on a connection to ``backend``; the events the client received."""
    events: list[dict] = []

    async def main() -> None:
        writer = StoreWriter(open_store(StoreConfig(data_dir=str(tmp_path))))
        session = Session(SessionConfig(), [MODEL], session_key="s", clock=lambda: 0.0)
        conn = Connection(session, backend, writer)

        async def drain() -> None:
            async for batch in conn.events():
                events.extend(json.loads(e if isinstance(e, str) else e.model_dump_json()) for e in batch)

        sender = asyncio.get_running_loop().create_task(drain())
        try:
            await scenario(conn, events)
        finally:
            await conn.close()
            await sender
            await writer.close()

    asyncio.run(main())
    return events


def terminals(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] in ("response.completed", "response.failed")]


def test_the_hook_runs_before_each_model_call_and_sees_what_is_new_to_it(tmp_path):
    backend = FakeBackend()

    async def scenario(conn: Connection, events: list[dict]) -> None:
        conn.feed(create(input="a first message"))
        await until(lambda: len(terminals(events)) == 1, 10, "the first terminal event")
        first = terminals(events)[0]["response"]["id"]
        conn.feed(create(input="next", previous_response_id=first))
        await until(lambda: len(terminals(events)) == 2, 10, "the second terminal event")

    run(backend, scenario, tmp_path)
    one, two = backend.calls
    ids = [one.request.request_id, two.request.request_id]
    assert backend.log == [(step, rid) for rid in ids for step in ("hook", "stream", "closed")]
    # No tools or instructions: a first call's whole conversation is its prompt, all of it new.
    assert one.conversation_tokens == one.unread_tokens == len(one.request.prompt_token_ids)
    # The continuation: what the first call read is not new to it; the first output and "next" are.
    assert two.conversation_tokens == len(two.request.prompt_token_ids)
    assert two.conversation_tokens - two.unread_tokens == one.conversation_tokens
    assert two.unread_tokens > 0


def test_closing_the_connection_closes_the_backends_stream(tmp_path):
    backend = FakeBackend()

    async def scenario(conn: Connection, events: list[dict]) -> None:
        conn.feed(create(metadata={HOLD: "1"}))
        await until(lambda: any(e["type"] == "response.output_text.delta" for e in events), 10, "a delta")
        await conn.close()

    run(backend, scenario, tmp_path)
    (call,) = backend.calls
    assert backend.log == [
        ("hook", call.request.request_id),
        ("stream", call.request.request_id),
        ("closed", call.request.request_id),
    ]


def test_a_failing_hook_fails_its_response_before_the_model_call_and_the_connection_goes_on(tmp_path):
    backend = FakeBackend(fail_hook_for="test.fail")

    async def scenario(conn: Connection, events: list[dict]) -> None:
        conn.feed(create(metadata={"test.fail": "1"}))
        await until(lambda: len(terminals(events)) == 1, 10, "the first terminal event")
        conn.feed(create())
        await until(lambda: len(terminals(events)) == 2, 10, "the second terminal event")

    failed, completed = terminals(run(backend, scenario, tmp_path))
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == "server_error"
    assert completed["type"] == "response.completed"
    assert ("stream", failed["response"]["id"]) not in backend.log
    assert ("stream", completed["response"]["id"]) in backend.log
