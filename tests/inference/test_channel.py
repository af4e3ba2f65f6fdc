"""The direct channel (inference.channel) over real loopback sockets, with a small generator
behind it: calls multiplex on one connection and start when made, stopping a call (read or
not) closes its generator, errors
arrive typed, a wrong token is refused, a draining server sends callers elsewhere, and a
lost connection says whether the call could be made elsewhere."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterator
from typing import Any

import pytest

from inference import channel
from inference.channel import ChannelClient, ChannelLost, ChannelServer, ChannelUnavailable, Endpoint
from inference.emulator.profiles import UnknownModelProfile
from inference.types import Breakpoint, Done, InferenceEvent, InferenceRequest, Prefilled, TextDelta, ToolSpec
from tests.support.waiting import until


class Backend:
    """``model`` picks the behaviour: "ok" answers two chunks, "hold" waits after its first,
    "missing" raises UnknownModelProfile."""

    def __init__(self) -> None:
        self.closed: list[str] = []
        self.held = asyncio.Event()
        self.tools: dict[str, tuple[ToolSpec, ...]] = {}  # what each call's request held
        self.prompts: dict[str, list[int]] = {}
        self.marks: dict[str, tuple[Breakpoint, ...]] = {}

    async def generate(self, request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        self.tools[request.request_id] = request.tools
        self.prompts[request.request_id] = list(request.prompt_token_ids)
        self.marks[request.request_id] = request.breakpoints
        try:
            if request.model == "missing":
                raise UnknownModelProfile("missing")
            yield [Prefilled(3, 0, 0.0, 1.0, replica="r1"), TextDelta(request.request_id, 1)]
            if request.model == "hold":
                self.held.set()
                await asyncio.Event().wait()
            yield [TextDelta("!", 1), Done("stop", 2, 1.0)]
        finally:
            self.closed.append(request.request_id)


def req(rid: str, model: str = "ok") -> InferenceRequest:
    return InferenceRequest(request_id=rid, model=model, prompt_token_ids=[1, 2, 3])


async def collect(client: ChannelClient, request: InferenceRequest) -> list[InferenceEvent]:
    return [ev async for chunk in client.stream(request) for ev in chunk]


async def started(backend: Backend) -> tuple[ChannelServer, ChannelClient]:
    server = ChannelServer(backend.generate, "r1")
    client = ChannelClient(await server.start("127.0.0.1"))
    await client.connect()
    return server, client


def test_calls_multiplex_and_end_with_done() -> None:
    async def main() -> None:
        server, client = await started(Backend())
        a, b = await asyncio.gather(collect(client, req("a")), collect(client, req("b")))
        assert [type(e) for e in a] == [Prefilled, TextDelta, TextDelta, Done]
        assert a[1] == TextDelta("a", 1) and b[1] == TextDelta("b", 1)
        client.close()
        await server.drain(1)

    asyncio.run(main())


def test_closing_a_call_early_stops_it_in_the_backend() -> None:
    async def main() -> None:
        backend = Backend()
        _server, client = await started(backend)
        stream = client.stream(req("h", "hold"))
        first = await anext(stream)
        assert isinstance(first[0], Prefilled)
        await backend.held.wait()
        await stream.aclose()
        await until(lambda: backend.closed, 5, "the backend to see the call closed")
        assert backend.closed == ["h"]
        assert await collect(client, req("after"))  # the channel is still usable
        client.close()

    asyncio.run(main())


def test_a_call_starts_when_made_and_closing_it_unread_stops_it_in_the_backend() -> None:
    async def main() -> None:
        backend = Backend()
        _server, client = await started(backend)
        call = client.stream(req("h", "hold"))  # its request is written before this returns
        await backend.held.wait()  # the replica runs it, though nothing read from the call
        call.close()
        await until(lambda: backend.closed, 5, "the backend to see the call closed")
        assert backend.closed == ["h"]
        with pytest.raises(StopAsyncIteration):
            await anext(call)
        assert await collect(client, req("after"))
        client.close()

    asyncio.run(main())


def test_errors_arrive_with_their_type_and_code() -> None:
    async def main() -> None:
        _, client = await started(Backend())
        with pytest.raises(UnknownModelProfile) as info:
            await collect(client, req("m", "missing"))
        assert info.value.code == "model_not_found"
        client.close()

    asyncio.run(main())


def test_a_wrong_token_is_refused_before_anything_is_decoded() -> None:
    async def main() -> None:
        server = ChannelServer(Backend().generate, "r1")
        real = await server.start("127.0.0.1")
        client = ChannelClient(Endpoint(real.replica, real.host, real.port, b"x" * len(real.token)))
        await client.connect()
        with pytest.raises(ChannelUnavailable):
            await collect(client, req("a"))

    asyncio.run(main())


def test_a_draining_server_sends_new_calls_elsewhere_and_finishes_running_ones() -> None:
    async def main() -> None:
        backend = Backend()
        server, client = await started(backend)
        running = client.stream(req("slow", "hold"))
        await anext(running)
        drained = asyncio.get_running_loop().create_task(server.drain(0.3))
        await asyncio.sleep(0)  # one loop turn: the drain's first step (no more calls) runs
        with pytest.raises(ChannelUnavailable):
            await collect(client, req("new"))
        await drained  # the held call did not finish within the timeout; it is still running
        await running.aclose()

    asyncio.run(main())


def test_a_lost_connection_fails_running_calls_and_refuses_new_ones() -> None:
    async def main() -> None:
        backend = Backend()
        _, client = await started(backend)
        stream = client.stream(req("h", "hold"))
        await anext(stream)
        client.close()
        with pytest.raises(ChannelLost):
            await anext(stream)
        await asyncio.sleep(0)
        assert not client.open
        with pytest.raises(ChannelUnavailable):
            await collect(client, req("next"))

    asyncio.run(main())


def test_tools_are_sent_once_per_tuple_and_every_call_gets_its_own(monkeypatch) -> None:
    """A connection's unchanged tools tuple goes over once; calls naming it get it back,
    also after other tuples pushed it out of the channel's memory (sent again then)."""
    monkeypatch.setattr(channel, "TOOL_SETS", 2)

    def tools(name: str) -> tuple[ToolSpec, ...]:
        return (ToolSpec(name, {"type": "object", "properties": {"path": {"type": "string"}}}),)

    async def main() -> None:
        backend = Backend()
        server, client = await started(backend)
        a, b, c = tools("tool_a"), tools("tool_b"), tools("tool_c")
        plan = [("1", a), ("2", a), ("3", b), ("4", ()), ("5", c), ("6", a), ("7", a), ("8", b)]
        for rid, ts in plan:
            call = InferenceRequest(request_id=rid, model="ok", prompt_token_ids=[1, 2, 3], tools=ts)
            assert [type(e) for e in await collect(client, call)][-1] is Done
        assert backend.tools == dict(plan)
        repeat = InferenceRequest(request_id="9", model="ok", prompt_token_ids=[1], tools=a)
        assert b"tool_a" not in client._go(99, repeat)  # a's tuple is known: the go names it
        client.close()
        await server.drain(1.0)

    asyncio.run(main())


