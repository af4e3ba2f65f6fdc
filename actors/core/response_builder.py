"""Turn a stream of inference chunks into the Responses streaming events of one response.

Shape: ``start()`` → ``feed(chunk)``* → ``terminal()`` once ``finishing`` (the chunk holding
``Done`` arrived, or the output classifier flagged the text) — or ``fail(exc)``.  The gap
between the last ``feed`` and ``terminal`` is where the session does its post-processing.  Event order is exactly docs/protocol.md §3.2 (text) / §3.3 (function calls);
``sequence_number`` counts from 0 per response; item ids, ``output_index`` and
``content_index`` stay consistent.  One protocol delta per inference chunk, never per token.

Over 400 lines on purpose: a response's event sequence is one state machine
(:class:`ResponseBuilder`), kept in one class so every step of §3.2/§3.3 reads in one place;
beside it, the Response object a create starts (:func:`new_response`) and what it echoes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from pydantic import BaseModel

from inference.types import (
    Done,
    FunctionCallDelta,
    InferenceEvent,
    Prefilled,
    ReasoningDone,
    TextDelta,
)

from ..ids import new_id
from ..protocol import (
    AppliedCacheOptions,
    CacheWriteTokensDetails,
    CompactionCompacting,
    ContentPartAdded,
    ContentPartDone,
    CustomToolCallInputDelta,
    CustomToolCallInputDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    FunctionTool,
    IncompleteDetails,
    InputTokensDetails,
    OutputCompaction,
    OutputCustomToolCall,
    OutputFunctionCall,
    OutputItem,
    OutputItemAdded,
    OutputItemDone,
    OutputMessage,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    OutputTokensDetails,
    ResponseCompleted,
    ResponseCreate,
    ResponseCreated,
    ResponseErrorBody,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseObject,
    ServerEvent,
    TextConfig,
    Usage,
)
from ..protocol.wire_types import JSONObject
from .safety import Classifier

T = TypeVar("T")


# The items the model's stream opens and closes (a compaction item is added whole: add_item).
Streamed = OutputMessage | OutputFunctionCall | OutputCustomToolCall


class BuildState(enum.Enum):
    NEW = "new"
    STREAMING = "streaming"
    PAUSED = "paused"  # append mode: stopped on function calls, waiting for response.append
    FINISHING = "finishing"  # output is final; the terminal event is not sent yet
    DONE = "done"


class ResponseBuilder:
    def __init__(
        self,
        response: ResponseObject,
        *,
        stream_id: str | None,
        clock: Callable[[], float],
        output_scan: Classifier | None = None,
        pause_on_calls: bool = False,
    ):
        self.response = response
        self.pause_on_calls = pause_on_calls
        # Input is waiting for the current model call to stop (actors.core.inject): it
        # pauses however it ends (a cut excepted), and the model continues.
        self.stop_after_call = False
        self.output_scan = output_scan
        self.stream_id = stream_id
        self._clock = clock
        self._seq = 0
        self.state = BuildState.NEW
        self._open: Streamed | None = None
        self._open_call_index: int | None = None
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.reused_tokens = 0
        self.written: list[int] | None = None  # (ttl_30m, ttl_12h) written, the breakpoint rule's
        self.replica = ""  # the inference replica that served it (the last call's)
        self.output_tokens = 0
        self.reasoning_tokens = 0
        self._generated = 0  # output tokens of every model call of this response
        self.queue_ms = self.prefill_ms = self.decode_ms = 0.0
        self.finish_reason: str | None = None
        # A real model's output as the engine's token ids (Done.context_token_ids): the
        # conversation continues with them, not with a re-rendering of the text.
        self.context_tokens: list[int] | None = None

    # -- helpers
    def _next(self) -> int:
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def next_seq(self) -> int:
        """A sequence number of this response for an event outside the stream (steering)."""
        return self._next()

    @property
    def seq(self) -> int:
        """The sequence number the response's next event takes."""
        return self._seq

    def cut(self, reason: str) -> list[ServerEvent]:
        """Stop at this chunk boundary (e.g. ``steered``): open items close as incomplete."""
        if self.state is not BuildState.STREAMING:
            return []
        return self._finish(reason, self._generated + self._pending_tokens())

    def _snapshot(self) -> ResponseObject:
        """The response as it is now, for an event encoded later.  A shallow copy with the
        output items copied: the builder changes the response only by assigning its fields
        and by appending to and editing its output items, so everything else (the echoed
        instructions and tools, often thousands of tokens, and the echoed settings) is
        shared, not copied."""
        r = self.response
        return r.model_copy(update={"output": [_copy(item) for item in r.output]})

    @property
    def output(self) -> list[OutputItem]:
        return self.response.output

    # -- lifecycle
    def start(self) -> list[ServerEvent]:
        assert self.state is BuildState.NEW
        self.state = BuildState.STREAMING
        sid = self.stream_id
        snapshot = self._snapshot()  # the same moment: both events carry one copy
        return [
            ResponseCreated(sequence_number=self._next(), response=snapshot, stream_id=sid),
            ResponseInProgress(sequence_number=self._next(), response=snapshot, stream_id=sid),
        ]

    @property
    def finishing(self) -> bool:
        return self.state is BuildState.FINISHING

    @property
    def paused(self) -> bool:
        return self.state is BuildState.PAUSED

    def resume(self) -> None:
        assert self.state is BuildState.PAUSED
        self.state = BuildState.STREAMING

    def feed(self, chunk: Sequence[InferenceEvent]) -> list[ServerEvent]:
        out: list[ServerEvent] = []
        for ev in chunk:
            if self.state is not BuildState.STREAMING:
                break  # e.g. output already cut by the classifier
            if isinstance(ev, Prefilled):  # summed: an append-mode response makes several calls
                self.prompt_tokens += ev.prompt_tokens
                self.cached_tokens += ev.cached_tokens
                self.reused_tokens += ev.reused_tokens
                if ev.written is not None:
                    self.written = [a + b for a, b in zip(self.written or [0, 0], ev.written, strict=True)]
                self.queue_ms += ev.queue_ms
                self.prefill_ms += ev.prefill_ms
                self.replica = ev.replica or self.replica
            elif isinstance(ev, ReasoningDone):
                self.output_tokens += ev.tokens
                self.reasoning_tokens += ev.tokens
            elif isinstance(ev, TextDelta):
                self.output_tokens += ev.tokens
                out += self._text(ev.text)
                out += self._scan(ev.text)
            elif isinstance(ev, FunctionCallDelta):
                self.output_tokens += ev.tokens
                out += self._call(ev)
                out += self._scan(ev.arguments_delta)
            elif isinstance(ev, Done):
                self.decode_ms += ev.decode_ms
                self._generated += ev.output_tokens
                if ev.context_token_ids is not None:
                    self.context_tokens = list(ev.context_token_ids)
                if (self.pause_on_calls and ev.finish_reason == "tool_calls") or (
                    self.stop_after_call and ev.finish_reason in ("stop", "tool_calls")
                ):
                    self.stop_after_call = False
                    out += self._close_open()
                    self.state = BuildState.PAUSED
                else:
                    out += self._finish(ev.finish_reason, self._generated)
        return out

    def _pending_tokens(self) -> int:
        """Tokens streamed by the current model call (its Done has not arrived)."""
        return max(0, self.output_tokens - self._generated)

    def _scan(self, text: str) -> list[ServerEvent]:
        """Output safety: a flagged text cuts the response (``incomplete``, ``content_filter``)."""
        if self.output_scan is None:
            return []
        self.output_scan.feed(text)
        if not self.output_scan.verdict.flagged:
            return []
        return self._finish("content_filter", self._generated + self._pending_tokens())

    def terminal(self, metadata: dict[str, str] | None = None) -> ResponseCompleted | ResponseIncomplete:
        """The terminal event, once ``finishing``; ``metadata`` is added to the response's."""
        assert self.state is BuildState.FINISHING
        self.state = BuildState.DONE
        r = self.response
        if metadata:
            r.metadata = {**r.metadata, **metadata}
        seq, sid = self._next(), self.stream_id
        # The response itself, not a snapshot: nothing changes it after its terminal event.
        if r.status == "incomplete":
            return ResponseIncomplete(sequence_number=seq, response=r, stream_id=sid)
        return ResponseCompleted(sequence_number=seq, response=r, stream_id=sid)

    def fail(
        self,
        code: str = "server_error",
        message: str = "The server had an error while processing your request.",
    ) -> list[ServerEvent]:
        """Terminal ``response.failed`` after ``response.created`` (docs/protocol.md §5.3)."""
        self.state = BuildState.DONE
        r = self.response
        r.status = "failed"
        r.error = ResponseErrorBody(code=code, message=message)
        if self.prompt_tokens or self.output_tokens:  # inference ran: what it used so far
            r.usage = self._usage(self._generated + self._pending_tokens())
        return [
            ResponseFailed(sequence_number=self._next(), response=self._snapshot(), stream_id=self.stream_id)
        ]

    def add_item(self, item: OutputItem) -> list[ServerEvent]:
        """A finished item that is not the model's (a compaction item): added and done."""
        out = self._close_open()
        self.response.output.append(item)
        idx, sid = len(self.response.output) - 1, self.stream_id
        out.append(
            OutputItemAdded(
                sequence_number=self._next(), output_index=idx, item=item.model_copy(), stream_id=sid
            )
        )
        if isinstance(item, OutputCompaction):  # compaction runs between the item's added and done
            out.append(
                CompactionCompacting(
                    sequence_number=self._next(), item_id=item.id, output_index=idx, stream_id=sid
                )
            )
        out.append(
            OutputItemDone(
                sequence_number=self._next(), output_index=idx, item=item.model_copy(), stream_id=sid
            )
        )
        return out

    # -- items
    def _text(self, delta: str) -> list[ServerEvent]:
        out: list[ServerEvent] = []
        if not isinstance(self._open, OutputMessage):
            out += self._close_open()
            item = OutputMessage(id=new_id("msg"))
            out += self._add(item)
            item.content.append(OutputText())
            out.append(
                ContentPartAdded(
                    sequence_number=self._next(),
                    item_id=item.id,
                    output_index=self._index,
                    content_index=0,
                    part=OutputText(),
                    stream_id=self.stream_id,
                )
            )
        msg = self._open
        assert isinstance(msg, OutputMessage)
        msg.content[0].text += delta
        out.append(
            OutputTextDelta(
                sequence_number=self._next(),
                item_id=msg.id,
                output_index=self._index,
                content_index=0,
                delta=delta,
                stream_id=self.stream_id,
            )
        )
        return out

    def _call(self, ev: FunctionCallDelta) -> list[ServerEvent]:
        out: list[ServerEvent] = []
        if self._open_call_index != ev.index:
            out += self._close_open()
            if ev.custom:
                out += self._add(OutputCustomToolCall(id=new_id("ctc"), call_id=new_id("call"), name=ev.name))
            else:
                out += self._add(OutputFunctionCall(id=new_id("fc"), call_id=new_id("call"), name=ev.name))
            self._open_call_index = ev.index
        call = self._open
        if isinstance(call, OutputCustomToolCall):
            call.input += ev.arguments_delta
            if ev.arguments_delta:
                out.append(
                    CustomToolCallInputDelta(
                        sequence_number=self._next(),
                        item_id=call.id,
                        output_index=self._index,
                        delta=ev.arguments_delta,
                        stream_id=self.stream_id,
                    )
                )
            return out
        assert isinstance(call, OutputFunctionCall)
        call.arguments += ev.arguments_delta
        if ev.arguments_delta:
            out.append(
                FunctionCallArgumentsDelta(
                    sequence_number=self._next(),
                    item_id=call.id,
                    output_index=self._index,
                    delta=ev.arguments_delta,
                    stream_id=self.stream_id,
                )
            )
        return out

    @property
    def _index(self) -> int:
        return len(self.response.output) - 1

    def _add(self, item: Streamed) -> list[ServerEvent]:
        self.response.output.append(item)
        self._open = item
        return [
            OutputItemAdded(
                sequence_number=self._next(),
                output_index=self._index,
                item=_copy(item),
                stream_id=self.stream_id,
            )
        ]

    def _close_open(self, status: Literal["completed", "incomplete"] = "completed") -> list[ServerEvent]:
        item, self._open, self._open_call_index = self._open, None, None
        if item is None:
            return []
        out: list[ServerEvent] = []
        idx, sid = self.response.output.index(item), self.stream_id
        if isinstance(item, OutputMessage):
            part = item.content[0]
            out.append(
                OutputTextDone(
                    sequence_number=self._next(),
                    item_id=item.id,
                    output_index=idx,
                    content_index=0,
                    text=part.text,
                    stream_id=sid,
                )
            )
            out.append(
                ContentPartDone(
                    sequence_number=self._next(),
                    item_id=item.id,
                    output_index=idx,
                    content_index=0,
                    part=part.model_copy(),
                    stream_id=sid,
                )
            )
        elif isinstance(item, OutputCustomToolCall):
            out.append(
                CustomToolCallInputDone(
                    sequence_number=self._next(),
                    item_id=item.id,
                    output_index=idx,
                    input=item.input,
                    stream_id=sid,
                )
            )
        else:
            out.append(
                FunctionCallArgumentsDone(
                    sequence_number=self._next(),
                    item_id=item.id,
                    output_index=idx,
                    name=item.name,
                    arguments=item.arguments,
                    stream_id=sid,
                )
            )
        item.status = status
        # The item itself: once done it never changes (the terminal event carries it too).
        out.append(OutputItemDone(sequence_number=self._next(), output_index=idx, item=item, stream_id=sid))
        return out

    def _input_details(self) -> InputTokensDetails:
        """What the prompt read from and wrote to the cache: under the breakpoint rule, the
        entries the engine wrote by lifetime; else every prompt token not reused (the block
        rule writes each block it prefills)."""
        if self.written is None:
            return InputTokensDetails(
                cached_tokens=self.cached_tokens, cache_write_tokens=self.prompt_tokens - self.reused_tokens
            )
        m30, h12 = self.written
        return InputTokensDetails(
            cached_tokens=self.cached_tokens,
            cache_write_tokens=m30 + h12,
            cache_write_tokens_details=CacheWriteTokensDetails(ttl_30m_tokens=m30, ttl_12h_tokens=h12),
        )

    def _usage(self, output_tokens: int) -> Usage:
        return Usage(
            input_tokens=self.prompt_tokens,
            input_tokens_details=self._input_details(),
            output_tokens=output_tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=self.reasoning_tokens),
            total_tokens=self.prompt_tokens + output_tokens,
        )

    def _finish(self, reason: str, output_tokens: int) -> list[ServerEvent]:
        cut = reason in ("max_output_tokens", "content_filter", "steered")
        out = self._close_open("incomplete" if cut else "completed")
        self.state = BuildState.FINISHING
        self.finish_reason = reason
        r = self.response
        r.completed_at = int(self._clock())
        r.usage = self._usage(output_tokens)
        if cut:
            r.status = "incomplete"
            r.incomplete_details = IncompleteDetails.model_validate({"reason": reason})
        else:
            r.status = "completed"
        return out


