"""Compaction: the emulated summary of a conversation, and server-side compaction
(``context_management``, docs/protocol.md §4.12, §6.7).

:func:`compact` is the emulated compaction: it keeps every user message verbatim and
replaces everything else (assistant text, tool calls and their outputs, reasoning) by one
``compaction`` item whose ``encrypted_content`` carries an extractive summary — one short
line per replaced item — compressed and base64-encoded.  The renderer decodes the summary,
so the model sees it (:func:`actors.core.render.compaction_text`).
``POST /v1/responses/compact`` returns it as a new input window (``serve/compaction.py``).

Server-side compaction (:func:`compacted`): a create with
``context_management: [{"type": "compaction", "compact_threshold": N}]`` whose prompt
passes ``N`` tokens runs on its inherited conversation compacted the same way — the calls
its input answers kept verbatim after the summary — and its output starts with the
``compaction`` item, as the hosted API's does.  The conversation it leaves (what its lane
caches and its record keeps) is the compacted one, so a continuation with
``previous_response_id`` is rendered from the compacted window.
"""

from __future__ import annotations

import base64
import zlib
from array import array
from dataclasses import dataclass

from inference.formats import ChatFormat

from ..ids import new_id
from ..protocol import (
    CompactionItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    OutputCompaction,
    ResponseCreate,
    issued_call_id,
    item_dict,
    parse_items,
)
from ..protocol.wire_types import JSONObject
from .context import ContextEntry
from .render import content_text, qualified_name, render_marked

EXCERPT = 160  # characters kept of each replaced item
DEFAULT_SHARE = 0.8  # no compact_threshold: compact past this share of the prompt limit


def _line(item: InputItem) -> str:
    if isinstance(item, MessageItem):
        return f"{item.role}: {content_text(item.content)[:EXCERPT]}"
    if isinstance(item, FunctionCallItem):
        return f"called {item.name}({item.arguments[:EXCERPT]}) as {item.call_id}"
    if isinstance(item, FunctionCallOutputItem):
        text = content_text(item.output)
        source = item.call_id or qualified_name(item.name, item.namespace)
        return f"result of {source} ({len(text)} chars): {text[:EXCERPT]}"
    return f"{item.type} item"


def compact(items: list[InputItem]) -> tuple[list[JSONObject], str]:
    """The compacted window (output items) and the summary text it carries."""
    kept: list[JSONObject] = []
    summary: list[str] = []
    for item in items:
        if isinstance(item, MessageItem) and item.role == "user":
            kept.append(item_dict(item, new_id("msg")))
        else:
            summary.append(_line(item))
    text = "Summary of the earlier conversation:\n" + "\n".join(summary)
    blob = base64.b64encode(zlib.compress(text.encode())).decode()
    kept.append(CompactionItem(type="compaction", id=new_id("cmp"), encrypted_content=blob).model_dump())
    return kept, text


def threshold(create: ResponseCreate, max_input_tokens: int) -> int | None:
    """The prompt size past which ``create`` compacts, if it asked for compaction (without
    a ``compact_threshold``: ``DEFAULT_SHARE`` of the prompt limit)."""
    for entry in create.context_management or ():
        if entry.type == "compaction":
            return entry.compact_threshold or int(max_input_tokens * DEFAULT_SHARE)
    return None


@dataclass(frozen=True, slots=True)
class Compacted:
    parent: ContextEntry  # the inherited conversation, compacted
    item: OutputCompaction  # the response's first output item


def compacted(
    create: ResponseCreate,
    prompt_tokens: int,
    parent: ContextEntry | None,
    fmt: ChatFormat,
    max_input_tokens: int,
) -> Compacted | None:
    """The compacted parent of a request whose prompt (``prompt_tokens``, uncompacted)
    passes its compaction threshold; ``None`` if it asked for none, stays under it, or
    inherits nothing to compact."""
    limit = threshold(create, max_input_tokens)
    if limit is None or prompt_tokens <= limit or parent is None or not parent.items:
        return None
    items = parse_items(parent.items)
    keep = len(items)
    while keep > 0 and issued_call_id(items[keep - 1]) is not None:
        keep -= 1  # the calls this request's input answers stay next to their outputs
    if keep == 0:
        return None
    window, _ = compact(items[:keep])
    context = window + parent.items[keep:]
    rendered = render_marked(parse_items(context), fmt)
    tokens = array("I", rendered.tokens)
    entry = ContextEntry(
        parent.response_id,
        tokens,
        context,
        parent.call_ids,
        parent.tool_results,  # the scripted policy's count of tool rounds carries on
        parent.store,
        parent.scan,
        fresh_tokens=len(tokens),
        fmt=fmt.name,
        marks=rendered.marks,
    )
    summary = window[-1]
    return Compacted(
        entry, OutputCompaction(id=summary["id"], encrypted_content=summary["encrypted_content"])
    )
