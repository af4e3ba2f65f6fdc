"""Render conversation items to token ids with the model's chat format (``inference.formats``:
the emulated models' cl100k format by default, a real model's own template).

Rendering is segment-wise (every format guarantees render(a+b) == render(a) + render(b)), so a session appends the new items' tokens to the cached context instead of
re-rendering the conversation.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from inference.formats import CL100K, ChatFormat
from inference.types import Breakpoint, CacheTTL, ToolSpec

from ..protocol import (
    CALL_TYPES,
    CompactionItem,
    CustomTool,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    ItemReference,
    MessageItem,
    OutputCustomToolCall,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    ReasoningItem,
    ToolItem,
)


def content_text(content: str | Sequence[object]) -> str:
    """Plain text of message content; non-text parts render as short placeholders."""
    if isinstance(content, str):
        return content
    pieces: list[str] = []
    for part in content:
        text = getattr(part, "text", None)
        if text is None:
            text = getattr(part, "refusal", None)
        pieces.append(text if isinstance(text, str) else f"[{getattr(part, 'type', 'part')}]")
    return "\n".join(pieces)


def qualified_name(name: str | None, namespace: str | None) -> str:
    """A tool's name as the model sees it: ``namespace.name`` for a namespaced tool."""
    return f"{namespace}.{name or ''}" if namespace else name or ""


def reasoning_text(item: ReasoningItem) -> str:
    """A replayed reasoning item's visible text: its summary and ``reasoning_text`` parts."""
    parts = [*item.summary, *(item.content or ())]
    return " ".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


def tool_item_text(item: ToolItem) -> str:
    """Every field of a tool item the model reads, as canonical JSON: its ``id``, ``status``
    and ``call_id`` are left out (random per run, they would vary the scripted choices)."""
    data = item.model_dump(exclude={"type", "id", "status", "call_id"}, exclude_none=True)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def item_text(item: InputItem | OutputItem) -> str:
    """The plain text of an item, as the safety classifier reads it."""
    if isinstance(item, MessageItem):
        return content_text(item.content)
    if isinstance(item, OutputMessage):
        return "".join(p.text for p in item.content)
    if isinstance(item, (FunctionCallItem, OutputFunctionCall)):
        return item.arguments
    if isinstance(item, (CustomToolCallItem, OutputCustomToolCall)):
        return item.input
    if isinstance(item, (FunctionCallOutputItem, CustomToolCallOutputItem)):
        return content_text(item.output)
    if isinstance(item, ReasoningItem):
        return reasoning_text(item)
    if isinstance(item, CompactionItem):
        return compaction_text(item.encrypted_content)
    if isinstance(item, ToolItem):
        return tool_item_text(item)
    return ""


def render_item(item: InputItem | OutputItem, fmt: ChatFormat = CL100K) -> list[int]:
    """One item's segment in ``fmt`` (docs/protocol.md §2.2 lists what each kind renders as)."""
    if isinstance(item, MessageItem):
        return fmt.render_message(item.role, content_text(item.content))
    if isinstance(item, OutputMessage):
        return fmt.render_message("assistant", "".join(p.text for p in item.content))
    if isinstance(item, OutputFunctionCall):
        return fmt.render_function_call(item.name, item.arguments)
    if isinstance(item, FunctionCallItem):
        return fmt.render_function_call(qualified_name(item.name, item.namespace), item.arguments)
    if isinstance(item, FunctionCallOutputItem):
        if item.call_id is None:  # a tool output the client adds on its own: named, not paired
            return fmt.render_other(
                "tool_output", qualified_name(item.name, item.namespace) + "\n" + content_text(item.output)
            )
        return fmt.render_function_call_output(content_text(item.output))
    if isinstance(item, OutputCustomToolCall):
        return fmt.render_custom_tool_call(item.name, item.input)
    if isinstance(item, CustomToolCallItem):
        return fmt.render_custom_tool_call(qualified_name(item.name, item.namespace), item.input)
    if isinstance(item, CustomToolCallOutputItem):  # no call id: it would vary the scripted choices
        return fmt.render_other(
            "custom_tool_call_output",
            qualified_name(item.name, item.namespace) + "\n" + content_text(item.output),
        )
    if isinstance(item, ReasoningItem):
        return fmt.render_other("reasoning", reasoning_text(item) + (item.encrypted_content or ""))
    if isinstance(item, ToolItem):
        return fmt.render_other(item.type, tool_item_text(item))
    if isinstance(item, ItemReference):
        return fmt.render_other("item_reference", item.id)
    if isinstance(item, CompactionItem):
        return fmt.render_other("compaction", compaction_text(item.encrypted_content))
    raise TypeError(f"cannot render {type(item).__name__}")


