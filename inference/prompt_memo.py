"""What a replica remembers of each session's conversation, so that a turn hashes only what
is new.

A connection's prompt is its previous prompt, the previous output and the new input: a
prefix the replica has already hashed twice — into the prefix cache's chained block keys
(``inference.prefix_cache``) and into the digest that seeds the scripted output
(``inference.policy.prompt_digest``); doing it again would cost time linear in the whole
conversation on every turn.  :class:`PromptMemo` keeps, per session, the length of the last conversation it cached, a
checksum of its bytes, its block keys and the digest's state after its prompt; a new prompt
that starts with exactly those bytes (checked by the checksum, CRC-32 and Adler-32 over the
prefix, at memory speed) reuses them and hashes only the rest.  The results are the very
keys and digest a full computation gives; a prompt that does not extend the remembered one
is computed in full.

Bounded: the least recently used sessions are forgotten past ``capacity``.
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from hashlib import blake2b

Check = tuple[int, int]
EMPTY: Check = (0, 1)  # the checksums of no bytes


def check(data: bytes | memoryview, start: Check = EMPTY) -> Check:
    """CRC-32 and Adler-32 of ``data``, continued from ``start`` (the checksums of what comes
    before it)."""
    return zlib.crc32(data, start[0]), zlib.adler32(data, start[1])


@dataclass(slots=True)
class Digest:
    """The digest's state after ``tokens`` prompt tokens with ``seed``."""

    seed: int
    tokens: int
    state: blake2b


@dataclass(slots=True)
class Known:
    """A session's conversation as the replica last cached it: its first ``tokens`` token ids
    (4 bytes each) have checksums ``check`` and, chained from ``root``, block keys ``keys``."""

    tokens: int
    check: Check
    root: int
    keys: tuple[int, ...]
    digest: Digest | None = None


class PromptMemo:
    def __init__(self, capacity: int = 1024) -> None:
        self._capacity = capacity
        self._known: OrderedDict[Hashable, Known] = OrderedDict()
        self.recalled = 0  # prompts that extended what was known

    def __len__(self) -> int:
        return len(self._known)

    def recall(self, session: Hashable | None, root: int, data: bytes) -> tuple[Known | None, Check]:
        """What is known of ``session``'s conversation if ``data`` (a prompt's bytes) starts
        with it, and the checksums of all of ``data``."""
        known = self._known.get(session) if session is not None else None
        if known is not None:
            n = known.tokens * 4
            if known.root == root and len(data) >= n and check(memoryview(data)[:n]) == known.check:
                self._known.move_to_end(session)
                self.recalled += 1
                return known, check(memoryview(data)[n:], known.check)
        return None, check(data)

    def remember(self, session: Hashable | None, known: Known) -> None:
        if session is None or not self._capacity:
            return
        self._known[session] = known
        self._known.move_to_end(session)
        while len(self._known) > self._capacity:
            self._known.popitem(last=False)


def digest_of(data: bytes, seed: int, known: Known | None) -> tuple[bytes, Digest]:
    """The 16-byte digest of ``seed`` and ``data`` (``policy.prompt_digest``'s), continued from
    what ``known`` holds when its seed is the same, and the state to remember."""
    remembered = known.digest if known is not None else None
    if sys.byteorder != "little":  # the digest is over little-endian ids: policy.prompt_digest's way
        from .policy import prompt_digest

        ids = array("I")
        ids.frombytes(data)
        return prompt_digest(ids, seed), Digest(seed, 0, blake2b(digest_size=16))  # never continued here
    if remembered is not None and remembered.seed == seed and remembered.tokens * 4 <= len(data):
        state = remembered.state.copy()
        state.update(memoryview(data)[remembered.tokens * 4 :])
    else:
        state = blake2b(digest_size=16)
        state.update(seed.to_bytes(16, "little", signed=True))
        state.update(data)
    return state.digest(), Digest(seed, len(data) // 4, state)
