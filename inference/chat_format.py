"""The emulated model's chat template: a conversation rendered to cl100k token ids.

Every item of a conversation renders to one *segment*::

    <|endofprompt|>  header "\\n"  body

The separator is the special token ``<|endofprompt|>`` (id 100276), placed by id; headers
and bodies are encoded as plain text (``tokenizer.encode``), so user content can never
forge a separator.  Header, name and body are encoded as separate pieces, which keeps a
segment's tokens independent of its neighbours.

Contract: rendering is segment-wise concatenation.  A conversation's prompt is the
concatenation of its items' segments, so for item lists ``a`` and ``b``
``render(a + b) == render(a) + render(b)``.  The session relies on this to *append* the
new items of a turn to the previous turn's tokens instead of re-rendering the history,
and the prefix cache relies on it to find the previous turn as a prefix.

There is no trailing "assistant header" generation prompt: the model generates after the
last segment.  The deployment renders its own output with ``render_message("assistant",
text)`` and ``render_function_call(name, arguments)``, the same functions the session uses
for output items it replays, so the next turn's prompt extends what the KV cache holds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache

from inference.tokenizer import encode, special_token
from inference.types import ToolSpec

SEPARATOR_TEXT = "<|endofprompt|>"


@lru_cache(maxsize=1)
def separator_id() -> int:
    """The separator's token id (100276 in cl100k)."""
    return special_token(SEPARATOR_TEXT)


@lru_cache(maxsize=4096)
def _label(text: str) -> tuple[int, ...]:
    """The ids of a segment's header or a call's name line: a handful of strings, met on
    every turn, so they are encoded once (tiktoken's first call after the process has been
    idle is slow, however short the text)."""
    return tuple(encode(text))


def _segment(
    header: str, *pieces: str, encoded: Sequence[int] | None = None, label: str | None = None
) -> list[int]:
    """``encoded``: the last piece's encoding, when the caller has it (``encode(pieces[-1])``
    exactly): it is not encoded again.  ``label``: a first piece from a small set (a tool's
    name line), encoded once per process."""
    tokens = [separator_id()]
    tokens += _label(header + "\n")
    if label is not None:
        tokens += _label(label)
    for piece in pieces if encoded is None else pieces[:-1]:
        tokens += encode(piece)
    if encoded is not None:
        tokens += encoded
    return tokens


def render_tools(tools: Sequence[ToolSpec]) -> list[int]:
    """The tool list: empty when there are no tools, else one segment naming each tool
    with its JSON schema in canonical form (sorted keys, no spaces)."""
    if not tools:
        return []
    pieces = [
        f"{tool.name}\n{json.dumps(tool.parameters, sort_keys=True, separators=(',', ':'))}\n"
        for tool in tools
    ]
    return _segment("tools", *pieces)


def render_instructions(text: str | None) -> list[int]:
    """The system instructions: empty when ``text`` is None or empty."""
    if not text:
        return []
    return _segment("system", text)


def render_message(role: str, text: str, *, encoded: Sequence[int] | None = None) -> list[int]:
    """A message (``user``, ``assistant``, ``developer``, ...) with its text content
    (``encoded``: the text's encoding, if known; the emulator's own output has it)."""
    return _segment(role, text, encoded=encoded)


def render_function_call(name: str, arguments: str, *, encoded: Sequence[int] | None = None) -> list[int]:
    """A function call the model made.  The arguments are encoded on their own, so their
    tokens are exactly the argument tokens the model generated (``encoded``, if known)."""
    return _segment("function_call", arguments, encoded=encoded, label=name + "\n")


def render_function_call_output(output: str) -> list[int]:
    """The result of a function call, sent back by the client.  It answers the call just
    before it in the conversation; the call id is not rendered (as in chat templates without
    call ids): ids are random per run, and with them in the same conversation would render —
    and hit the prefix cache — differently on every transport."""
    return _segment("function_call_output", output)


def render_custom_tool_call(name: str, tool_input: str, *, encoded: Sequence[int] | None = None) -> list[int]:
    """A call of a custom (freeform) tool: its name and its free-text input (``encoded``, if known)."""
    return _segment("custom_tool_call", tool_input, encoded=encoded, label=name + "\n")


def render_other(kind: str, text: str) -> list[int]:
    """Any other item kept in context, e.g. a replayed ``reasoning`` item's text."""
    return _segment(kind, text)


name = "cl100k"  # the format's token space (inference.formats.ChatFormat)
