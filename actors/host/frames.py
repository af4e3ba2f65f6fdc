"""The bytes a connection's frames are written from, with the echoed instructions and tools
copied nowhere on the way.

A coding agent resends tens of KB of instructions and tools with every create, and three
events of every response echo them (actors.protocol.EventEncoder, which encodes their JSON
once while they are unchanged and hands it out as a piece of its own:
:meth:`~actors.protocol.EventEncoder.pieces`).  Joined into one text, encoded to UTF-8 and
framed by the WebSocket library, each echo would be copied four times a frame;
:class:`PieceBytes` keeps the UTF-8 of such a long piece once a process (by the identity of
the string, which it holds), and :func:`frame_header` is the RFC 6455 header written in front
of the pieces, which leave with one vectored write (:meth:`actors.host.websocket.WebSocket.flush`).
Pure, no I/O.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Sequence

MIN_KEPT_CHARS = 4096  # a shorter piece is encoded each time (keeping it would cost more than it saves)
MAX_KEPT_BYTES = 4_000_000  # ~60 distinct 60 KB echoes; the least recently used go first


class PieceBytes:
    """A text piece → its UTF-8 bytes, kept for a long piece while it is among the most
    recently used (by identity: the entry holds the string, so its id stays its own)."""

    def __init__(self, min_chars: int = MIN_KEPT_CHARS, max_bytes: int = MAX_KEPT_BYTES) -> None:
        self._min_chars = min_chars
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[int, tuple[str, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __call__(self, piece: str) -> bytes:
        if len(piece) < self._min_chars:
            return piece.encode()
        kept = self._entries.get(id(piece))
        if kept is not None and kept[0] is piece:
            self._entries.move_to_end(id(piece))
            return kept[1]
        data = piece.encode()
        if len(data) > self._max_bytes:
            return data
        self._entries[id(piece)] = (piece, data)
        self._bytes += len(data)
        while self._bytes > self._max_bytes:
            _, (_, old) = self._entries.popitem(last=False)
            self._bytes -= len(old)
        return data

    def all(self, pieces: Sequence[str]) -> list[bytes]:
        """Each piece's bytes, in order, leaving out the empty ones."""
        return [self(p) for p in pieces if p]


PROCESS_PIECES = PieceBytes()
"""The process's: every connection's sender (its echoes are the process's, actors.protocol.echoes)."""

TEXT = 0x1  # RFC 6455 opcodes
CONTINUATION = 0x0


def frame_header(length: int, *, opcode: int, fin: bool) -> bytes:
    """The header of an unmasked frame (a server's) with a payload of ``length`` bytes and
    no extension bits."""
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        return bytes((first, length))
    if length < 65536:
        return struct.pack("!BBH", first, 126, length)
    return struct.pack("!BBQ", first, 127, length)


__all__ = ["CONTINUATION", "PROCESS_PIECES", "TEXT", "PieceBytes", "frame_header"]
