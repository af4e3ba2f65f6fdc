"""Direct calls (actors.backend.direct) with a real channel server on loopback and a fake
"usual route": a session's first call goes the usual way and names its replica, later calls
go over the replica's channel, stateless calls never do, and a channel that cannot take a
call sends it the usual way, nothing lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from actors.backend.direct import DirectCalls, Pick
from inference.channel import ChannelServer, Endpoint
from inference.types import Done, InferenceEvent, InferenceRequest, Prefilled, TextDelta
from tests.support.waiting import until


async def answer(request: InferenceRequest, replica: str) -> AsyncIterator[list[InferenceEvent]]:
    yield [Prefilled(3, 0, 0.0, 1.0, replica=replica), TextDelta("hi", 1)]
    yield [Done("stop", 1, 1.0)]


class Replica:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.server = ChannelServer(self.generate, "r1")

    async def generate(self, request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        self.calls.append(request.request_id)
        async for chunk in answer(request, "r1"):
            yield chunk


def setup(replica: Replica, pick: Pick | None = None) -> tuple[DirectCalls, list[str], list[str]]:
    usual_calls: list[str] = []
    asked: list[str] = []

    async def usual(request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        usual_calls.append(request.request_id)
        async for chunk in answer(request, "r1"):
            yield chunk

    async def find(key: str) -> Endpoint:
        asked.append(key)
        return await replica.server.start("127.0.0.1")

    return DirectCalls(usual, find, lambda: 0.0, pick), usual_calls, asked


def req(rid: str, key: str | None = "conn-1") -> InferenceRequest:
    return InferenceRequest(request_id=rid, model="emu-fast", prompt_token_ids=[1], session_key=key)


async def run(direct: DirectCalls, request: InferenceRequest) -> list[InferenceEvent]:
    return [ev async for chunk in direct.stream(request) for ev in chunk]


async def settle(direct: DirectCalls) -> None:
    await until(lambda: direct.channel_for("conn-1") is not None, 10, "the session's channel to open")


def test_later_calls_of_a_session_go_over_its_replicas_channel() -> None:
    async def main() -> None:
        replica = Replica()
        direct, usual, asked = setup(replica)
        first = await run(direct, req("t1"))
        await settle(direct)
        second = await run(direct, req("t2"))
        assert usual == ["t1"] and replica.calls == ["t2"] and asked == ["conn-1"]
        assert [type(e) for e in first] == [type(e) for e in second] == [Prefilled, TextDelta, Done]
        assert direct.direct_calls == 1
        await run(direct, req("s1", key=None))  # stateless: the usual route, always
        assert usual == ["t1", "s1"]
        direct.close()

    asyncio.run(main())


def test_a_call_the_channel_cannot_take_goes_the_usual_way() -> None:
    async def main() -> None:
        replica = Replica()
        direct, usual, _ = setup(replica)
        await run(direct, req("t1"))
        await settle(direct)
        await replica.server.drain(0.1)  # the replica is stopping: new calls are answered "gone"
        events = await run(direct, req("t2"))
        assert [type(e) for e in events] == [Prefilled, TextDelta, Done]
        assert usual == ["t1", "t2"] and replica.calls == []
        direct.close()

    asyncio.run(main())


def test_calls_streaming_on_a_draining_replicas_channel_finish_when_a_new_call_is_turned_away() -> None:
    """A stopping replica finishes the calls on its channel and answers new ones ``gone``:
    the host sends the new ones the usual way and keeps the channel for the others until
    they end (closing it at once cut them, ``ChannelLost``, mid-response)."""

    async def main() -> None:
        gate = asyncio.Event()
        replica = Replica()

        async def slow(request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
            replica.calls.append(request.request_id)
            yield [Prefilled(3, 0, 0.0, 1.0, replica="r1"), TextDelta("hi", 1)]
            await gate.wait()
            yield [Done("stop", 1, 1.0)]

        replica.server = ChannelServer(slow, "r1")
        direct, usual, _ = setup(replica)
        await run(direct, req("t1"))
        await settle(direct)
        streaming = [asyncio.create_task(run(direct, req(rid))) for rid in ("t2", "t3")]
        await until(lambda: len(replica.calls) == 2, 10, "both calls to reach the replica")
        draining = asyncio.create_task(replica.server.drain(10))
        await asyncio.sleep(0)  # one loop turn: the drain's first step (no more calls) runs
        turned_away = await run(direct, req("t4"))  # "gone": the usual way
        gate.set()
        finished = await asyncio.gather(*streaming)
        await draining
        assert [type(e) for e in turned_away] == [Prefilled, TextDelta, Done] and usual == ["t1", "t4"]
        assert all([type(e) for e in events] == [Prefilled, TextDelta, Done] for events in finished)
        direct.close()

    asyncio.run(main())


def test_a_sessions_first_call_goes_over_the_channel_to_the_replica_picked_for_it() -> None:
    """Once the host holds a channel (another session's first call opened it), a new
    session's first call goes over it when the pick (the router's rule,
    ``inference.routing.Routes.first_call``) names that replica, and stays pinned there; a
    pick of a replica the host has no channel to, no pick, or a pick that fails leaves the
    call to the usual way."""

    async def main() -> None:
        replica = Replica()
        picks: list[str] = []
        answers = {"conn-2": "r1", "conn-3": "r9", "conn-4": None}

        def pick(request: InferenceRequest) -> str | None:
            assert request.session_key is not None
            picks.append(request.session_key)
            if request.session_key not in answers:
                raise RuntimeError("no router")
            return answers[request.session_key]

        direct, usual, _ = setup(replica, pick)
        await run(direct, req("t1"))  # no channel yet (the pick fails): the usual way
        await settle(direct)
        assert picks == ["conn-1"]
        picks.clear()
        first = await run(direct, req("n1", key="conn-2"))
        assert [type(e) for e in first] == [Prefilled, TextDelta, Done]
        assert replica.calls == ["n1"] and usual == ["t1"] and picks == ["conn-2"]
        assert direct.channel_for("conn-2") is not None
        await run(direct, req("n2", key="conn-2"))  # pinned: no pick again
        assert replica.calls == ["n1", "n2"] and picks == ["conn-2"]
        for key, rid in (("conn-3", "o1"), ("conn-4", "o2"), ("conn-5", "f1")):
            events = await run(direct, req(rid, key=key))
            assert [type(e) for e in events] == [Prefilled, TextDelta, Done]
        assert usual == ["t1", "o1", "o2", "f1"] and replica.calls == ["n1", "n2"]
        assert direct.direct_calls == 2
        direct.close()

    asyncio.run(main())


def test_a_pick_of_a_replica_without_a_channel_opens_one_for_the_next_calls() -> None:
    """The first call picked for a replica the host holds no channel to goes the usual way
    and starts opening that replica's channel at once; so does :meth:`DirectCalls.open`
    (a host's warm-up); a second ask while it opens shares the opening."""

    async def main() -> None:
        replica = Replica()
        direct, usual, asked = setup(replica, lambda request: "r1")
        stream = direct.stream(req("t1", key="conn-7"))  # not iterated: the opening started anyway
        assert usual == [] and asked == []
        await until(lambda: asked == ["conn-7"], 10, "the channel's endpoint to be asked")
        await stream.aclose()
        await until(lambda: direct.channel_for("conn-7") is not None or "r1" in direct._channels, 10, "open")
        await run(direct, req("t2", key="conn-8"))  # a new key, picked there: over the channel
        assert replica.calls == ["t2"] and usual == []

        other = Replica()
        again, _, asked2 = setup(other)
        task = again.open("warm-up:r1", "r1")
        assert task is not None and again.open("warm-up:r1", "r1") is task
        await task
        assert asked2 == ["warm-up:r1"] and again.open("warm-up:r1", "r1") is None  # open now
        direct.close()
        again.close()

    asyncio.run(main())
