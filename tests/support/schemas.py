"""The two schemas every object the server emits must satisfy (docs/protocol.md §3, §6):

- the openai SDK's types (openai 3.57): ``Response``, ``ResponseStreamEvent`` (SSE),
  ``ResponsesServerEvent`` (WebSocket), ``ResponseItemList``, ``CompactedResponse`` and the
  error object;
- the Open Responses models (``openresponses_types`` 2.4, generated from the Open Responses
  OpenAPI document of 2026-04-24): ``ResponseResource``, the ``*StreamingEvent`` models,
  ``WebSocketErrorEvent``, the ``ItemField`` items, ``CompactResource`` and ``ErrorPayload``.

Everything is validated from the wire text in pydantic's strict mode (no coercion: a
number sent as a string, or an int where a string is due, fails).  Neither schema forbids
unknown keys, so extra fields validate; where the server's behaviour is an intentional
extension Open Responses has no schema for (steering, :data:`EXTENSIONS`; ``stream_id``) or
where the two schemas disagree (a ``json_schema`` text format's ``schema``), the checker
says so by name, validates what it can, and counts it in :attr:`Checker.extensions`.

:class:`Checker` counts what it validated per schema and kind, for the corpus summary.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import openresponses_types as orx
from openai.types.responses import (
    CompactedResponse,
    Response,
    ResponseItem,
    ResponseItemList,
    ResponsesServerEvent,
    ResponseStreamEvent,
)
from openai.types.shared import ErrorObject
from pydantic import BaseModel, TypeAdapter

SDK = "openai SDK"
OPEN_RESPONSES = "Open Responses"

_SDK_RESPONSE = TypeAdapter(Response)
_SDK_SSE_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
_SDK_WS_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)
_SDK_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseItem)

# Open Responses' streaming events, by ``type`` (its union is discriminated by ``type``).
OR_EVENTS: dict[str, type[BaseModel]] = {
    "response.created": orx.ResponseCreatedStreamingEvent,
    "response.queued": orx.ResponseQueuedStreamingEvent,
    "response.in_progress": orx.ResponseInProgressStreamingEvent,
    "response.completed": orx.ResponseCompletedStreamingEvent,
    "response.failed": orx.ResponseFailedStreamingEvent,
    "response.incomplete": orx.ResponseIncompleteStreamingEvent,
    "response.output_item.added": orx.ResponseOutputItemAddedStreamingEvent,
    "response.output_item.done": orx.ResponseOutputItemDoneStreamingEvent,
    "response.content_part.added": orx.ResponseContentPartAddedStreamingEvent,
    "response.content_part.done": orx.ResponseContentPartDoneStreamingEvent,
    "response.output_text.delta": orx.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": orx.ResponseOutputTextDoneStreamingEvent,
    "response.function_call_arguments.delta": orx.ResponseFunctionCallArgumentsDeltaStreamingEvent,
    "response.function_call_arguments.done": orx.ResponseFunctionCallArgumentsDoneStreamingEvent,
    "error": orx.ErrorStreamingEvent,
}
# Open Responses' ``ItemField`` (the items of ``output`` and of item lists), by ``type``.
OR_ITEMS: dict[str, type[BaseModel]] = {
    "message": orx.Message,
    "function_call": orx.FunctionCall,
    "function_call_output": orx.FunctionCallOutput,
    "reasoning": orx.ReasoningBody,
    "compaction": orx.CompactionBody,
}
# WebSocket-only behaviour that Open Responses does not describe (docs/protocol.md §3.5, §3.1).
EXTENSIONS = {
    "response.steer.accepted": "steering",
    "response.steer.pending": "steering",
    "response.steer.failed": "steering",
}


class Checker:
    """Validates wire text against both schemas; every method returns the parsed JSON."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.extensions: Counter[str] = Counter()

    def _ok(self, schema: str, kind: str) -> None:
        self.counts[(schema, kind)] += 1

    def _open_responses_view(self, raw: str | bytes) -> str | bytes:
        """The object as Open Responses validates it.  Structured output (``text.format``
        of type ``json_schema``) echoes the JSON schema the client sent, as the hosted API
        does and as the SDK requires (``schema`` is a required object there); the Open
        Responses document types that ``schema`` as null only (``anyOf: [{type: null}]``),
        so it is validated as null."""
        data = json.loads(raw)
        response = data.get("response", data)
        if response.get("object") != "response" or response["text"]["format"]["type"] != "json_schema":
            return raw
        fmt = response["text"]["format"]
        self.extensions["text.format.schema echoed"] += 1
        fmt["schema"] = None
        return json.dumps(data)

    # -- Responses
    def response(self, raw: str | bytes) -> dict[str, Any]:
        """A Response object: an HTTP JSON body, or the ``response`` of a lifecycle event."""
        _SDK_RESPONSE.validate_json(raw, strict=True)
        self._ok(SDK, "Response")
        orx.ResponseResource.model_validate_json(self._open_responses_view(raw), strict=True)
        self._ok(OPEN_RESPONSES, "ResponseResource")
        return json.loads(raw)

    # -- streaming events
    def sse_event(self, raw: str) -> dict[str, Any]:
        """The ``data:`` of one SSE frame."""
        data = json.loads(raw)
        _SDK_SSE_EVENT.validate_json(raw, strict=True)
        self._ok(SDK, "ResponseStreamEvent")
        OR_EVENTS[data["type"]].model_validate_json(self._open_responses_view(raw), strict=True)
        self._ok(OPEN_RESPONSES, "streaming event")
        return data

    def ws_event(self, raw: str) -> dict[str, Any]:
        """One WebSocket text frame."""
        data = json.loads(raw)
        _SDK_WS_EVENT.validate_json(raw, strict=True)
        self._ok(SDK, "ResponsesServerEvent")
        if data["type"] in EXTENSIONS:
            # Steering is an extension of the hosted API's WebSocket mode: Open Responses has
            # no schema for it, so these frames are validated against the SDK only.
            self.extensions[data["type"]] += 1
            return data
        if data["type"] == "error":
            orx.WebSocketErrorEvent.model_validate_json(raw, strict=True)
            self._ok(OPEN_RESPONSES, "WebSocketErrorEvent")
            return data
        # ``stream_id`` (named lanes) is a WebSocket-only extension that Open Responses does
        # not know: the event is validated with that field removed.
        if "stream_id" in data:
            self.extensions["stream_id removed"] += 1
        bare = json.dumps({k: v for k, v in data.items() if k != "stream_id"})
        OR_EVENTS[data["type"]].model_validate_json(self._open_responses_view(bare), strict=True)
        self._ok(OPEN_RESPONSES, "streaming event")
        return data

    # -- HTTP bodies
    def item_list(self, raw: str | bytes) -> dict[str, Any]:
        """``GET /v1/responses/{id}/input_items``: Open Responses has no list envelope, so
        each item is validated as its ``ItemField``."""
        ResponseItemList.model_validate_json(raw, strict=True)
        self._ok(SDK, "ResponseItemList")
        data = json.loads(raw)
        for item in data["data"]:
            OR_ITEMS[item["type"]].model_validate_json(json.dumps(item), strict=True)
            self._ok(OPEN_RESPONSES, "ItemField")
        return data

    def compacted(self, raw: str | bytes) -> dict[str, Any]:
        """``POST /v1/responses/compact``.  The SDK types ``CompactedResponse.output`` as
        output items, which a user message cannot be (an output message is the assistant's),
        although its docstring says the list holds the user messages: the envelope is
        validated with the SDK's ``CompactedResponse`` and each item with its ``ResponseItem``
        (the type of any stored item)."""
        data = json.loads(raw)
        CompactedResponse.model_validate_json(json.dumps({**data, "output": []}), strict=True)
        self._ok(SDK, "CompactedResponse")
        for item in data["output"]:
            _SDK_ITEM.validate_json(json.dumps(item), strict=True)
            self._ok(SDK, "ResponseItem")
        orx.CompactResource.model_validate_json(raw, strict=True)
        self._ok(OPEN_RESPONSES, "CompactResource")
        return data

    def error_body(self, raw: str | bytes) -> dict[str, Any]:
        """An HTTP error: ``{"error": {...}}`` and nothing else.  Open Responses declares no
        error responses for its paths; its ``ErrorPayload`` (the error of a streaming error
        event: ``type``, ``code``, ``message``, ``param``) is the closest schema."""
        data = json.loads(raw)
        assert set(data) == {"error"}, data
        error = json.dumps(data["error"])
        ErrorObject.model_validate_json(error, strict=True)
        self._ok(SDK, "ErrorObject")
        orx.ErrorPayload.model_validate_json(error, strict=True)
        self._ok(OPEN_RESPONSES, "ErrorPayload")
        return data

    def summary(self) -> str:
        lines = [f"{schema:>15}  {kind:<22} {n:>5}" for (schema, kind), n in sorted(self.counts.items())]
        lines += [f"{'extension':>15}  {kind:<22} {n:>5}  (see the checker)"
                  for kind, n in sorted(self.extensions.items())]
        return "\n".join(lines)

    def total(self, schema: str) -> int:
        return sum(n for (s, _), n in self.counts.items() if s == schema)
