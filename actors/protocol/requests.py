"""Inbound: the client events and ``POST /v1/responses`` bodies, and the one place they are
parsed (docs/protocol.md §2).  Parsing is strict about types (no coercion) and every problem
is a typed :class:`~actors.errors.APIError` (400)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Protocol

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
)
from pydantic_core import PydanticCustomError, from_json

from ..errors import APIError, InvalidJSON, InvalidRequest, InvalidStreamId, UnknownEventType
from .items import ITEM_TAGS, InputItem, MessageItem, OpenInbound, StrictInbound
from .wire_types import JSONObject


class FunctionTool(OpenInbound):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: JSONObject | None = None
    strict: bool | None = None


class CustomTool(OpenInbound):
    """A freeform tool (``format`` text or a grammar), called with free text: Codex's ``apply_patch``."""

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: JSONObject | None = None


class OtherTool(OpenInbound):
    """Hosted or unknown tool types (``web_search``, ``namespace``…): accepted, echoed, never called."""

    type: str


def _tool_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("function", "custom") else "other"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[CustomTool, Tag("custom")]
    | Annotated[OtherTool, Tag("other")],
    Discriminator(_tool_tag),
]

_STREAM_ID = re.compile(r"[A-Za-z0-9_.\-]{1,256}")

# Bounds OpenAI documents for these fields; they also keep every echoed value encodable.
Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
TopP = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]], Field(max_length=16)
]
TOOL_CHOICE_MODES = ("none", "auto", "required")
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]


class TextFormatText(OpenInbound):
    type: Literal["text"] = "text"


class TextFormatJsonObject(OpenInbound):
    type: Literal["json_object"]


class TextFormatJsonSchema(OpenInbound):
    """Structured output.  ``schema`` is echoed as sent (docs/protocol.md §3.4)."""

    model_config = ConfigDict(serialize_by_alias=True)

    type: Literal["json_schema"]
    name: str
    schema_: JSONObject = Field(alias="schema")
    description: str | None = None
    strict: bool = False


TextFormat = Annotated[
    TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")
]


