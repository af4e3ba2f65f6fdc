"""The connection's lifecycle (actors.host.connection_lifecycle.TRANSITIONS), walked: every state, every
move, on a real Connection — the table is what the connection does."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from actors.config import SessionConfig
from actors.core.session import Session
from actors.host.connection import Connection
from actors.host.connection_lifecycle import TRANSITIONS, Move, State
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
