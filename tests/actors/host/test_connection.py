"""The asyncio driver's safety net: a bug a client frame hits becomes ``server_error`` on
that socket, which stays usable."""

from __future__ import annotations

import asyncio
import json

from actors.config import SessionConfig
from actors.host.connection import Connection
from actors.session import Session
from store import StoreConfig, open_store
from store.writer import StoreWriter


class BuggySession(Session):
    """A session whose frame handler has a bug for one input."""

    def on_frame(self, data):  # noqa: ANN001, ANN201
        if data == "trigger":
            raise KeyError("internal detail /srv/secret.py")
        return super().on_frame(data)


def test_an_unexpected_exception_becomes_server_error_without_its_text(tmp_path):
    async def main():
        session = BuggySession(SessionConfig(), ["emu-fast"], session_key="s", clock=lambda: 0.0)
        store = StoreWriter(open_store(StoreConfig(data_dir=str(tmp_path))))
        conn = Connection(session, inference=None, store=store)  # type: ignore[arg-type]
        conn.feed("trigger")
        conn.feed("not json")  # the connection still answers the next frame
        events = [json.loads(e.model_dump_json()) for e in (await anext(conn.events()))]
        await conn.close()
        await store.close()
        return events

    first, second = asyncio.run(main())
    assert first["type"] == "error" and first["status"] == 500
    assert first["error"]["code"] == "server_error" and "secret" not in json.dumps(first)
    assert second["type"] == "error" and second["error"]["code"] == "invalid_json"
