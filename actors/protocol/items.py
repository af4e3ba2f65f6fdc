"""Conversation items: the input items a request may carry, the output items a response
produces, and the conversions between them and their stored form (docs/protocol.md §2)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter

# --------------------------------------------------------------------------- input items

class _In(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class _Open(BaseModel):
    """Inbound objects whose extra keys we accept and echo (hosted tools, file parts…)."""

    model_config = ConfigDict(strict=True, extra="allow")


class InputText(_In):
    type: Literal["input_text"]
    text: str


class OutputTextIn(_Open):
    type: Literal["output_text"]
    text: str


class Refusal(_Open):
    type: Literal["refusal"]
    refusal: str


class InputImage(_Open):
    type: Literal["input_image"]


class InputFile(_Open):
    type: Literal["input_file"]


ContentPart = Annotated[
    Union[InputText, OutputTextIn, Refusal, InputImage, InputFile], Field(discriminator="type")
]


class MessageItem(_In):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[str, list[ContentPart]]
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class FunctionCallItem(_In):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None
    namespace: str | None = None


class FunctionCallOutputItem(_In):
    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, list[ContentPart]]
    id: str | None = None
    status: str | None = None


class ReasoningItem(_Open):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = []
    encrypted_content: str | None = None


class ItemReference(_In):
    type: Literal["item_reference"]
    id: str


class CompactionItem(_Open):
    """The opaque summary ``POST /v1/responses/compact`` returns, sent back as input."""

    type: Literal["compaction"]
    encrypted_content: str
    id: str | None = None


def _item_tag(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) and kind in _ITEM_TAGS else "unknown"


_ITEM_TAGS = {"message", "function_call", "function_call_output", "reasoning", "item_reference", "compaction"}

InputItem = Annotated[
    Union[
        Annotated[MessageItem, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
        Annotated[ReasoningItem, Tag("reasoning")],
        Annotated[ItemReference, Tag("item_reference")],
        Annotated[CompactionItem, Tag("compaction")],
    ],
    Discriminator(_item_tag, custom_error_type="invalid_value",
                  custom_error_message="Unsupported input item type."),
]


# --------------------------------------------------------------------------- output items


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OutputText(_Out):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(_Out):
    id: str
    type: Literal["message"] = "message"
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = []


class OutputFunctionCall(_Out):
    id: str
    type: Literal["function_call"] = "function_call"
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    call_id: str
    name: str
    arguments: str = ""


OutputItem = Union[OutputMessage, OutputFunctionCall]


ITEM_ADAPTER: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem])


# --------------------------------------------------------------------------- stored items


def item_dict(item: InputItem, item_id: str) -> dict[str, Any]:
    """An input item as stored and listed by ``input_items`` (spec §6.6): with an ``id`` and
    a ``status``, ``None`` fields dropped."""
    data = item.model_dump(exclude_none=True)
    data.setdefault("id", item_id)
    data.setdefault("status", "completed")
    if isinstance(item, MessageItem):
        data["type"] = "message"
        if isinstance(item.content, str):  # listed as parts, as the API does
            kind = "output_text" if item.role == "assistant" else "input_text"
            data["content"] = [{"type": kind, "text": item.content}]
    return data


def output_as_input(item: OutputItem) -> dict[str, Any]:
    """An output item in the form a later request may send it back as input."""
    if isinstance(item, OutputMessage):
        return {"type": "message", "id": item.id, "role": "assistant", "status": item.status,
                "content": [{"type": "output_text", "text": p.text, "annotations": []} for p in item.content]}
    return {"type": "function_call", "id": item.id, "call_id": item.call_id, "name": item.name,
            "arguments": item.arguments, "status": item.status}


def parse_items(data: list[dict[str, Any]]) -> list[InputItem]:
    """Stored item dicts back to input-item models (strict: the store holds what we wrote)."""
    return ITEM_ADAPTER.validate_python(data)

