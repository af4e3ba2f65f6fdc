"""Conversation items: the input items a request may carry, the output items a response
produces, and the conversions between them and their stored form (docs/protocol.md §2)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter

from .wire_types import JSONObject

# --------------------------------------------------------------------------- input items


class StrictInbound(BaseModel):
    """Inbound objects whose every key is known: an extra key is refused."""

    model_config = ConfigDict(strict=True, extra="forbid")


class OpenInbound(BaseModel):
    """Inbound objects whose extra keys we accept and echo (hosted tools, file parts…)."""

    model_config = ConfigDict(strict=True, extra="allow")


class PromptCacheBreakpoint(StrictInbound):
    """``prompt_cache_breakpoint`` on an ``input_text``, ``input_image`` or ``input_file``
    part: "marks the exact end of a reusable prompt prefix"; ``ttl`` (the minimum lifetime)
    defaults to the request's ``prompt_cache_options.ttl`` (the openai SDK's
    ``PromptCacheBreakpoint``; docs/protocol.md §2.2)."""

    mode: Literal["explicit"]
    ttl: Literal["30m", "12h"] | None = None


# Listed and stored only when sent: a part without one keeps the keys it always had.
CacheBreakpoint = Annotated[PromptCacheBreakpoint | None, Field(default=None, exclude_if=lambda v: v is None)]


class InputText(StrictInbound):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: CacheBreakpoint = None


class OutputTextIn(OpenInbound):
    type: Literal["output_text"]
    text: str
    annotations: list[JSONObject] = []  # required on output_text parts by both schemas


class Refusal(OpenInbound):
    type: Literal["refusal"]
    refusal: str


class InputImage(OpenInbound):
    type: Literal["input_image"]
    detail: Literal["low", "high", "auto", "original"] = "auto"
    image_url: str | None = None
    file_id: str | None = None
    prompt_cache_breakpoint: CacheBreakpoint = None


class InputFile(OpenInbound):
    type: Literal["input_file"]
    prompt_cache_breakpoint: CacheBreakpoint = None


class InputAudio(OpenInbound):
    type: Literal["input_audio"]


ContentPart = Annotated[
    InputText | OutputTextIn | Refusal | InputImage | InputFile | InputAudio, Field(discriminator="type")
]


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class MessageItem(StrictInbound):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    @property
    def parts(self) -> list[ContentPart]:
        """``content`` as parts: a string is one ``output_text`` part on an assistant
        message (what the model wrote) and one ``input_text`` part otherwise."""
        if not isinstance(self.content, str):
            return list(self.content)
        if self.role == "assistant":
            return [OutputTextIn(type="output_text", text=self.content)]
        return [InputText(type="input_text", text=self.content)]


class FunctionCallItem(StrictInbound):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = None
    caller: JSONObject | None = None  # who issued the call ("direct", or a program item)


class FunctionCallOutputItem(StrictInbound):
    """A tool's result.  ``call_id`` answers a call the conversation issued; without one
    the item is a tool output the client adds to the context on its own (Codex sends its
    goal objective so: ``name`` ``goal_objective``, ``namespace`` ``agent``)."""

    type: Literal["function_call_output"]
    output: str | list[ContentPart]
    call_id: str | None = None
    id: str | None = None
    status: ItemStatus | None = None
    name: str | None = None
    namespace: str | None = None
    caller: JSONObject | None = None


class CustomToolCallItem(StrictInbound):
    """A call of a ``custom`` (freeform) tool: its ``input`` is free text, e.g. Codex's
    ``apply_patch`` patch."""

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = None
    caller: JSONObject | None = None


class CustomToolCallOutputItem(StrictInbound):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None
    name: str | None = None
    namespace: str | None = None
    caller: JSONObject | None = None


class ReasoningItem(OpenInbound):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[JSONObject] = []
    content: list[JSONObject] | None = None  # ``reasoning_text`` parts
    encrypted_content: str | None = None


class ItemReference(StrictInbound):
    """``{"type": "item_reference", "id"}``; the SDK lets ``type`` be omitted (``{"id"}``)."""

    type: Literal["item_reference"] = "item_reference"
    id: str


class CompactionItem(OpenInbound):
    """The opaque summary ``POST /v1/responses/compact`` returns, sent back as input."""

    type: Literal["compaction"]
    encrypted_content: str
    id: str | None = None


# Tool calls and outputs of tools the emulated model never calls itself (hosted tools,
# Codex's local shell, tool search…), and context items of those tools: kept and rendered
# as sent (docs/protocol.md §2.2).  Calls issue their ``call_id``; outputs answer one.
CALL_TYPES = (
    "local_shell_call",
    "shell_call",
    "apply_patch_call",
    "computer_call",
    "tool_search_call",
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "program",
)
OUTPUT_TYPES = (
    "local_shell_call_output",
    "shell_call_output",
    "apply_patch_call_output",
    "computer_call_output",
    "tool_search_output",
    "mcp_approval_response",
    "program_output",
)
CONTEXT_TYPES = ("additional_tools", "configuration_update", "compaction_trigger")


class ToolItem(OpenInbound):
    """One of :data:`CALL_TYPES`, :data:`OUTPUT_TYPES` or :data:`CONTEXT_TYPES`: every key
    kept and echoed; ``call_id`` (and the type) must be strings where given."""

    type: Literal[CALL_TYPES + OUTPUT_TYPES + CONTEXT_TYPES]  # type: ignore[valid-type]  # built from the tuples above; mypy needs literal strings
    id: str | None = None
    call_id: str | None = None
    status: str | None = None


def _item_tag(value: Any) -> str:
    if isinstance(value, dict) and "type" not in value and "role" not in value and "id" in value:
        return "item_reference"
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    if not isinstance(kind, str):
        return "unknown"
    if kind in _TOOL_ITEM_TYPES:
        return "tool_item"
    return kind if kind in ITEM_TAGS else "unknown"


_TOOL_ITEM_TYPES = frozenset(CALL_TYPES + OUTPUT_TYPES + CONTEXT_TYPES)
ITEM_TAGS = {  # the input item types a union picks by "type" (else "unknown")
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
    "item_reference",
    "compaction",
    "tool_item",
}

InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[ItemReference, Tag("item_reference")]
    | Annotated[CompactionItem, Tag("compaction")]
    | Annotated[ToolItem, Tag("tool_item")],
    Discriminator(
        _item_tag, custom_error_type="invalid_value", custom_error_message="Unsupported input item type."
    ),
]


# --------------------------------------------------------------------------- output items


class Outbound(BaseModel):
    """What the server sends: every key declared."""

    model_config = ConfigDict(extra="forbid")


class OutputText(Outbound):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(Outbound):
    id: str
    type: Literal["message"] = "message"
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = []


class OutputFunctionCall(Outbound):
    id: str
    type: Literal["function_call"] = "function_call"
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    call_id: str
    name: str
    arguments: str = ""


class OutputCustomToolCall(Outbound):
    """The model's call of a ``custom`` (freeform) tool: free-text ``input``."""

    id: str
    type: Literal["custom_tool_call"] = "custom_tool_call"
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    call_id: str
    name: str
    input: str = ""