def _copy(item: OutputItem) -> OutputItem:
    """An output item as it is now, for an event encoded later: a message's parts are copied
    (the builder appends to their text); the other items' fields are strings the builder only
    assigns, so a shallow copy is one (no deep copy of a function call a turn)."""
    return item.model_copy(deep=isinstance(item, OutputMessage))


def new_response(
    create: ResponseCreate, store: bool, clock: Callable[[], float], tools: list[JSONObject], response_id: str
) -> ResponseObject:
    """The Response object of a create, in progress (docs/protocol.md §3.4: every key present).
    ``tools``: the create's tools as echoed (:func:`echo_tools`, kept by the connection while
    unchanged); that very list is the response's, so an encoder can tell it by identity.
    ``response_id``: its id, which its model call has already."""
    response = ResponseObject(
        id=response_id,
        created_at=int(clock()),
        status="in_progress",
        model=create.model or "",
        instructions=create.instructions,
        max_output_tokens=create.max_output_tokens,
        max_tool_calls=create.max_tool_calls,
        parallel_tool_calls=parallel_tool_calls(create),
        previous_response_id=create.previous_response_id,
        reasoning=create.reasoning,
        store=store,
        temperature=_or(create.temperature, 1.0),
        top_p=_or(create.top_p, 1.0),
        presence_penalty=_or(create.presence_penalty, 0.0),
        frequency_penalty=_or(create.frequency_penalty, 0.0),
        top_logprobs=_or(create.top_logprobs, 0),
        text=echo_text(create.text),
        tool_choice=_or(create.tool_choice, "auto"),
        tools=[],
        truncation=create.truncation or "disabled",
        user=create.user,
        metadata=create.metadata or {},
        # The tier that served the request: the emulator has one, so "auto" resolves to it.
        service_tier=create.service_tier if create.service_tier not in (None, "auto") else "default",
        prompt_cache_key=create.prompt_cache_key,
        safety_identifier=create.safety_identifier,
        **_cache_echo(create),
    )
    response.tools = tools  # an assignment is not validated: the list itself, not a copy
    return response


