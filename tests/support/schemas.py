"""The two schemas every object the server emits must satisfy (docs/protocol.md §3, §6):

- the openai SDK's types (openai 3.57), in pydantic's strict mode (no coercion):
  ``Response``, ``ResponseStreamEvent`` (SSE), ``ResponsesServerEvent`` (WebSocket),
  ``ResponseItemList``, ``CompactedResponse`` and the error object;
- the Open Responses OpenAPI document itself (:mod:`tests.support.openresponses`, a JSON-Schema
  validator with the document's objects closed): ``ResponseResource``, the streaming event
  chosen by ``type``, ``WebSocketErrorEvent``, the ``ItemField`` items, ``CompactResource``
  and ``ErrorPayload``.

Where the server departs from the Open Responses document on purpose, the departure is named
below with its reason, validated as far as it can be, and counted in :attr:`Checker.extensions`:
the WebSocket extensions the document has no schema for (:data:`EXTENSIONS`), the keys it does
not declare (:data:`EXTRA_KEYS`), a ``json_schema`` text format's ``schema``, which the
document types as null while the SDK requires the echoed object, and echoed hosted tools,
which the document's ``Tool`` (a function tool) does not allow.

:class:`Checker` counts what it validated per schema and kind, for the corpus summary.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from fnmatch import fnmatchcase
from typing import Any

from openai.types.responses import (
    CompactedResponse,
    Response,
    ResponseItem,
    ResponseItemList,
    ResponsesServerEvent,
    ResponseStreamEvent,
)
from openai.types.shared import ErrorObject
from pydantic import TypeAdapter

from tests.support import openresponses as orv
from tests.support.wire import as_the_sdk_checks_it

SDK = "openai SDK"
OPEN_RESPONSES = "Open Responses"

_SDK_RESPONSE = TypeAdapter(Response)
_SDK_SSE_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
_SDK_WS_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)
_SDK_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseItem)

# WebSocket-only events that Open Responses does not describe (docs/protocol.md §3.5):
# validated against the SDK only.
EXTENSIONS = {
    "response.steer.accepted": "steering",
    "response.steer.pending": "steering",
    "response.steer.failed": "steering",
    "response.compaction.compacting": "server-side compaction's progress (docs/protocol.md §4.12)",
}

# Keys the server sends that the Open Responses document does not declare, each with its
# reason: (the ``type``, or ``object``, of the object that carries it, as an fnmatch pattern;
# the key's dotted path in that object; why).  They are removed before an object is
# validated against the closed document, wherever such an object sits.
EXTRA_KEYS: list[tuple[str, str, str]] = [
    ("response.*", "stream_id", "named lanes, a WebSocket extension (docs/protocol.md §3.1)"),
    ("error", "stream_id", "named lanes, a WebSocket extension (docs/protocol.md §3.1)"),
    ("response", "user", "echoed from the create as the hosted API does; the SDK's Response has it"),
    (
        "response",
        "usage.input_tokens_details.cache_write_tokens",
        "the SDK's InputTokensDetails requires it (docs/protocol.md §3.4)",
    ),
    ("response.compaction", "usage.input_tokens_details.cache_write_tokens", "the same usage object"),
    (
        "response",
        "usage.input_tokens_details.cache_write_tokens_details",
        "the prompt cache's writes by lifetime, the SDK's (docs/protocol.md §3.4)",
    ),
    ("response", "prompt_cache_options", "the applied prompt-caching options, the SDK's"),
    ("response", "prompt_cache_diagnostics", "the SDK's answer to a comparison_response_id"),
    ("input_text", "prompt_cache_breakpoint", "the SDK's breakpoint on a content part, listed as sent"),
    ("input_image", "prompt_cache_breakpoint", "the same"),
    ("input_file", "prompt_cache_breakpoint", "the same"),
    (
        "response.function_call_arguments.done",
        "name",
        "the called function's name, as other servers send it (docs/protocol.md §3.3)",
    ),
    (
        "input_image",
        "file_id",
        "a reference to an uploaded file (Open Responses has no files API): "
        "listed as sent, null when the image came by URL, as the SDK types it",
    ),
    ("input_file", "file_id", "the same, for a file"),
    (
        "reasoning",
        "status",
        "every stored input item lists with a status (docs/protocol.md §2.2, "
        "§6.6), as the SDK's reasoning item has it",
    ),
    ("compaction", "status", "the same listing rule (the SDK's compaction item does not type it either)"),
]

SCHEMA_READ_AS_NULL = "text.format.schema read as null"  # the ``json_schema`` exception's counter
HOSTED_TOOL_LEFT_OUT = "tools: a hosted tool left out"  # the hosted-tools exception's counter


class Checker:
    """Validates wire text against both schemas; every method returns the parsed JSON."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.extensions: Counter[str] = Counter()

    def _ok(self, schema: str, kind: str) -> None:
        self.counts[(schema, kind)] += 1

    def _drop_extra_keys(self, obj: Any) -> None:
        """Remove the :data:`EXTRA_KEYS` from ``obj`` and everything in it (in place)."""
        if isinstance(obj, list):
            for value in obj:
                self._drop_extra_keys(value)
            return
        if not isinstance(obj, dict):
            return
        kind = obj.get("type", obj.get("object"))
        for pattern, path, _ in EXTRA_KEYS:
            if isinstance(kind, str) and fnmatchcase(kind, pattern):
                *parents, key = path.split(".")
                inner: Any = obj
                for parent in parents:
                    inner = inner.get(parent) if isinstance(inner, dict) else None
                if isinstance(inner, dict) and key in inner:
                    del inner[key]
                    self.extensions[f"{pattern}: {path}"] += 1
        for value in obj.values():
            self._drop_extra_keys(value)

    def open_responses(self, component: str, data: dict[str, Any]) -> None:
        """Validate ``data`` against the document's ``component`` as Open Responses reads it:
        the :data:`EXTRA_KEYS` removed, and a Response seen as :meth:`_response_view` says."""
        view = copy.deepcopy(data)
        self._drop_extra_keys(view)
        response = view.get("response", view)
        if response.get("object") == "response":
            self._response_view(response)
        orv.validate(component, view)
        self._ok(OPEN_RESPONSES, component)

    def _response_view(self, response: dict[str, Any]) -> None:
        """The two departures of a Response that are not extra keys (in place): a
        ``json_schema`` text format's echoed ``schema`` is read as null, and the hosted tools
        the create offered (``web_search``…, accepted and echoed, never called:
        docs/protocol.md §2.1) are left out of ``tools``, since the document's ``Tool`` is a
        function tool only."""
        fmt = response.get("text", {}).get("format", {})
        if fmt.get("type") == "json_schema":
            fmt["schema"] = None
            self.extensions[SCHEMA_READ_AS_NULL] += 1
        tools = response.get("tools", [])
        functions = [t for t in tools if t.get("type") == "function"]
        self.extensions[HOSTED_TOOL_LEFT_OUT] += len(tools) - len(functions)
        response["tools"] = functions

    def _event(self, data: dict[str, Any]) -> None:
        component = orv.event_schemas().get(data["type"])
        assert component, f"Open Responses has no streaming event of type {data['type']!r}"
        self.open_responses(component, data)

    # -- Responses
    def response(self, raw: str | bytes) -> dict[str, Any]:
        """A Response object: an HTTP JSON body, or the ``response`` of a lifecycle event."""
        _SDK_RESPONSE.validate_json(as_the_sdk_checks_it(raw), strict=True)
        self._ok(SDK, "Response")
        data = json.loads(raw)
        self.open_responses(orv.response_schema(), data)
        return data

    # -- streaming events
    def sse_event(self, raw: str) -> dict[str, Any]:
        """The ``data:`` of one SSE frame."""
        _SDK_SSE_EVENT.validate_json(as_the_sdk_checks_it(raw), strict=True)
        self._ok(SDK, "ResponseStreamEvent")
        data = json.loads(raw)
        self._event(data)
        return data

    def ws_event(self, raw: str) -> dict[str, Any]:
        """One WebSocket text frame."""
        _SDK_WS_EVENT.validate_json(as_the_sdk_checks_it(raw), strict=True)
        self._ok(SDK, "ResponsesServerEvent")
        data = json.loads(raw)
        if data["type"] in EXTENSIONS:
            self.extensions[data["type"]] += 1
        elif data["type"] == "error":
            self.open_responses(orv.websocket_error_schema(), data)
        else:
            self._event(data)
        return data

    # -- HTTP bodies
    def item_list(self, raw: str | bytes) -> dict[str, Any]:
        """``GET /v1/responses/{id}/input_items``: Open Responses has no list envelope, so
        each item is validated as its ``ItemField``."""
        ResponseItemList.model_validate_json(raw, strict=True)
        self._ok(SDK, "ResponseItemList")
        data = json.loads(raw)
        for item in data["data"]:
            self.open_responses(orv.item_schemas()[item["type"]], item)
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
        self.open_responses(orv.compact_schema(), data)
        return data

    def error_body(self, raw: str | bytes) -> dict[str, Any]:
        """An HTTP error: ``{"error": {...}}`` and nothing else.  Open Responses declares no
        error responses for its paths; its ``ErrorPayload`` (the error of a streaming error
        event: ``type``, ``code``, ``message``, ``param``) is the closest schema."""
        data = json.loads(raw)
        assert set(data) == {"error"}, data
        ErrorObject.model_validate_json(json.dumps(data["error"]), strict=True)
        self._ok(SDK, "ErrorObject")
        self.open_responses("ErrorPayload", data["error"])
        return data

    def summary(self) -> str:
        lines = [f"{schema:>15}  {kind:<56} {n:>5}" for (schema, kind), n in sorted(self.counts.items())]
        lines += [
            f"{'extension':>15}  {kind:<56} {n:>5}  (see tests/support/schemas.py)"
            for kind, n in sorted(self.extensions.items())
        ]
        return "\n".join(lines)

    def total(self, schema: str) -> int:
        return sum(n for (s, _), n in self.counts.items() if s == schema)