def test_a_session_prompt_that_continues_its_last_goes_as_the_new_ids_and_arrives_whole(monkeypatch) -> None:
    """Each call of a session gets its whole prompt, and its tools; one that starts with the
    session's last prompt carries only the ids after it; one that does not, and one past the
    kept bytes (the oldest session's prompt forgotten on both sides), go whole."""
    monkeypatch.setattr(channel, "PROMPT_BYTES", 4 * 10_000)

    async def main() -> None:
        backend = Backend()
        server, client = await started(backend)
        first = array("I", range(5_000))
        grown = array("I", first)
        grown.extend(range(7, 107))
        other = array("I", range(1, 4_000))  # not a continuation
        calls = [
            ("a1", "s", first),
            ("a2", "s", grown),
            ("a3", "s", other),
            ("b1", "t", array("I", range(9_000))),  # pushes s's kept prompt out
            ("a4", "s", array("I", [*other, 5])),
        ]
        sent: list[int] = []
        assert client._transport is not None
        write = client._transport.write
        client._transport.write = lambda data: sent.append(len(data)) or write(data)  # type: ignore[method-assign]
        tools = (ToolSpec("shell", {"type": "object"}),)
        for rid, session, prompt in calls:
            request = InferenceRequest(
                request_id=rid, model="ok", prompt_token_ids=prompt, session_key=session, tools=tools
            )
            assert [type(e) for e in await collect(client, request)][-1] is Done
        assert backend.prompts == {rid: list(prompt) for rid, _, prompt in calls}
        assert backend.tools == {rid: tools for rid, _, _ in calls}
        assert sent[1] < 1_000 < 4 * 4_000 < min(sent[0], sent[2], sent[4])  # a2: the 100 new ids only
        assert list(client._prompts) == ["s"] and len(client._prompts["s"]) == 4 * 4_000
        client.close()
        await server.drain(1.0)

    asyncio.run(main())