MAX_COMPACTION_BYTES = 4 * 1024 * 1024  # a decompressed summary larger than this is not ours


def compaction_text(blob: str) -> str:
    """The summary inside a compaction item (see ``actors/core/compaction.py``); an opaque blob
    from elsewhere — or a compression bomb — is rendered as it is."""
    try:
        inflate = zlib.decompressobj()
        data = inflate.decompress(base64.b64decode(blob, validate=True), MAX_COMPACTION_BYTES)
        if inflate.unconsumed_tail or not inflate.eof:
            return blob
        return data.decode()
    except (ValueError, zlib.error, UnicodeDecodeError):
        return blob


def render_items(items: Iterable[InputItem | OutputItem], fmt: ChatFormat = CL100K) -> list[int]:
    out: list[int] = []
    for item in items:
        out.extend(render_item(item, fmt))
    return out


class MarkedTokens(NamedTuple):
    """Items rendered, with the prompt-cache breakpoints among their tokens (offsets into
    ``tokens``): each content part's ``prompt_cache_breakpoint``, at the exact end of the
    part, and (``implicit``) the start of each run of model output, where the prompt of the
    request that produced it ended (inference.emulator.breakpoint_cache)."""

    tokens: list[int]
    marks: tuple[Breakpoint, ...]


def render_marked(items: Iterable[InputItem | OutputItem], fmt: ChatFormat = CL100K) -> MarkedTokens:
    """:func:`render_items` and the breakpoints in them (:class:`MarkedTokens`)."""
    out: list[int] = []
    marks: list[Breakpoint] = []
    after_output = False
    for item in items:
        start = len(out)
        segment = render_item(item, fmt)
        out.extend(segment)
        output = is_model_output(item)
        if output and not after_output:
            marks.append(Breakpoint(start, implicit=True))
        after_output = output
        marks += [Breakpoint(start + end, ttl) for end, ttl in part_breakpoints(item, segment, fmt)]
    return MarkedTokens(out, tuple(marks))


def is_model_output(item: InputItem | OutputItem) -> bool:
    """An item a model call produces (an assistant message, a tool call, reasoning)."""
    if isinstance(item, MessageItem):
        return item.role == "assistant"
    if isinstance(item, ToolItem):
        return item.type in CALL_TYPES
    return isinstance(
        item,
        (
            FunctionCallItem,
            CustomToolCallItem,
            ReasoningItem,
            OutputMessage,
            OutputFunctionCall,
            OutputCustomToolCall,
        ),
    )


def part_breakpoints(
    item: InputItem | OutputItem, segment: Sequence[int], fmt: ChatFormat = CL100K
) -> list[tuple[int, CacheTTL | None]]:
    """The ``prompt_cache_breakpoint`` of each content part of ``item`` as an offset into its
    ``segment``: the exact end of the part (the last part's is the segment's end; an earlier
    part's, the tokens the item rendered up to that part shares with the segment)."""
    if isinstance(item, MessageItem):
        field, parts = "content", item.content
    elif isinstance(item, (FunctionCallOutputItem, CustomToolCallOutputItem)):
        field, parts = "output", item.output
    else:
        return []
    if isinstance(parts, str):
        return []
    out: list[tuple[int, CacheTTL | None]] = []
    for k, part in enumerate(parts):
        mark = getattr(part, "prompt_cache_breakpoint", None)
        if mark is None:
            continue
        if k == len(parts) - 1:
            end = len(segment)
        else:
            head = render_item(item.model_copy(update={field: parts[: k + 1]}), fmt)
            end = next(
                (i for i, (a, b) in enumerate(zip(head, segment, strict=False)) if a != b),
                min(len(head), len(segment)),
            )
        out.append((end, mark.ttl))
    return out


def tool_specs(tools: Iterable[FunctionTool | CustomTool]) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(name=t.name, parameters=t.parameters or {})
        if isinstance(t, FunctionTool)
        else ToolSpec(name=t.name, custom=True)
        for t in tools
    )
