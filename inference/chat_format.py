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
from array import array
from collections.abc import Sequence
from functools import lru_cache

from inference.tokenizer import encode, get_encoding, special_token
from inference.types import ToolSpec

SEPARATOR_TEXT = "<|endofprompt|>"


def separator_id() -> int:
    """The separator's token id (100276 in cl100k)."""
    return special_token(SEPARATOR_TEXT)


def _segment(header: str, *pieces: str) -> list[int]:
    tokens = [separator_id()]
    tokens += encode(header + "\n")
    for piece in pieces:
        tokens += encode(piece)
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


def render_message(role: str, text: str) -> list[int]:
    """A message (``user``, ``assistant``, ``developer``, ...) with its text content."""
    return _segment(role, text)


def render_function_call(name: str, arguments: str) -> list[int]:
    """A function call the model made.  The arguments are encoded on their own, so their
    tokens are exactly the argument tokens the model generated."""
    return _segment("function_call", name + "\n", arguments)


def render_function_call_output(call_id: str, output: str) -> list[int]:
    """The result of a function call, sent back by the client."""
    return _segment("function_call_output", call_id + "\n", output)


def render_custom_tool_call(name: str, tool_input: str) -> list[int]:
    """A call of a custom (freeform) tool: its name and its free-text input."""
    return _segment("custom_tool_call", name + "\n", tool_input)


@lru_cache(maxsize=1)
def _output_head() -> tuple[int, ...]:
    """The tokens that open every function-call-output segment (separator and header)."""
    return (separator_id(), *encode("function_call_output\n"))


def without_call_ids(tokens: Sequence[int]) -> array:
    """``tokens`` (a rendered conversation) with the call id of every function-call
    output removed, as an ``array("I")``.

    Call ids are random (``call_…``), so two runs of the same conversation render to
    different prompts; with them removed they render the same.  The scripted policy seeds
    its choices from this view (``inference.policy``), so the same rollout produces the same
    output whatever the transport.  The call id is its own piece, ``call_id + "\\n"``, right
    after the segment's header (see ``render_function_call_output``); pieces are encoded
    separately, so the piece ends with the first token holding a newline.  A call id that
    itself contains a newline is cut at it (the rest stays: still deterministic).
    """
    packed = tokens if isinstance(tokens, array) and tokens.typecode == "I" else array("I", tokens)
    head = _output_head()
    data = packed.tobytes()
    pattern = array("I", head).tobytes()
    sep = head[0]
    token_bytes = get_encoding().decode_single_token_bytes
    out = array("I")
    kept = 0  # tokens before this index are copied or dropped already
    pos = data.find(pattern)
    while pos >= 0:
        if pos % 4:  # a match across token boundaries (cannot happen for rendered prompts)
            pos = data.find(pattern, pos + 1)
            continue
        start = pos // 4 + len(head)
        end = start
        while end < len(packed) and packed[end] != sep:
            end += 1
            if b"\n" in token_bytes(packed[end - 1]):
                break
        out.extend(packed[kept:start])
        kept = end
        pos = data.find(pattern, end * 4)
    out.extend(packed[kept:])
    return out


def render_other(kind: str, text: str) -> list[int]:
    """Any other item kept in context, e.g. a replayed ``reasoning`` item's text."""
    return _segment(kind, text)
