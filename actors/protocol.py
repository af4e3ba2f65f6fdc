"""The wire protocol: every client and server event as a pydantic model.

Spec: ``shared/spec/responses-websocket.md`` §2 (client events), §3 (server events), §5 (errors).
One parse function (:func:`parse_client_event`) and one encode function (:func:`encode`);
nothing else in the project branches on ``"type"`` strings.  Inbound parsing is strict about
types (no coercion); outbound field names copy the openai SDK 3.57 types.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
)
from pydantic_core import PydanticCustomError, from_json

from .errors import (
    APIError,
    InvalidJSON,
    InvalidRequest,
    InvalidStreamId,
    ServerError,
    UnknownEventType,
)

# --------------------------------------------------------------------------- inbound


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


class FunctionTool(_Open):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class OtherTool(_Open):
    """Hosted or unknown tool types (``web_search``, ``namespace``…): accepted, echoed, never called."""

    type: str


def _tool_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "function" if kind == "function" else "other"


Tool = Annotated[
    Union[Annotated[FunctionTool, Tag("function")], Annotated[OtherTool, Tag("other")]],
    Discriminator(_tool_tag),
]

_STREAM_ID = re.compile(r"[A-Za-z0-9_.\-]{1,256}")

# Bounds OpenAI documents for these fields; they also keep every echoed value encodable.
Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
TopP = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Metadata = Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                     Field(max_length=16)]
TOOL_CHOICE_MODES = ("none", "auto", "required")


class ResponseCreate(BaseModel):
    """``response.create`` (flat body, spec §2.1).  Unknown top-level fields are kept in
    ``model_extra``; the session rejects them only in strict mode."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: Literal["response.create"] = "response.create"
    model: str | None = None
    input: Union[str, list[InputItem]] = []
    previous_response_id: str | None = None
    store: bool | None = None
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Union[str, dict[str, Any]] | None = None
    parallel_tool_calls: bool | None = None
    stream_id: Any = None  # validated by hand: a bad one has its own error code
    generate: bool | None = None
    background: bool | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tool_calls: Annotated[int, Field(ge=0)] | None = None
    metadata: Metadata | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    client_metadata: dict[str, Any] | None = None
    context_management: list[dict[str, Any]] | None = None
    conversation: Union[str, dict[str, Any]] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    @field_validator("tool_choice")
    @classmethod
    def _known_tool_choice(cls, choice: Any, info: ValidationInfo) -> Any:
        """A mode, or an object naming one of the request's function tools: the model can
        call nothing else."""
        if isinstance(choice, str):
            if choice not in TOOL_CHOICE_MODES:
                raise PydanticCustomError("invalid_value", "expected 'none', 'auto' or 'required'")
            return choice
        if choice is None:
            return choice
        if not isinstance(choice.get("type"), str):
            raise PydanticCustomError("invalid_value", "a tool_choice object needs a string 'type'")
        if "mode" in choice and choice["mode"] not in TOOL_CHOICE_MODES:
            raise PydanticCustomError("invalid_value", "'mode' must be 'none', 'auto' or 'required'")
        name = choice.get("name")
        if name is not None or choice["type"] == "function":
            functions = {t.name for t in info.data.get("tools") or () if isinstance(t, FunctionTool)}
            if not isinstance(name, str) or name not in functions:
                raise PydanticCustomError("invalid_value", "tool_choice names a function that is not among the tools")
        return choice

    @property
    def items(self) -> list[InputItem]:
        """``input`` as a list of items (a string is one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    @property
    def function_tools(self) -> list[FunctionTool]:
        return [t for t in self.tools or () if isinstance(t, FunctionTool)]


class ResponseSteer(_Open):
    type: Literal["response.steer"]
    previous_response_id: Any = None
    input: Any = None


class ResponseProcessed(_Open):
    """Codex sends this after each response; it carries nothing we need (spec §2.4)."""

    type: Literal["response.processed"]


class ResponseAppend(_In):
    """Append-mode rollouts only (opt-in, docs/append-mode.md): tool results for a response
    paused on its function calls; sampling resumes in the same response."""

    type: Literal["response.append"]
    response_id: str
    input: list[InputItem]


ClientEvent = Union[ResponseCreate, ResponseSteer, ResponseProcessed, ResponseAppend]
_CLIENT_EVENT: TypeAdapter[ClientEvent] = TypeAdapter(
    Annotated[ClientEvent, Field(discriminator="type")]
)


def load_json_object(data: str | bytes) -> dict[str, Any]:
    """A frame or request body that must be one JSON object; typed 400 errors otherwise.

    The parser refuses what could not be sent back: lone surrogates (``"\\ud800"``),
    ``NaN``/``Infinity`` and nesting deeper than about 200 levels (echoed fields such as
    ``tools`` or ``metadata`` must still encode as JSON)."""
    try:
        raw = from_json(data, allow_inf_nan=False)
    except ValueError as exc:
        deep = "recursion limit" in str(exc)
        raise InvalidJSON("The message is nested too deeply." if deep else "The message is not valid JSON.") from None
    if not isinstance(raw, dict):
        raise InvalidRequest("The message must be a JSON object.", code="invalid_type")
    return raw


def parse_client_event(data: str | bytes) -> ClientEvent:
    """Parse one client frame.  Raises a typed :class:`APIError` (400) on any problem.

    A nested ``{"type":"response.create","response":{…}}`` body is accepted as well (spec §1.3).
    """
    raw = load_json_object(data)
    if isinstance(raw.get("response"), dict) and "input" not in raw:
        raw = {**raw.pop("response"), **raw}  # nested create form
    try:
        event = _CLIENT_EVENT.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            raise UnknownEventType(f"Unsupported event type {raw.get('type')!r}.", param="type") from None
        raise _validation_error(exc) from None
    if isinstance(event, ResponseCreate) and event.stream_id is not None:
        if not isinstance(event.stream_id, str) or not _STREAM_ID.fullmatch(event.stream_id):
            raise InvalidStreamId()
    return event


_WS_ONLY = ("stream_id", "generate")


def parse_http_create(data: bytes | str) -> ResponseCreate:
    """The body of ``POST /v1/responses`` (spec §6.1): the create fields without ``type``;
    the WebSocket-only ``stream_id`` and ``generate`` are rejected."""
    raw = load_json_object(data)
    for name in _WS_ONLY:
        if name in raw:
            raise InvalidRequest(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
    raw.pop("type", None)
    try:
        return ResponseCreate.model_validate(raw)
    except ValidationError as exc:
        raise _validation_error(exc, tagged=False) from None


def _validation_error(exc: ValidationError, *, tagged: bool = True) -> APIError:
    # The deepest error is the most specific one (a bad item beats "input is not a string").
    err = max(exc.errors(include_url=False), key=lambda e: len(e["loc"]))
    param = _param_path(err["loc"][1:] if tagged else err["loc"])
    kind = err["type"]
    if kind == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'.", param=param,
                              code="missing_required_parameter")
    if kind == "extra_forbidden":
        return InvalidRequest(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")
    if kind.endswith("_type"):
        return InvalidRequest(f"Invalid type for '{param}': {err['msg']}.", param=param,
                              code="invalid_type")
    return InvalidRequest(f"Invalid value for '{param}': {err['msg']}.", param=param)


def _param_path(loc: tuple[Any, ...]) -> str:
    """``('input', 'list[…]', 0, 'message', 'role')`` → ``input[0].role``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _UNION_LABELS or "[" in part:
            continue  # union branch labels, not field names
        else:
            out += f".{part}" if out else part
    return out