def _cache_echo(create: ResponseCreate) -> dict[str, object]:
    """``prompt_cache_options`` as applied, and the diagnostics a ``comparison_response_id``
    asks for: the emulator computes none, so it answers with the SDK's ``unavailable``
    variant (docs/protocol.md §3.4)."""
    options = create.prompt_cache_options
    if options is None:
        return {}
    applied = AppliedCacheOptions(
        mode=options.mode, ttl=options.ttl, comparison_response_id=options.comparison_response_id
    )
    diagnostics = {"type": "unavailable"} if options.comparison_response_id is not None else None
    return {"prompt_cache_options": applied, "prompt_cache_diagnostics": diagnostics}


def parallel_tool_calls(create: ResponseCreate) -> bool:
    return _or(create.parallel_tool_calls, True)


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


def tool_choice_name(choice: str | JSONObject | None) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return choice
    return str(choice.get("name") or choice.get("mode") or "auto")


def echo_text(text: TextConfig | None) -> TextConfig:
    """``text`` as the Response echoes it (docs/protocol.md §3.4): the format, and the verbosity
    that applied — ``medium`` unless the create asked, never null (Open Responses allows the
    key absent or one of ``low``/``medium``/``high``)."""
    text = text or TextConfig()
    return text if text.verbosity else text.model_copy(update={"verbosity": "medium"})


def echo_tools(tools: Sequence[BaseModel]) -> list[JSONObject]:
    return [echo_tool(t) for t in tools]


def echo_tool(tool: BaseModel) -> JSONObject:
    if isinstance(tool, FunctionTool):
        data = tool.model_dump()
        data.setdefault("description", None)
        data["strict"] = True if tool.strict is None else tool.strict
        return data
    return tool.model_dump()
