"""The outbox's batches (actors.host.outbox): in order, and a batch handed out is not kept
while the next is awaited — a response's terminal event holds the whole response, and a
coding agent's next create comes seconds later."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import pytest

from actors.host.outbox import Outbox

pytestmark = pytest.mark.unit


class Event:
    """Stands for a server event: the outbox reads only its lane."""

    stream_id = None


def test_batches_come_in_order_and_end_with_the_end():
    async def main() -> list[list[Any]]:
        outbox = Outbox()
        a, b, c = Event(), Event(), Event()
        outbox.send(a)  # type: ignore[arg-type]
        outbox.send(b)  # type: ignore[arg-type]
        got = [await anext(aiter(outbox.batches()))]
        outbox.send(c)  # type: ignore[arg-type]
        outbox.end_now()
        got += [batch async for batch in outbox.batches()]
        return [[id(e) for e in batch] for batch in got] + [[id(a), id(b), id(c)]]

    *batches, ids = asyncio.run(main())
    assert batches == [ids[:2], ids[2:]]


def test_a_batch_handed_out_is_not_kept_while_the_next_is_awaited():
    async def main() -> tuple[bool, bool]:
        outbox = Outbox()
        event = Event()
        sent = weakref.ref(event)
        outbox.send(event)  # type: ignore[arg-type]
        batches = outbox.batches()
        batch = await anext(batches)
        assert batch == [event]
        del batch, event
        waiting = asyncio.ensure_future(anext(batches))
        await asyncio.sleep(0)  # the generator now waits for the next batch
        kept = sent() is not None
        outbox.end_now()
        with pytest.raises(StopAsyncIteration):
            await waiting
        return kept, waiting.done()

    kept, ended = asyncio.run(main())
    assert not kept
    assert ended