_UNION_LABELS = _ITEM_TAGS | {"str", "function", "other", "dict[str,any]", "bool", "int", "float"}


# --------------------------------------------------------------------------- outbound


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


class InputTokensDetails(_Out):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(_Out):
    reasoning_tokens: int = 0


class Usage(_Out):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


# ``response.error.code`` values the SDK accepts (spec §5.3); anything else is server_error.
RESPONSE_ERROR_CODES = frozenset({"server_error", "rate_limit_exceeded", "invalid_prompt", "vector_store_timeout"})


class ResponseErrorBody(_Out):
    code: str
    message: str


class IncompleteDetails(_Out):
    reason: Literal["max_output_tokens", "max_messages", "content_filter", "steered"]


class ResponseObject(_Out):
    """The full Response (spec §3.4): every key is always present, null when unknown."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed", "cancelled", "queued"]
    completed_at: int | None = None
    error: ResponseErrorBody | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[OutputItem] = []
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    temperature: float | None = None
    text: dict[str, Any] = {"format": {"type": "text"}}
    tool_choice: Union[str, dict[str, Any]] = "auto"
    tools: list[dict[str, Any]] = []
    top_p: float | None = None
    truncation: str = "disabled"
    usage: Usage | None = None
    user: str | None = None
    metadata: dict[str, str] = {}
    background: bool = False
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class _Event(_Out):
    """Base of server events: ``stream_id`` is present iff the create had one (spec §3.1)."""

    stream_id: str | None = None

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for key in ("stream_id", "sequence_number"):
            if key in data and data[key] is None:
                del data[key]
        return data


class ResponseCreated(_Event):
    type: Literal["response.created"] = "response.created"
    sequence_number: int
    response: ResponseObject


class ResponseInProgress(_Event):
    type: Literal["response.in_progress"] = "response.in_progress"
    sequence_number: int
    response: ResponseObject


class ResponseCompleted(_Event):
    type: Literal["response.completed"] = "response.completed"
    sequence_number: int
    response: ResponseObject


class ResponseIncomplete(_Event):
    type: Literal["response.incomplete"] = "response.incomplete"
    sequence_number: int
    response: ResponseObject


class ResponseFailed(_Event):
    type: Literal["response.failed"] = "response.failed"
    sequence_number: int
    response: ResponseObject


class OutputItemAdded(_Event):
    type: Literal["response.output_item.added"] = "response.output_item.added"
    sequence_number: int
    output_index: int
    item: OutputItem


class OutputItemDone(_Event):
    type: Literal["response.output_item.done"] = "response.output_item.done"
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartAdded(_Event):
    type: Literal["response.content_part.added"] = "response.content_part.added"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class ContentPartDone(_Event):
    type: Literal["response.content_part.done"] = "response.content_part.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class OutputTextDelta(_Event):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = []


class OutputTextDone(_Event):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = []


class FunctionCallArgumentsDelta(_Event):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDone(_Event):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorDetail(_Out):
    type: str
    code: str | None
    message: str
    param: str | None


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    status: int
    error: ErrorDetail
    sequence_number: int | None = None


class SteerFailedError(_Out):
    type: Literal["invalid_request_error"] = "invalid_request_error"
    code: str
    message: str


class SteerFailed(_Event):
    type: Literal["response.steer.failed"] = "response.steer.failed"
    sequence_number: int = 0
    error: SteerFailedError
    steer: dict[str, Any]


class SteerRef(_Out):
    id: str
    previous_response_id: str


class SteerAccepted(_Event):
    type: Literal["response.steer.accepted"] = "response.steer.accepted"
    sequence_number: int
    steer: SteerRef


class RequiredInput(_Out):
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    name: str


class SteerPending(_Event):
    type: Literal["response.steer.pending"] = "response.steer.pending"
    sequence_number: int
    reason: Literal["waiting_for_required_input"] = "waiting_for_required_input"
    required_input: list[RequiredInput]
    steer: SteerRef


ServerEvent = Union[
    ResponseCreated, ResponseInProgress, ResponseCompleted, ResponseIncomplete, ResponseFailed,
    OutputItemAdded, OutputItemDone, ContentPartAdded, ContentPartDone, OutputTextDelta,
    OutputTextDone, FunctionCallArgumentsDelta, FunctionCallArgumentsDone, ErrorEvent, SteerFailed,
    SteerAccepted, SteerPending,
]


def encode(event: ServerEvent) -> str:
    """The one encode function: a server event as the JSON text of one frame."""
    return event.model_dump_json()


def error_event(
    exc: BaseException, *, stream_id: str | None = None, sequence_number: int | None = None
) -> ErrorEvent:
    """The one place errors become wire events (spec §5.1).  Unknown exceptions become
    ``server_error`` and their text is never sent."""
    err = exc if isinstance(exc, APIError) else ServerError()
    return ErrorEvent(
        status=err.status,
        stream_id=stream_id,
        sequence_number=sequence_number,
        error=ErrorDetail(type=err.type, code=err.code, message=err.message, param=err.param),
    )


def http_error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The same errors as an HTTP status and OpenAI JSON error body (spec §6.2)."""
    err = exc if isinstance(exc, APIError) else ServerError()
    return err.status, {
        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    }


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
