"""A state's change as one splice: what a resumable connection's checkpoint writes instead of
the whole state (:mod:`store.connection_states`).  Pure bytes, no I/O.

A session's state (JSON) changes between turns by growing at one place — a lane's items get
the turn's input and output appended, its latest response id and replica change beside them
— so the difference between two states is taken as the bytes both share at the start and at
the end, and one run between them that was replaced: ``(start, removed, inserted)``.  Its
size is the turn's new bytes, however long the state is.  Applying the splices written since
a snapshot, in order, gives the state back exactly (whatever changed: a splice is correct for
any two byte strings, only its size depends on where they differ).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_HEADER = struct.Struct(">II")  # start, removed
_CHUNK = 4096


@dataclass(frozen=True, slots=True)
class Splice:
    """Replace ``removed`` bytes at ``start`` with ``inserted``."""

    start: int
    removed: int
    inserted: bytes

    def encode(self) -> bytes:
        return _HEADER.pack(self.start, self.removed) + self.inserted

    @classmethod
    def decode(cls, raw: bytes) -> Splice:
        start, removed = _HEADER.unpack_from(raw)
        return cls(start, removed, raw[_HEADER.size :])


def _common_prefix(a: bytes, b: bytes, limit: int) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, at most ``limit``
    (compared a chunk at a time, then bisected inside the first chunk that differs)."""
    n = 0
    while n + _CHUNK <= limit and a[n : n + _CHUNK] == b[n : n + _CHUNK]:
        n += _CHUNK
    lo, hi = n, min(n + _CHUNK, limit)
    while lo < hi:  # a[n:lo] == b[n:lo]; the first difference is before hi
        mid = (lo + hi + 1) // 2
        if a[n:mid] == b[n:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def diff(old: bytes, new: bytes) -> Splice:
    """The splice that turns ``old`` into ``new``."""
    limit = min(len(old), len(new))
    head = _common_prefix(old, new, limit)
    tail = _common_prefix(old[::-1], new[::-1], limit - head)  # (reversed copies: O(n) memcpy)
    return Splice(head, len(old) - head - tail, new[head : len(new) - tail])


def apply(state: bytearray, splice: Splice) -> None:
    """Apply ``splice`` to ``state`` in place (moves only the bytes after it)."""
    if splice.start + splice.removed > len(state):
        raise ValueError("the splice does not fit the state it is applied to")
    state[splice.start : splice.start + splice.removed] = splice.inserted
