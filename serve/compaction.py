"""``POST /v1/responses/compact``: shrink a conversation into a new input window
(docs/protocol.md §6.7).

The emulated compaction keeps every user message verbatim and replaces everything else
(assistant text, tool calls and their outputs, reasoning) by one ``compaction`` item whose
``encrypted_content`` carries an extractive summary — one short line per replaced item —
compressed and base64-encoded.  Sending the output back as ``input`` starts a new chain;
the renderer decodes the summary, so the model sees it (``actors.core.render.compaction_text``).
"""

from __future__ import annotations

import base64
import zlib

from actors.core.render import content_text, qualified_name
from actors.ids import new_id
from actors.protocol import (
    CompactionItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    item_dict,
)
from actors.protocol.wire_types import JSONObject

EXCERPT = 160  # characters kept of each replaced item


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
