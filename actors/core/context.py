"""A conversation's state after a response: what a lane caches and what the store keeps.

``extend`` is the incremental path (a cached parent plus only the new items' tokens);
``from_record`` is the stateless path: rebuild the whole conversation from a stored record,
re-render and re-tokenise all of it — the work an HTTP server must redo on every request.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inference.formats import CL100K, ChatFormat
from inference.types import Breakpoint
from store import StoredResponse

from ..ids import new_id
from ..protocol import (
    CALL_TYPES,
    CompactionItem,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    ItemReference,
    MessageItem,
    OutputCompaction,
    OutputItem,
    ReasoningItem,
    ToolItem,
    is_tool_result,
    issued_call_id,
    item_dict,
    output_as_input,
    parse_items,
)
from ..protocol.wire_types import JSONObject
from .render import item_text, render_items, render_marked
from .safety import Classifier
from .timings import PhaseTimer


@dataclass(slots=True)
class ContextEntry:
    """The conversation after response ``response_id`` (docs/protocol.md §4.2)."""

    response_id: str
    tokens: array[int]  # rendered conversation (items only; tools/instructions are per request)
    items: list[JSONObject]  # the same conversation as stored items
    call_ids: frozenset[str]  # function calls issued anywhere in the conversation
    tool_results: int  # function_call_output items in the conversation
    store: bool
    scan: Classifier  # the safety classifier's state after the whole conversation
    # Tokens at the end of the conversation no model call has read yet: the latest output
    # (in a rollout, with the tool results appended since), or all of them when rebuilt from
    # a record (actors.backend.ModelCall).
    fresh_tokens: int = 0
    fmt: str = CL100K.name  # the chat format ``tokens`` are in (inference.formats)
    # The inference replica that served ``response_id`` ("" unknown): the next call's hint
    # (``InferenceRequest.replica_hint``), kept in a resumable connection's state.
    replica: str = ""
    # The prompt-cache breakpoints in ``tokens`` (``render.MarkedTokens.marks``): the same
    # whether the conversation was continued here or rebuilt from its items.
    marks: tuple[Breakpoint, ...] = ()


def ends_in_output(items: Sequence[JSONObject]) -> bool:
    """Whether stored ``items`` end with a model's output (``render.is_model_output``)."""
    if not items:
        return False
    last = items[-1]
    kind = last.get("type", "message")
    if kind == "message":
        return last.get("role") == "assistant"
    return kind in ("function_call", "custom_tool_call", "reasoning", *CALL_TYPES)


def join_marks(
    parent: ContextEntry | None, marks: Sequence[Breakpoint], new_items: Sequence[JSONObject] = ()
) -> tuple[Breakpoint, ...]:
    """``parent``'s marks and ``marks`` of what follows it (offsets from its end), as
    :func:`render.render_marked` marks the whole conversation: a run of output that
    continues the parent's last output is one run."""
    if parent is None:
        return tuple(marks)
    base = len(parent.tokens)
    cont = ends_in_output(parent.items)
    return parent.marks + tuple(
        Breakpoint(base + m.offset, m.ttl, m.implicit)
        for m in marks
        if not (cont and m.implicit and m.offset == 0)
    )


def prompt_breakpoints(
    prefix_len: int, parent: ContextEntry | None, input_marks: Sequence[Breakpoint]
) -> tuple[Breakpoint, ...]:
    """The breakpoints of a prompt made of ``prefix_len`` tokens (tools, instructions), the
    parent's conversation and the input (``input_marks``), as prompt offsets."""
    return _shifted(join_marks(parent, input_marks), prefix_len)


def _shifted(marks: Sequence[Breakpoint], by: int) -> tuple[Breakpoint, ...]:
    return tuple(Breakpoint(by + m.offset, m.ttl, m.implicit) for m in marks)


class PromptMarks:
    """:func:`prompt_breakpoints` for one connection's turns, the last answer kept: a
    conversation's marks only grow at its end, so a turn's prompt offsets are the previous
    turn's and those of the marks added since — a tuple compare and concatenation (C) instead
    of a new breakpoint for every mark of the conversation each turn (a hundred-turn
    conversation has hundreds).  Any other case is computed whole.  Not thread-safe."""

    __slots__ = ("_joined", "_out", "_prefix")

    def __init__(self) -> None:
        self._joined: tuple[Breakpoint, ...] = ()
        self._prefix = -1
        self._out: tuple[Breakpoint, ...] = ()

    def __call__(
        self, prefix_len: int, parent: ContextEntry | None, input_marks: Sequence[Breakpoint]
    ) -> tuple[Breakpoint, ...]:
        joined = join_marks(parent, input_marks)
        known = len(self._joined)
        if prefix_len == self._prefix and known <= len(joined) and joined[:known] == self._joined:
            out = self._out + _shifted(joined[known:], prefix_len)  # the shared ones compare by identity
        else:
            out = _shifted(joined, prefix_len)
        self._joined, self._prefix, self._out = joined, prefix_len, out
        return out


