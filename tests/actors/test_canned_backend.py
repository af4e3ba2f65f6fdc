"""The shipped fake of the inference seam (actors/backend/canned.py): a real InferenceClient
that records each call as it starts and as its stream is closed, read or not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from actors.backend import InferenceClient
from actors.backend.canned import CannedClient
from actors.errors import InvalidRequest
from inference.types import Done, InferenceEvent, InferenceRequest, TextDelta


def request(rid: str) -> InferenceRequest:
    return InferenceRequest(rid, "emu-fast", [1, 2, 3])


def test_it_is_an_inference_client_answering_hi_there_by_default():
    client: InferenceClient = CannedClient()

    async def main() -> tuple[list[str], list[list[InferenceEvent]]]:
        return await client.warm(), [chunk async for chunk in client.stream(request("r1"))]

    models, chunks = asyncio.run(main())
    assert models == ["emu-fast"]
    events = [e for chunk in chunks for e in chunk]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hi there"
    assert isinstance(events[-1], Done)


def test_it_records_a_call_when_it_starts_and_when_its_stream_is_closed_read_or_not():
    client = CannedClient()

    async def main() -> None:
        read = client.stream(request("read"))
        never_read = client.stream(request("never"))
        assert client.started == ["read", "never"] and client.closed == []
        async for _ in read:
            pass
        await never_read.aclose()
        await never_read.aclose()  # once only

    asyncio.run(main())
    assert client.closed == ["read", "never"]


def test_closing_a_stream_mid_answer_closes_the_answer():
    finished: list[str] = []

    async def hold(req: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        try:
            yield [TextDelta("a", 1)]
            await asyncio.Event().wait()
            yield [Done("stop", 1, 1.0)]
        finally:
            finished.append(req.request_id)

    client = CannedClient(answer=hold)

    async def main() -> None:
        stream = client.stream(request("r"))
        assert await anext(stream) == [TextDelta("a", 1)]
        await stream.aclose()

    asyncio.run(main())
    assert finished == client.closed == ["r"]


def test_metadata_is_checked_by_the_check_it_was_given():
    def refuse(metadata):
        if "bad" in metadata:
            raise InvalidRequest("bad metadata", param="metadata.bad")

    CannedClient().check_metadata({"bad": "1"})
    with pytest.raises(InvalidRequest):
        CannedClient(check_metadata=refuse).check_metadata({"bad": "1"})
