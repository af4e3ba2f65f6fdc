"""The bytes frames are written from (actors.host.frames): the header is the WebSocket
library's own for every length class, a long piece's bytes are kept once (by identity) and
dropped oldest first past the bound, and a frame sent in parts reads as the message whole."""

from __future__ import annotations

import asyncio
import socket

import pytest
from websockets.asyncio.client import connect
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from actors.host.frames import CONTINUATION, TEXT, PieceBytes, frame_header
from actors.host.websocket import WebSocket


@pytest.mark.parametrize("length", [0, 1, 125, 126, 65535, 65536, 70_000])
@pytest.mark.parametrize("fin", [True, False])
def test_the_header_is_the_librarys_for_every_length(length, fin):
    payload = b"x" * length
    for opcode, kind in ((TEXT, Opcode.TEXT), (CONTINUATION, Opcode.CONT)):
        theirs = Frame(kind, payload, fin).serialize(mask=False)
        assert frame_header(length, opcode=opcode, fin=fin) + payload == theirs


def test_a_long_piece_is_kept_by_identity_and_the_oldest_go_past_the_bound():
    kept = PieceBytes(min_chars=10, max_bytes=50)
    short = "short"
    assert kept(short) == b"short" and len(kept) == 0, "a short piece is encoded each time"
    a = "é" * 12  # 24 bytes of UTF-8
    first = kept(a)
    assert first == a.encode() and kept(a) is first, "the same string: the bytes kept for it"
    equal = "".join(["é" * 6, "é" * 6])  # equal text, another string: its own entry
    assert kept(equal) == first and kept(equal) is not first and len(kept) == 2
    kept("z" * 20)  # 68 bytes kept > 50: the least recently used goes
    assert len(kept) == 2 and kept(a) is not first, "the oldest was dropped"
    assert kept.all(["", short, ""]) == [b"short"], "empty pieces are left out"


@pytest.mark.parametrize("deflate", [False, True], ids=["framed-here", "deflate"])
def test_a_frame_sent_in_parts_arrives_whole_after_a_ping_queued_before_it(deflate):
    """Parts (an echo's kept bytes among them) go out as one frame, the fragments of a message
    as one message, in order after what the protocol queued first; with permessage-deflate
    negotiated the protocol frames (and compresses) the joined parts."""

    async def accept(ws: WebSocket, request: Request) -> Response:
        return ws.protocol.accept(request)

    async def main() -> list[str]:
        host_side, client_side = socket.socketpair()
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[WebSocket] = loop.create_future()
        await loop.connect_accepted_socket(
            lambda: WebSocket(
                ServerProtocol(extensions=[ServerPerMessageDeflateFactory()] if deflate else None),
                accept,
                opened.set_result,
                ping_interval=None,
                ping_timeout=None,
            ),
            host_side,
        )
        compression = "deflate" if deflate else None
        async with connect("ws://host/v1/responses", sock=client_side, compression=compression) as ws:
            server = await opened
            assert bool(server.protocol.extensions) is deflate
            echo = ("i" * 70_000).encode()
            server.protocol.send_ping(b"p")  # queued by the protocol, not flushed yet
            server.send_text([b'{"a":"', echo, b'"}'])
            server.send_text([b"fir", b"st "], fin=False)
            server.send_continuation([b"", b"second"], fin=True)
            server.flush()
            async with asyncio.timeout(5):
                got = [await ws.recv() for _ in range(2)]
            return [str(m) if len(m) < 100 else f"{len(m)}" for m in got]

    assert asyncio.run(main()) == ["70008", "first second"]