def test_a_continuing_prompts_breakpoints_go_as_the_new_ones_and_arrive_whole() -> None:
    """A continuing prompt whose breakpoints start with the kept prompt's carries only the
    breakpoints after them; the server hands the generator the whole tuple.  Breakpoints
    that do not continue the kept ones (a changed prefix) go whole."""

    async def main() -> None:
        backend = Backend()
        server, client = await started(backend)
        marks = tuple(Breakpoint(100 + 10 * i, implicit=True) for i in range(300))
        grown = (*marks, Breakpoint(3_100, "12h"), Breakpoint(3_200, implicit=True))
        moved = tuple(Breakpoint(b.offset + 5, b.ttl, b.implicit) for b in grown)
        prompt = array("I", range(4_000))
        calls = [
            ("a1", marks, prompt),
            ("a2", grown, array("I", [*prompt, 1, 2])),
            ("a3", moved, array("I", [*prompt, 1, 2, 3])),
        ]
        sent: list[int] = []
        assert client._transport is not None
        write = client._transport.write
        client._transport.write = lambda data: sent.append(len(data)) or write(data)  # type: ignore[method-assign]
        for rid, bp, ids in calls:
            request = InferenceRequest(
                request_id=rid, model="ok", prompt_token_ids=ids, session_key="s", breakpoints=bp
            )
            assert [type(e) for e in await collect(client, request)][-1] is Done
        assert backend.marks == {rid: bp for rid, bp, _ in calls}
        assert sent[1] < 1_000 < sent[2]  # a2: two breakpoints and two ids; a3: every breakpoint again
        client.close()
        await server.drain(1.0)

    asyncio.run(main())


def test_the_messages_sent_on_one_tick_leave_in_one_frame() -> None:
    """The server's messages of one turn of the event loop go out together, in order, in one
    frame (one pickle, one write); the next tick's in a frame of their own; a message that
    does not pickle fails its own call and no other."""

    class Writer:
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        def is_closing(self) -> bool:
            return False

        def write(self, data: bytes) -> None:
            self.writes.append(data)

    def frames(data: bytes) -> list[Any]:
        out = []
        while data:
            n = int.from_bytes(data[:4], "big")
            out.append(channel.pickle.loads(data[4 : 4 + n]))
            data = data[4 + n :]
        return out

    async def main() -> None:
        writer = Writer()
        out = channel._Sender(writer)  # type: ignore[arg-type]
        out.send(("chunk", 1, ["a"]))
        out.send(("chunk", 2, ["b"]))
        out.send(("end", 1))
        await asyncio.sleep(0)
        out.send(("end", 2))
        await asyncio.sleep(0)
        assert [frames(w) for w in writer.writes] == [
            [[("chunk", 1, ["a"]), ("chunk", 2, ["b"]), ("end", 1)]],
            [[("end", 2)]],
        ]
        out.send(("chunk", 3, ["c"]))
        out.send(("chunk", 4, [lambda: None]))
        await asyncio.sleep(0)
        sent = frames(writer.writes[-1])
        assert sent[0] == [("chunk", 3, ["c"])]
        assert [m[:2] for m in sent[1]] == [("error", 4)]
        assert isinstance(sent[1][0][2], RuntimeError)

    asyncio.run(main())