def item_id(item: InputItem) -> str:
    """A fresh id for an input item the client sent without one."""
    if isinstance(item, MessageItem):
        return new_id("msg")
    if isinstance(item, FunctionCallItem):
        return new_id("fc")
    if isinstance(item, FunctionCallOutputItem):
        return new_id("fco")
    if isinstance(item, ReasoningItem):
        return new_id("rs")
    if isinstance(item, CompactionItem):
        return new_id("cmp")
    if isinstance(item, CustomToolCallItem):
        return new_id("ctc")
    if isinstance(item, CustomToolCallOutputItem):
        return new_id("ctco")
    if isinstance(item, ToolItem):
        return new_id("item")
    assert isinstance(item, ItemReference)
    return item.id


def input_dicts(items: Sequence[InputItem]) -> list[JSONObject]:
    return [item_dict(item, item_id(item)) for item in items]


def count_calls(items: Sequence[InputItem | OutputItem], call_ids: set[str]) -> int:
    """Add the call ids the items issue to ``call_ids``; return how many tool results they hold."""
    results = 0
    for item in items:
        issued = issued_call_id(item)
        if issued is not None:
            call_ids.add(issued)
        elif is_tool_result(item):
            results += 1
    return results


def extend(
    parent: ContextEntry | None,
    response_id: str,
    *,
    input_tokens: Sequence[int],
    inputs: list[JSONObject],
    output: Sequence[OutputItem],
    call_ids: frozenset[str],
    tool_results: int,
    store: bool,
    scan: Classifier,
    fmt: ChatFormat = CL100K,
    output_tokens: Sequence[int] | None = None,
    input_marks: Sequence[Breakpoint] = (),
) -> ContextEntry:
    """The parent's conversation plus one turn's input and output: only new items are
    rendered, in ``fmt``; ``scan`` (which has read the input already) reads the output.
    ``output_tokens``: the output as the engine produced it (a real model's continuation,
    ``inference.chat_template``), appended as it is instead of rendering ``output``.
    ``input_marks``: the breakpoints in ``input_tokens`` (``render.render_marked``); the
    output's start is one (an implicit breakpoint: the end of the prompt that made it)."""
    # A compaction item is already in the conversation the response ran on (its parent,
    # actors.core.compaction): the rest of the output joins it.
    output = [o for o in output if not isinstance(o, OutputCompaction)]
    tokens = array("I", parent.tokens) if parent else array("I")
    tokens.extend(input_tokens)
    marks = list(input_marks)
    # Whether the conversation so far ends in output: its last item (not a copy of them all).
    if output and not ends_in_output(inputs or (parent.items if parent else [])):
        marks.append(Breakpoint(len(input_tokens), implicit=True))
    joined = join_marks(parent, marks)
    if output_tokens is None:
        output_tokens = render_items(output, fmt)
    tokens.extend(output_tokens)
    issued = set(call_ids)
    count_calls(output, issued)
    items = (parent.items if parent else []) + inputs + [output_as_input(o) for o in output]
    scan.read_later(item_text(o) for o in output)
    return ContextEntry(
        response_id,
        tokens,
        items,
        frozenset(issued),
        tool_results,
        store,
        scan,
        fresh_tokens=len(output_tokens),
        fmt=fmt.name,
        marks=joined,
    )


def from_record(
    record: StoredResponse, new_scan: Callable[[], Classifier], timer: PhaseTimer, fmt: ChatFormat = CL100K
) -> ContextEntry:
    """Rebuild a conversation from the store the stateless way: parse and validate, re-render
    (in ``fmt``) and re-tokenise, and re-classify every item (each step timed)."""
    with timer.phase("parse_validate"):
        items = parse_items(record.context)
        issued: set[str] = set()
        results = count_calls(items, issued)
    with timer.phase("render"):
        rendered = render_marked(items, fmt)
        tokens = array("I", rendered.tokens)
    with timer.phase("classify"):
        scan = new_scan()
        scan.feed_all(item_text(item) for item in items)
    return ContextEntry(
        record.id,
        tokens,
        record.context,
        frozenset(issued),
        results,
        True,
        scan,
        fresh_tokens=len(tokens),
        fmt=fmt.name,
        marks=rendered.marks,
    )


def in_format(entry: ContextEntry, fmt: ChatFormat) -> ContextEntry:
    """``entry`` with its tokens in ``fmt``: itself, or — continued by a model of another
    format — its items re-rendered (the model's own ids of earlier output are then lost)."""
    if entry.fmt == fmt.name:
        return entry
    rendered = render_marked(parse_items(entry.items), fmt)
    tokens = array("I", rendered.tokens)
    return ContextEntry(
        entry.response_id,
        tokens,
        entry.items,
        entry.call_ids,
        entry.tool_results,
        entry.store,
        entry.scan,
        fresh_tokens=len(tokens),
        fmt=fmt.name,
        marks=rendered.marks,
    )