class TextConfig(OpenInbound):
    """``text``: the output format, echoed on every Response with both keys present."""

    format: TextFormat = Field(default_factory=TextFormatText)  # made, not deep-copied: 4.2 -> 1.6 us
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(OpenInbound):
    """``reasoning``: echoed with ``effort`` and ``summary`` always present (null when unset)."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ContextManagement(OpenInbound):
    """One ``context_management`` entry.  ``{"type":"compaction","compact_threshold":N}``
    turns on server-side compaction (docs/protocol.md §4.12); other types are accepted and
    unused."""

    type: str
    compact_threshold: Annotated[int, Field(ge=1000)] | None = None


class MultiAgent(OpenInbound):
    """``multi_agent`` (OpenAI's multi-agent beta): with ``enabled``, a WebSocket response
    waits for client-owned tool output sent with ``response.inject`` instead of completing
    on its function calls (docs/protocol.md §2.5)."""

    enabled: bool
    max_concurrent_subagents: Annotated[int, Field(ge=1)] | None = None


class PromptCacheOptions(StrictInbound):
    """``prompt_cache_options`` (the openai SDK's; docs/protocol.md §2.1): ``mode``
    ``implicit`` (one automatic breakpoint plus up to three explicit) or ``explicit`` (up
    to four explicit, none: no caching), ``ttl`` the breakpoints' minimum lifetime,
    ``prewarm`` fills the cache without output, ``comparison_response_id`` asks for
    ``prompt_cache_diagnostics``."""

    mode: Literal["implicit", "explicit"] = "implicit"
    ttl: Literal["30m", "12h"] = "30m"
    prewarm: bool = False
    comparison_response_id: str | None = None


class ResponseCreate(BaseModel):
    """``response.create`` (flat body, docs/protocol.md §2.1).  Unknown top-level fields are kept in
    ``model_extra``; the session rejects them only in strict mode."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: Literal["response.create"] = "response.create"
    model: str | None = None
    input: str | list[InputItem] = []
    previous_response_id: str | None = None
    store: bool | None = None
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: str | JSONObject | None = None
    parallel_tool_calls: bool | None = None
    stream_id: Any = None  # validated by hand: a bad one has its own error code
    generate: bool | None = None
    background: bool | None = None
    stream: bool | None = None
    stream_options: JSONObject | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tool_calls: Annotated[int, Field(ge=0)] | None = None
    metadata: Metadata | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: ServiceTier | None = None
    client_metadata: JSONObject | None = None
    context_management: list[ContextManagement] | None = None
    multi_agent: MultiAgent | None = None
    conversation: str | JSONObject | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None

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
            functions = {
                t.name for t in info.data.get("tools") or () if isinstance(t, (FunctionTool, CustomTool))
            }
            if not isinstance(name, str) or name not in functions:
                raise PydanticCustomError(
                    "invalid_value", "tool_choice names a function that is not among the tools"
                )
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


class ResponseSteer(OpenInbound):
    type: Literal["response.steer"]
    previous_response_id: Any = None
    input: Any = None


class ResponseProcessed(OpenInbound):
    """Codex sends this after each response; it carries nothing we need (docs/protocol.md §2.4)."""

    type: Literal["response.processed"]


class ResponseAppend(StrictInbound):
    """Append-mode rollouts only (opt-in, docs/append-mode.md): tool results for a response
    paused on its function calls; sampling resumes in the same response."""

    type: Literal["response.append"]
    response_id: str
    input: list[InputItem]


class ResponseInject(StrictInbound):
    """``response.inject`` (OpenAI's multi-agent beta, docs/protocol.md §2.5): client-owned
    tool output for a response still running on this connection.  The target fixes the
    lane; a ``stream_id``, if sent, must name it.  A client ``event_id`` is tolerated, as on
    a steer; any other field is an unknown parameter."""

    type: Literal["response.inject"]
    response_id: Annotated[str, Field(min_length=1)]
    input: Annotated[list[InputItem], Field(min_length=1)]
    stream_id: Any = None  # validated by hand, as on a create
    event_id: str | None = None


ClientEvent = ResponseCreate | ResponseSteer | ResponseProcessed | ResponseAppend | ResponseInject
_CLIENT_EVENT: TypeAdapter[ClientEvent] = TypeAdapter(Annotated[ClientEvent, Field(discriminator="type")])


def load_json_object(data: str | bytes) -> JSONObject:
    """A frame or request body that must be one JSON object; typed 400 errors otherwise.

    The parser refuses what could not be sent back: lone surrogates (``"\\ud800"``),
    ``NaN``/``Infinity`` and nesting deeper than about 200 levels (echoed fields such as
    ``tools`` or ``metadata`` must still encode as JSON)."""
    try:
        raw = from_json(data, allow_inf_nan=False)
    except ValueError as exc:
        deep = "recursion limit" in str(exc)
        raise InvalidJSON(
            "The message is nested too deeply." if deep else "The message is not valid JSON."
        ) from None
    if not isinstance(raw, dict):
        raise InvalidRequest("The message must be a JSON object.", code="invalid_type")
    return raw


def flat(raw: JSONObject) -> JSONObject:
    """A nested ``{"type":"response.create","response":{…}}`` body as a flat one."""
    if isinstance(raw.get("response"), dict) and "input" not in raw:
        return {**raw.pop("response"), **raw}
    return raw


class Recurrence(Protocol):
    """What :func:`parse_client_event` asks of a host's memo of resent instructions and tools
    (:class:`actors.protocol.recurring.Recurring`)."""

    def stubbed(self, data: str) -> tuple[JSONObject, list[Tool] | None] | None: ...
    def text(self, value: str) -> str: ...
    def learn(self, data: str, validated: list[Tool]) -> None: ...
    def learn_text(self, data: str, kept: str) -> None: ...


def parse_client_event(data: str | bytes, recurring: Recurrence | None = None) -> ClientEvent:
    """Parse one client frame.  Raises a typed :class:`APIError` (400) on any problem.

    A nested ``{"type":"response.create","response":{…}}`` body is accepted as well (docs/protocol.md §1.3).
    With ``recurring`` (a session host's), a create's instructions and tools equal to ones
    it keeps are taken from it (:class:`actors.protocol.recurring.Recurring`).
    """
    stubbed = recurring.stubbed(data) if recurring is not None and isinstance(data, str) else None
    kept_tools = None
    if stubbed is not None:
        raw, kept_tools = stubbed  # the kept tools in it: validated instances pass as they are
    else:
        raw = flat(load_json_object(data))
    if recurring is not None and isinstance(raw.get("instructions"), str):
        raw["instructions"] = recurring.text(raw["instructions"])
    try:
        event = _CLIENT_EVENT.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            raise UnknownEventType(f"Unsupported event type {raw.get('type')!r}.", param="type") from None
        raise _validation_error(exc) from None
    if (
        isinstance(event, (ResponseCreate, ResponseInject))
        and event.stream_id is not None
        and (not isinstance(event.stream_id, str) or not _STREAM_ID.fullmatch(event.stream_id))
    ):
        raise InvalidStreamId()
    if recurring is not None and isinstance(event, ResponseCreate) and isinstance(data, str):
        if kept_tools is not None:
            event.tools = kept_tools  # the kept list itself (an assignment is not validated)
        elif event.tools:
            recurring.learn(data, event.tools)
        if isinstance(event.instructions, str):
            recurring.learn_text(data, event.instructions)
    return event


_WS_ONLY = ("stream_id", "generate")


def parse_http_create(data: bytes | str) -> ResponseCreate:
    """The body of ``POST /v1/responses`` (docs/protocol.md §6.1): the create fields without ``type``;
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


class ResponseCompact(BaseModel):
    """The body of ``POST /v1/responses/compact`` (docs/protocol.md §6.7): the window to
    compact is the stored conversation of ``previous_response_id`` followed by ``input``.
    ``model`` is required; the other options the SDK may send are accepted and unused."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str
    input: str | list[InputItem] | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: ServiceTier | None = None

    @property
    def items(self) -> list[InputItem]:
        if self.input is None:
            return []
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)


def parse_http_compact(data: bytes | str) -> ResponseCompact:
    """The body of ``POST /v1/responses/compact``; typed 400 errors like a create's."""
    raw = load_json_object(data)
    try:
        return ResponseCompact.model_validate(raw)
    except ValidationError as exc:
        raise _validation_error(exc, tagged=False) from None


def _validation_error(exc: ValidationError, *, tagged: bool = True) -> APIError:
    # The deepest error is the most specific one (a bad item beats "input is not a string").
    err = max(exc.errors(include_url=False), key=lambda e: len(e["loc"]))
    param = _param_path(err["loc"][1:] if tagged else err["loc"])
    kind = err["type"]
    if kind == "missing":
        return InvalidRequest(
            f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
        )
    if kind == "extra_forbidden":
        return InvalidRequest(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")
    if kind.endswith("_type"):
        return InvalidRequest(f"Invalid type for '{param}': {err['msg']}.", param=param, code="invalid_type")
    return InvalidRequest(f"Invalid value for '{param}': {err['msg']}.", param=param)


def _param_path(loc: tuple[Any, ...]) -> str:
    """``('input', 'list[…]', 0, 'message', 'role')`` → ``input[0].role``.  The first part
    is always a top-level field (``reasoning`` is one, besides an item type)."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i > 0 and (part in _UNION_LABELS or "[" in part):
            continue  # union branch labels, not field names
        else:
            out += f".{part}" if out else part
    return out


_UNION_LABELS = ITEM_TAGS | {
    # content part types (ContentPart's discriminator)
    "input_text",
    "output_text",
    "refusal",
    "input_image",
    "input_file",
    "input_audio",
    "json_object",
    "json_schema",
    "str",
    "function",
    "other",
    "dict[str,any]",
    "bool",
    "int",
    "float",
}
