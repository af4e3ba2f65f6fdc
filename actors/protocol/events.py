"""Outbound: the Response object, every server event, and the one encode function
(docs/protocol.md §3, §5).  Field names copy the openai SDK's types.

Over 400 lines on purpose: every server event of the wire is here, a small class each, beside
the one encode point, so the outbound wire reads as one list."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, FieldSerializationInfo, SerializerFunctionWrapHandler, field_serializer

from ..errors import APIError, ServerError
from .echoes import PROCESS_ECHOES, EchoJSON
from .items import Outbound, OutputItem, OutputText
from .requests import ReasoningConfig, TextConfig
from .wire_types import JSONObject


class CacheWriteTokensDetails(Outbound):
    """The tokens written to the prompt cache by lifetime (the SDK's
    ``InputTokensDetailsCacheWriteTokensDetails``)."""

    ttl_30m_tokens: int = 0
    ttl_12h_tokens: int = 0


class InputTokensDetails(Outbound):
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    # Under the breakpoint rule only (docs/emulator.md); left out otherwise, as the SDK allows.
    cache_write_tokens_details: CacheWriteTokensDetails | None = Field(None, exclude_if=lambda v: v is None)


class OutputTokensDetails(Outbound):
    reasoning_tokens: int = 0


class Usage(Outbound):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


# ``response.error.code`` values the SDK accepts (docs/protocol.md §5.3); anything else is server_error.
RESPONSE_ERROR_CODES = frozenset(
    {"server_error", "rate_limit_exceeded", "invalid_prompt", "vector_store_timeout"}
)


class ResponseErrorBody(Outbound):
    code: str
    message: str


class IncompleteDetails(Outbound):
    reason: Literal["max_output_tokens", "max_messages", "content_filter", "steered"]


class AppliedCacheOptions(Outbound):
    """``prompt_cache_options`` as a Response echoes them (the SDK's ``PromptCacheOptions``)."""

    mode: Literal["implicit", "explicit"]
    ttl: Literal["30m", "12h"]
    comparison_response_id: str | None = None


class ResponseObject(Outbound):
    """The full Response (docs/protocol.md §3.4): every key is always present, null when
    unknown.  It validates as the openai SDK's ``Response`` and as the Open Responses
    ``ResponseResource``, which also requires the sampling settings (``temperature``,
    ``top_p``, ``presence_penalty``, ``frequency_penalty``, ``top_logprobs``) as numbers
    and ``service_tier`` as a string."""

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
    reasoning: ReasoningConfig | None = None
    store: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0
    text: TextConfig = TextConfig(verbosity="medium")
    tool_choice: str | JSONObject = "auto"
    tools: list[JSONObject] = []
    truncation: Literal["auto", "disabled"] = "disabled"
    usage: Usage | None = None
    user: str | None = None
    metadata: dict[str, str] = {}
    background: bool = False
    service_tier: str = "default"
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Present when the create sent prompt_cache_options (docs/protocol.md §3.4).
    prompt_cache_options: AppliedCacheOptions | None = Field(None, exclude_if=lambda v: v is None)
    prompt_cache_diagnostics: JSONObject | None = Field(None, exclude_if=lambda v: v is None)

    @field_serializer("instructions", "tools", mode="wrap")
    def _echoed(
        self, value: Any, handler: SerializerFunctionWrapHandler, info: FieldSerializationInfo
    ) -> Any:
        encoder = info.context.get(_ENCODER) if isinstance(info.context, dict) else None
        if isinstance(encoder, EventEncoder) and info.mode_is_json():
            return encoder.placeholder(info.field_name, value)
        return handler(value)


def _absent(value: object) -> bool:
    return value is None


class _Event(Outbound):
    """Base of server events: ``stream_id`` is present iff the create had one (docs/protocol.md §3.1)."""

    # Left out when absent, field by field: a wrapping serializer would build the whole
    # event (tens of KB of echoed instructions and tools) as Python objects first.
    stream_id: str | None = Field(None, exclude_if=_absent)


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


# The events that end a response (and their types); an ``error`` event instead means it never started.
TERMINAL_EVENTS = (ResponseCompleted, ResponseIncomplete, ResponseFailed)
TERMINAL_EVENT_TYPES = frozenset(event.model_fields["type"].default for event in TERMINAL_EVENTS)


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


class CompactionCompacting(_Event):
    """Server-side compaction of the response's conversation is running: between the
    compaction item's ``output_item.added`` and its ``output_item.done`` (the SDK's
    ``ResponseCompactionCompactingEvent``; Open Responses has no such event)."""

    type: Literal["response.compaction.compacting"] = "response.compaction.compacting"
    sequence_number: int
    item_id: str
    output_index: int


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


class CustomToolCallInputDelta(_Event):
    type: Literal["response.custom_tool_call_input.delta"] = "response.custom_tool_call_input.delta"
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class CustomToolCallInputDone(_Event):
    type: Literal["response.custom_tool_call_input.done"] = "response.custom_tool_call_input.done"
    sequence_number: int
    item_id: str
    output_index: int
    input: str


class ErrorDetail(Outbound):
    type: str
    code: str | None
    message: str
    param: str | None


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    status: int
    error: ErrorDetail
    sequence_number: int | None = Field(None, exclude_if=_absent)


class SteerFailedError(Outbound):
    type: Literal["invalid_request_error"] = "invalid_request_error"
    code: str
    message: str


class SteerFailed(_Event):
    type: Literal["response.steer.failed"] = "response.steer.failed"
    sequence_number: int = 0
    error: SteerFailedError
    steer: JSONObject


class SteerRef(Outbound):
    id: str
    previous_response_id: str


class SteerAccepted(_Event):
    type: Literal["response.steer.accepted"] = "response.steer.accepted"
    sequence_number: int
    steer: SteerRef


class RequiredInput(Outbound):
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    name: str


class SteerPending(_Event):
    type: Literal["response.steer.pending"] = "response.steer.pending"
    sequence_number: int
    reason: Literal["waiting_for_required_input"] = "waiting_for_required_input"
    required_input: list[RequiredInput]
    steer: SteerRef


class InjectCreated(_Event):
    """``response.inject`` committed: the input joined the response's context (OpenAI's
    multi-agent beta; docs/protocol.md §3.7).  Its number is the response's next."""

    type: Literal["response.inject.created"] = "response.inject.created"
    sequence_number: int
    response_id: str


class InjectFailedError(Outbound):
    code: Literal["response_already_completed", "response_not_found"]
    message: str


class InjectFailed(_Event):
    """``response.inject`` not committed: the input as the client sent it comes back."""

    type: Literal["response.inject.failed"] = "response.inject.failed"
    sequence_number: int = 0
    response_id: str
    error: InjectFailedError
    input: list[Any]


ServerEvent = (
    ResponseCreated
    | ResponseInProgress
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed
    | OutputItemAdded
    | OutputItemDone
    | CompactionCompacting
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | CustomToolCallInputDelta
    | CustomToolCallInputDone
    | ErrorEvent
    | SteerFailed
    | SteerAccepted
    | SteerPending
    | InjectCreated
    | InjectFailed
)


# --------------------------------------------------------------------------- HTTP bodies


class ResponseDeleted(Outbound):
    """``DELETE /v1/responses/{id}`` (docs/protocol.md §6.5)."""

    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: Literal[True] = True


class ItemList(Outbound):
    """A page of ``GET /v1/responses/{id}/input_items`` (docs/protocol.md §6.6): stored
    items (:func:`~.items.item_dict`), each with an ``id`` and a ``status``."""

    object: Literal["list"] = "list"
    data: list[JSONObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class CompactedResponse(Outbound):
    """``POST /v1/responses/compact`` (docs/protocol.md §6.7): the user messages, then one
    ``compaction`` item."""

    id: str
    object: Literal["response.compaction"] = "response.compaction"
    created_at: int
    output: list[JSONObject]
    usage: Usage


HttpBody = ResponseObject | ItemList | CompactedResponse | ResponseDeleted


def encode(obj: ServerEvent | HttpBody) -> str:
    """The one encode function: a server event as the JSON text of one frame (or of one SSE
    ``data:`` line), or the body of an HTTP answer."""
    return obj.model_dump_json()


_ENCODER = "responses_ws.encoder"  # the serialization context's key for an EventEncoder


class EventEncoder:
    """:func:`encode` for one connection's (or one SSE stream's) events, byte for byte the
    same, reusing the JSON of the echoed ``instructions`` and ``tools``: a coding agent resends
    the same tens of KB of them with every create, and three events of every response echo
    them (``response.created``, ``response.in_progress`` and the terminal one).  The Response
    is encoded with a placeholder for each, which is then replaced with the JSON of the value:
    the one kept from the last time it was the same (the same object: a response's three
    echoing events share one, a connection keeps its tools' echo, actors.core.prepare; or an
    equal text), else the process's (:class:`~actors.protocol.echoes.EchoJSON`: a host's
    connections share one tool list and resend one text, encoded once a process).  The
    placeholder is random per encoder, so no client text can spell it."""

    def __init__(self, echoes: EchoJSON | None = None) -> None:
        self._marker = secrets.token_hex(16)
        self._echoes = PROCESS_ECHOES if echoes is None else echoes
        # field → (the value encoded last, its JSON); values are never changed once sent
        self._kept: dict[str, tuple[Any, str]] = {}

    def placeholder(self, field: str, value: Any) -> str:
        kept = self._kept.get(field)
        if kept is None or not (kept[0] is value or (isinstance(value, str) and kept[0] == value)):
            self._kept[field] = (value, self._echoes.json(value))
        elif kept[0] is not value:
            self._kept[field] = (value, kept[1])  # an equal text: the next one may be this one
        return f"{self._marker}:{field}"

    def __call__(self, obj: ServerEvent | HttpBody) -> str:
        return "".join(self.pieces(obj))

    def pieces(self, obj: ServerEvent | HttpBody) -> list[str]:
        """The text :meth:`__call__` returns, in pieces that join into it: each echoed value's
        JSON is a piece of its own, the very string kept for it (a writer can send it as it is,
        e.g. its bytes kept once, rather than copy it into one text first)."""
        # A field is in the instance's __dict__; getattr of one an event lacks would take
        # pydantic's __getattr__ and raise (five of a turn's nine events have none).
        if not isinstance(obj.__dict__.get("response"), ResponseObject):
            return [encode(obj)]
        text = obj.model_dump_json(context={_ENCODER: self})
        cuts = sorted((text.find(f'"{self._marker}:{field}"'), field) for field in self._kept)
        if cuts and cuts[0][0] < 0:  # not serialised through the placeholders
            return [encode(obj)]
        parts: list[str] = []
        pos = 0
        for at, field in cuts:  # both placeholders are in the response, once each
            parts += (text[pos:at], self._kept[field][1])
            pos = at + len(self._marker) + len(field) + 3
        parts.append(text[pos:])
        return parts


SSE_DONE = "data: [DONE]\n\n"
"""What ends an SSE stream, after its terminal event (Open Responses requires it; the
openai SDK stops reading there; clients that stop at the terminal event never see it)."""


def sse_frame(event: ServerEvent, encoder: Callable[[ServerEvent], str] = encode) -> str:
    """One event as an SSE frame whose ``event:`` field equals the JSON ``type`` (``encoder``:
    a stream's :class:`EventEncoder`)."""
    return f"event: {event.type}\ndata: {encoder(event)}\n\n"


def error_event(
    exc: BaseException, *, stream_id: str | None = None, sequence_number: int | None = None
) -> ErrorEvent:
    """The one place errors become wire events (docs/protocol.md §5.1).  Unknown exceptions become
    ``server_error`` and their text is never sent."""
    err = exc if isinstance(exc, APIError) else ServerError()
    return ErrorEvent(
        status=err.status,
        stream_id=stream_id,
        sequence_number=sequence_number,
        error=ErrorDetail(type=err.type, code=err.code, message=err.message, param=err.param),
    )


def http_error_body(exc: BaseException) -> tuple[int, JSONObject]:
    """The same errors as an HTTP status and OpenAI JSON error body (docs/protocol.md §6.2)."""
    err = exc if isinstance(exc, APIError) else ServerError()
    return err.status, {
        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    }