class OutputCompaction(Outbound):
    """Server-side compaction (``context_management``): the summary of the conversation the
    response compacted before its model ran (docs/protocol.md §4.12).  Sent back as input,
    it is a :class:`CompactionItem`."""

    id: str
    type: Literal["compaction"] = "compaction"
    encrypted_content: str


OutputItem = OutputMessage | OutputFunctionCall | OutputCustomToolCall | OutputCompaction


ITEM_ADAPTER: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem])


# --------------------------------------------------------------------------- stored items


def item_dict(item: InputItem, item_id: str) -> JSONObject:
    """An input item as stored and listed by ``input_items`` (docs/protocol.md §6.6): with
    an ``id`` and a ``status``, ``None`` fields dropped, content as complete parts.

    Listed items must read as the SDK's ``ResponseItem`` and as an Open Responses item: a
    message's content is always a list of parts (an assistant's string becomes an
    ``output_text`` part with its ``annotations``), and every part keeps all its keys
    (an ``input_image`` without ``image_url`` still lists ``"image_url": null``).  An
    ``item_reference`` points at another item and is kept as sent."""
    if isinstance(item, ItemReference):
        return item.model_dump()
    data = item.model_dump(exclude_none=True)
    data.setdefault("id", item_id)
    data.setdefault("status", "completed")
    if isinstance(item, MessageItem):
        data["type"] = "message"
        data["content"] = [part.model_dump() for part in item.parts]
    elif isinstance(item, (FunctionCallOutputItem, CustomToolCallOutputItem)) and not isinstance(
        item.output, str
    ):
        data["output"] = [part.model_dump() for part in item.output]
    return data


def issued_call_id(item: InputItem | OutputItem) -> str | None:
    """The call id a tool-call item, input or output, issues (``None`` for anything else)."""
    if isinstance(item, (FunctionCallItem, CustomToolCallItem, OutputFunctionCall, OutputCustomToolCall)):
        return item.call_id
    if isinstance(item, ToolItem) and item.type in CALL_TYPES:
        return item.call_id
    return None


def answered_call_id(item: InputItem) -> str | None:
    """The call id a function or custom tool output answers, which the conversation must
    have issued (``None``: nothing to check — a context output without ``call_id``, or an
    output of a tool the model never calls, which is kept as sent)."""
    if isinstance(item, (FunctionCallOutputItem, CustomToolCallOutputItem)):
        return item.call_id
    return None


def is_tool_result(item: InputItem | OutputItem) -> bool:
    """A tool's answer to a call, counted against ``tool_rounds`` (docs/emulator.md)."""
    if isinstance(item, (FunctionCallOutputItem, CustomToolCallOutputItem)):
        return item.call_id is not None
    return isinstance(item, ToolItem) and item.type in OUTPUT_TYPES


def output_as_input(item: OutputItem) -> JSONObject:
    """An output item in the form a later request may send it back as input."""
    if isinstance(item, OutputMessage):
        return {
            "type": "message",
            "id": item.id,
            "role": "assistant",
            "status": item.status,
            "content": [{"type": "output_text", "text": p.text, "annotations": []} for p in item.content],
        }
    if isinstance(item, (OutputCustomToolCall, OutputCompaction)):
        return item.model_dump()
    return {
        "type": "function_call",
        "id": item.id,
        "call_id": item.call_id,
        "name": item.name,
        "arguments": item.arguments,
        "status": item.status,
    }


def parse_items(data: list[JSONObject]) -> list[InputItem]:
    """Stored item dicts back to input-item models (strict: the store holds what we wrote)."""
    return ITEM_ADAPTER.validate_python(data)
