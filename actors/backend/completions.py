"""A real engine's streamed ``/v1/completions`` as the inference seam's events.

Used by both real backends: the OpenAI-compatible upstream (:mod:`.openai_upstream`, SSE
over HTTP) and Ray Serve LLM (:mod:`.serve_llm`: the same SSE strings through a Serve
handle).  Pure: :func:`completion_body` is the request, :func:`sse_data` reads one SSE line,
:class:`CompletionStream` turns the decoded chunks into :mod:`inference.types` events.

The prompt is the conversation's token ids (the session renders them with the model's
template, :mod:`inference.chat_template`) plus the template's generation prompt; the engine
returns its output token ids (``return_token_ids``), and ``Done.context_token_ids`` hands
them back so the conversation continues with exactly what the engine's prefix cache holds.

Usage arrives with the engine's last chunk, so ``Prefilled`` (prompt and cached tokens, as
the engine reports them) comes just before ``Done`` rather than first — the response
builder sums it either way.  With function tools, output that starts with ``<tool_call>``
is held back and parsed into ``FunctionCallDelta`` events at the end (a call is recognised
at the start of the output only); any other output streams as text as it comes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from inference.chat_template import CALL_OPEN, TemplateFormat, parse_calls
from inference.types import (
    Done,
    FinishReason,
    FunctionCallDelta,
    InferenceEvent,
    InferenceRequest,
    Prefilled,
    TextDelta,
)

from ..config import ModelBackend
from ..protocol.wire_types import JSONObject

FINISH: dict[str, FinishReason] = {"length": "max_output_tokens", "stop": "stop", "abort": "stop"}


class EngineError(Exception):
    """The engine answered a model call with an error (→ ``server_error``)."""

    code = "server_error"


def completion_body(request: InferenceRequest, backend: ModelBackend, fmt: TemplateFormat) -> JSONObject:
    """The ``/v1/completions`` request of one model call.  ``generate=False`` (a warm-up)
    asks for one token, which fills the engine's prefix cache; its output is dropped."""
    max_tokens = request.max_output_tokens or backend.max_output_tokens
    body: JSONObject = {
        "model": backend.served_name,
        "prompt": [*request.prompt_token_ids, *fmt.generation_prompt],
        "max_tokens": max_tokens if request.generate else 1,
        "temperature": backend.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if backend.cache_salt and request.cache_scope:
        body["cache_salt"] = request.cache_scope  # a key's entries are its own (docs/protocol.md check 27)
    return body


def sse_data(line: str | bytes) -> JSONObject | None:
    """The JSON of one ``data:`` line of an SSE stream; ``None`` for anything else and ``[DONE]``."""
    text = line.decode() if isinstance(line, bytes) else line
    text = text.strip()
    if not text.startswith("data:"):
        return None
    payload = text[5:].strip()
    return None if payload == "[DONE]" else json.loads(payload)


def sse_batch(batch: Any) -> list[JSONObject]:
    """The chunks of one item of a Ray Serve LLM deployment's stream: a list of SSE strings
    (``data: {…}\\n\\n`` each), or one; an ``ErrorResponse`` in it raises :class:`EngineError`."""
    chunks = []
    for item in batch if isinstance(batch, list) else [batch]:
        if not isinstance(item, str):
            raise EngineError(f"the engine answered: {getattr(item, 'error', item)}")
        chunks += [data for line in item.splitlines() if (data := sse_data(line)) is not None]
    return chunks


class CompletionStream:
    """One model call's chunks → events (``feed`` per chunk, ``finish`` at the end)."""

    def __init__(
        self, request: InferenceRequest, fmt: TemplateFormat, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._request = request
        self._fmt = fmt
        self._clock = clock
        self._started = clock()
        self._first: float | None = None
        self._ids: list[int] = []
        self._usage: JSONObject = {}
        self._finish: str | None = None
        self._calls_possible = request.generate and bool(request.tools) and request.tool_choice != "none"
        self._pending_text = ""  # text that may still open a tool call
        self._pending_tokens = 0
        self._calling = False  # the output opened a tool call: all of it is held

    def feed(self, chunk: JSONObject) -> list[InferenceEvent]:
        if chunk.get("error"):  # vLLM's error mid-stream: a data line with the error alone
            raise EngineError(f"the engine failed the call: {chunk['error']}")
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        events: list[InferenceEvent] = []
        for choice in chunk.get("choices") or ():
            ids = choice.get("token_ids") or []
            if ids and self._first is None:
                self._first = self._clock()
            self._ids += ids
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
            if self._request.generate:
                events += self._text(choice.get("text") or "", len(ids))
        return events

    def _text(self, text: str, tokens: int) -> list[InferenceEvent]:
        if not self._calls_possible:
            return [TextDelta(text, tokens)] if text or tokens else []
        self._pending_text += text
        self._pending_tokens += tokens
        if self._calling:
            return []
        head = self._pending_text.lstrip()
        if head.startswith(CALL_OPEN):
            self._calling = True
            return []
        if CALL_OPEN.startswith(head):
            return []  # could still be the start of a call
        self._calls_possible = False
        out: list[InferenceEvent] = [TextDelta(self._pending_text, self._pending_tokens)]
        self._pending_text, self._pending_tokens = "", 0
        return out

    def finish(self) -> list[InferenceEvent]:
        """The last events: any held text or the parsed calls, ``Prefilled``, ``Done``;
        raises :class:`~inference.chat_template.InvalidToolCall` for an invalid call."""
        now = self._clock()
        first = self._first if self._first is not None else now
        events: list[InferenceEvent] = []
        reason = FINISH.get(self._finish or "stop", "stop")
        if self._calling:
            calls = parse_calls(self._pending_text, self._request.tools)
            for i, call in enumerate(calls):
                events.append(
                    FunctionCallDelta(i, call.name, call.arguments, self._pending_tokens if i == 0 else 0)
                )
            reason = "tool_calls"
        elif self._pending_text or self._pending_tokens:
            events.append(TextDelta(self._pending_text, self._pending_tokens))
        usage = self._usage
        prompt = int(usage.get("prompt_tokens", len(self._request.prompt_token_ids)))
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        events.append(
            Prefilled(
                prompt_tokens=prompt,
                cached_tokens=cached,
                queue_ms=0.0,
                prefill_ms=(first - self._started) * 1000.0,
                reused_tokens=cached,
            )
        )
        if not self._request.generate:
            events.append(Done("stop", 0, 0.0))
            return events
        output = int(usage.get("completion_tokens", len(self._ids)))
        events.append(
            Done(
                reason,
                output,
                (now - first) * 1000.0,
                context_token_ids=tuple(self._fmt.continuation(self._ids)),
            )
        )
        return events
