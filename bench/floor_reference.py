"""The floor kind's minimal reference server (bench/kinds/floor.py): the same ``websockets``
library with its default permessage-deflate settings, in a process of its own, answering a
connection's i-th create with the frames this server answered turn i with, re-encoded from
parsed events, and nothing else: the bare protocol's cost on this machine."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from typing import Any

from .floor_report import Run


def _reference_main(turns: list[list[str]], ready: Any) -> None:
    """The reference server (its own process): answers the i-th create of a connection with
    turn i's frames, re-encoded from parsed events, and does nothing else.  It offers
    permessage-deflate with the library's defaults, as a minimal ``websockets`` server does;
    the client's mode decides whether it is negotiated."""
    from websockets.asyncio.server import serve

    events = [[json.loads(f) for f in frames] for frames in turns]

    async def handler(ws: Any) -> None:
        for answer in events:
            json.loads(await ws.recv())
            for event in answer:  # encoded as the server encodes (compact, UTF-8)
                await ws.send(json.dumps(event, separators=(",", ":"), ensure_ascii=False))
        await ws.wait_closed()

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, compression="deflate", max_size=None) as server:
            ready.send(server.sockets[0].getsockname()[1])
            await asyncio.Future()

    asyncio.run(main())


class Reference:
    """The reference server in a process of its own, answering a connection's i-th create
    with ``recorded``'s turn i."""

    def __init__(self, recorded: Run) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_reference_main, args=([t.frames for t in recorded.turns], child), daemon=True
        )
        self.proc.start()
        if not parent.poll(60):
            self.close()
            raise RuntimeError("the reference server did not start")
        self.url = f"http://127.0.0.1:{parent.recv()}"

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def close(self) -> None:
        self.proc.terminate()
        self.proc.join(10)
