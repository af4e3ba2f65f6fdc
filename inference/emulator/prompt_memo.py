"""What a replica remembers of each session's conversation, so that a turn hashes only what
is new.

A connection's prompt is its previous prompt, the previous output and the new input: a
prefix the replica has already hashed twice — into the prefix cache's chained block keys
(``inference.emulator.prefix_cache``) and into the digest that seeds the scripted output
(``inference.emulator.policy.prompt_digest``); doing it again would cost time linear in the whole
conversation on every turn.  :class:`PromptMemo` keeps, per session, the last conversation
it cached (the prompt's bytes, the very object the request brought, and the output's), its
block keys and the digest's state after its prompt; a new prompt that starts with exactly
those bytes (compared as bytes, a memory compare: ``python -m investigations.prompt_memo_turn``
measures it against checksumming them) reuses them and hashes only the rest.  The results are
the very keys and digest a full computation gives; a prompt that does not extend the
remembered one is computed in full.

Bounded: the least recently used sessions are forgotten past ``capacity`` sessions or
``max_bytes`` of remembered conversations.
"""

from __future__ import annotations

import sys
from array import array
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from hashlib import blake2b

MAX_BYTES = 64 * 1024 * 1024  # remembered conversations' bytes (4 a token), all sessions together


@dataclass(slots=True)
class Digest:
    """The digest's state after ``tokens`` prompt tokens with ``seed``."""

    seed: int
    tokens: int
    state: blake2b


@dataclass(slots=True)
class Known:
    """A session's conversation as the replica last cached it: ``prompt`` then ``output``
    (token ids, 4 bytes each) with, chained from ``root``, block keys ``keys``."""

    prompt: bytes
    output: bytes
    root: int
    keys: tuple[int, ...]
    digest: Digest | None = None

    @property
    def tokens(self) -> int:
        return (len(self.prompt) + len(self.output)) // 4

    def starts(self, data: bytes) -> bool:
        """Whether ``data`` (a prompt's bytes) starts with this conversation."""
        return data.startswith(self.prompt) and data.startswith(self.output, len(self.prompt))


class PromptMemo:
    def __init__(self, capacity: int = 1024, max_bytes: int = MAX_BYTES) -> None:
        self._capacity, self._max_bytes = capacity, max_bytes
        self._known: OrderedDict[Hashable, Known] = OrderedDict()
        self._bytes = 0
        self.recalled = 0  # prompts that extended what was known

    def __len__(self) -> int:
        return len(self._known)

    def recall(self, session: Hashable | None, root: int, data: bytes) -> Known | None:
        """What is known of ``session``'s conversation if ``data`` (a prompt's bytes) starts
        with it."""
        known = self._known.get(session) if session is not None else None
        if known is not None and known.root == root and known.starts(data):
            self._known.move_to_end(session)
            self.recalled += 1
            return known
        return None

    def remember(self, session: Hashable | None, known: Known) -> None:
        if session is None or not self._capacity:
            return
        self._forget(session)
        size = len(known.prompt) + len(known.output)
        if size > self._max_bytes:
            return
        self._known[session] = known
        self._bytes += size
        while len(self._known) > self._capacity or self._bytes > self._max_bytes:
            self._forget(next(iter(self._known)))

    def _forget(self, session: Hashable) -> None:
        gone = self._known.pop(session, None)
        if gone is not None:
            self._bytes -= len(gone.prompt) + len(gone.output)


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
