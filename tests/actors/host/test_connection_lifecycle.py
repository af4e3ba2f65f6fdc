"""The connection's lifecycle (actors.host.connection_lifecycle: TRANSITIONS, FRAMES), walked: every
state, every move, a client frame in every state, on a real Connection — the tables are what the
connection does."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from actors.config import SessionConfig
from actors.core.session import Session
from actors.host.connection import Connection
from actors.host.connection_lifecycle import FRAMES, TRANSITIONS, Frames, Move, State, late_answers
from actors.protocol import ServerEvent
from store import StoreConfig, open_store
from store.writer import StoreWriter
from tests.actors.host.test_connection import MODEL, ScriptedInference


async def _connection_in(state: State, store: StoreWriter) -> Connection:
    """A connection brought to ``state`` by the moves the table lists (shortest path)."""
    conn = Connection(
        Session(SessionConfig(), [MODEL], session_key="s", clock=lambda: 0.0), ScriptedInference(), store
    )
    path = {
        State.OPEN: [],
        State.DRAINING: [Move.DRAIN],
        State.ENDING: [Move.END],
        State.DRAIN_ENDING: [Move.DRAIN, Move.END],
        State.CLOSED: [Move.CLOSE],
    }[state]
    for move in path:
        await _take(conn, move)
    assert conn.state is state
    return conn


async def _take(conn: Connection, move: Move) -> None:
    if move is Move.DRAIN:
        conn.drain(lambda _: None)  # the host paces the close: the connection stays draining
    elif move is Move.END:
        conn.end(1000)
    else:
        await conn.close()


@pytest.mark.parametrize(("state", "move"), list(itertools.product(State, Move)))
def test_every_move_from_every_state_does_what_the_table_says(state, move, tmp_path):
    async def main() -> State:
        store = StoreWriter(open_store(StoreConfig(data_dir=str(tmp_path))))
        conn = await _connection_in(state, store)
        await _take(conn, move)
        after = conn.state
        await conn.close()
        await store.close()
        return after

    assert asyncio.run(main()) is TRANSITIONS.get((state, move), state)


def test_the_table_reaches_every_state_and_every_state_reaches_closed():
    reached = {State.OPEN} | set(TRANSITIONS.values())
    assert reached == set(State)
    for state in State:
        seen, frontier = {state}, [state]
        while frontier:
            here = frontier.pop()
            for (src, _), dst in TRANSITIONS.items():
                if src is here and dst not in seen:
                    seen.add(dst)
                    frontier.append(dst)
        assert State.CLOSED in seen
    assert not any(src is State.CLOSED for src, _ in TRANSITIONS), "closed is final"


@pytest.mark.parametrize("state", list(State))
def test_a_client_frame_in_every_state_goes_where_the_frames_table_says(state, tmp_path):
    async def main() -> Frames:
        store = StoreWriter(open_store(StoreConfig(data_dir=str(tmp_path))))
        conn = await _connection_in(state, store)
        conn.feed(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "stream_id": "x"}))
        late = conn.take_late_answers()
        conn.end(1000)  # events() ends after what is queued now
        queued: list[ServerEvent | str] = []
        async with asyncio.timeout(10):
            async for batch in conn.events():
                queued += batch
        await conn.close()
        await store.close()
        answered = [e for e in queued if not isinstance(e, str) and e.stream_id == "x"]
        assert not (late and answered), "an answer goes one way"
        if late:
            assert [e.type for e in late] == ["error"]
            return Frames.BEFORE_CLOSE
        return Frames.SESSION if answered else Frames.IGNORED

    assert set(FRAMES) == set(State)
    assert asyncio.run(main()) is FRAMES[state]


def test_only_the_error_answers_of_a_drain_ending_connection_go_before_its_close():
    from actors.errors import ServerShuttingDown
    from actors.protocol import error_event
    from actors.protocol.events import OutputTextDelta

    refusal = error_event(ServerShuttingDown())
    delta = OutputTextDelta(item_id="m", output_index=0, content_index=0, delta="hi", sequence_number=1)
    assert late_answers([delta, refusal]) == ([refusal], [delta])
    assert late_answers([]) == ([], [])
