"""Turn a stream of inference chunks into the Responses streaming events of one response.

Shape: ``start()`` → ``feed(chunk)``* → terminal (``feed`` of the chunk holding ``Done``, or
``fail(exc)``).  Event order is exactly spec §3.2 (text) / §3.3 (function calls);
``sequence_number`` counts from 0 per response; item ids, ``output_index`` and
``content_index`` stay consistent.  One protocol delta per inference chunk, never per token.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

from inference.types import Done, FunctionCallDelta, InferenceEvent, Prefilled, TextDelta

from .ids import new_id
from .protocol import (
    ContentPartAdded,
    ContentPartDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    IncompleteDetails,
    InputTokensDetails,
    OutputFunctionCall,
    OutputItem,
    OutputItemAdded,
    OutputItemDone,
    OutputMessage,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    ResponseCompleted,
    ResponseCreated,
    ResponseErrorBody,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseObject,
    ServerEvent,
    Usage,
)


class BuildState(enum.Enum):
    NEW = "new"
    STREAMING = "streaming"
    DONE = "done"


class ResponseBuilder:
    def __init__(self, response: ResponseObject, *, stream_id: str | None, clock: Callable[[], float]):
        self.response = response
        self.stream_id = stream_id
        self._clock = clock
        self._seq = 0
        self.state = BuildState.NEW
        self._open: OutputItem | None = None
        self._open_call_index: int | None = None
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.finish_reason: str | None = None

    # -- helpers
    def _next(self) -> int:
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def _snapshot(self) -> ResponseObject:
        return self.response.model_copy(deep=True)

    @property
    def output(self) -> list[OutputItem]:
        return self.response.output

    # -- lifecycle
    def start(self) -> list[ServerEvent]:
        assert self.state is BuildState.NEW
        self.state = BuildState.STREAMING
        sid = self.stream_id
        return [
            ResponseCreated(sequence_number=self._next(), response=self._snapshot(), stream_id=sid),
            ResponseInProgress(sequence_number=self._next(), response=self._snapshot(), stream_id=sid),
        ]

    def feed(self, chunk: Sequence[InferenceEvent]) -> list[ServerEvent]:
        out: list[ServerEvent] = []
        for ev in chunk:
            if isinstance(ev, Prefilled):
                self.prompt_tokens, self.cached_tokens = ev.prompt_tokens, ev.cached_tokens
            elif isinstance(ev, TextDelta):
                out += self._text(ev.text)
            elif isinstance(ev, FunctionCallDelta):
                out += self._call(ev)
            elif isinstance(ev, Done):
                out += self._finish(ev)
        return out

    def fail(self, code: str = "server_error",
             message: str = "The server had an error while processing your request.") -> list[ServerEvent]:
        """Terminal ``response.failed`` after ``response.created`` (spec §5.3)."""
        self.state = BuildState.DONE
        r = self.response
        r.status = "failed"
        r.error = ResponseErrorBody(code=code, message=message)
        return [ResponseFailed(sequence_number=self._next(), response=self._snapshot(), stream_id=self.stream_id)]

    # -- items
    def _text(self, delta: str) -> list[ServerEvent]:
        out: list[ServerEvent] = []
        if not isinstance(self._open, OutputMessage):
            out += self._close_open()
            item = OutputMessage(id=new_id("msg"))
            out += self._add(item)
            item.content.append(OutputText())
            out.append(ContentPartAdded(
                sequence_number=self._next(), item_id=item.id, output_index=self._index,
                content_index=0, part=OutputText(), stream_id=self.stream_id))
        msg = self._open
        assert isinstance(msg, OutputMessage)
        msg.content[0].text += delta
        out.append(OutputTextDelta(
            sequence_number=self._next(), item_id=msg.id, output_index=self._index, content_index=0,
            delta=delta, stream_id=self.stream_id))
        return out

    def _call(self, ev: FunctionCallDelta) -> list[ServerEvent]:
        out: list[ServerEvent] = []
        if self._open_call_index != ev.index:
            out += self._close_open()
            out += self._add(OutputFunctionCall(id=new_id("fc"), call_id=new_id("call"), name=ev.name))
            self._open_call_index = ev.index
        call = self._open
        assert isinstance(call, OutputFunctionCall)
        call.arguments += ev.arguments_delta
        if ev.arguments_delta:
            out.append(FunctionCallArgumentsDelta(
                sequence_number=self._next(), item_id=call.id, output_index=self._index,
                delta=ev.arguments_delta, stream_id=self.stream_id))
        return out

    @property
    def _index(self) -> int:
        return len(self.response.output) - 1

    def _add(self, item: OutputItem) -> list[ServerEvent]:
        self.response.output.append(item)
        self._open = item
        return [OutputItemAdded(sequence_number=self._next(), output_index=self._index,
                                item=item.model_copy(deep=True), stream_id=self.stream_id)]

    def _close_open(self, status: str = "completed") -> list[ServerEvent]:
        item, self._open, self._open_call_index = self._open, None, None
        if item is None:
            return []
        out: list[ServerEvent] = []
        idx, sid = self.response.output.index(item), self.stream_id
        if isinstance(item, OutputMessage):
            part = item.content[0]
            out.append(OutputTextDone(sequence_number=self._next(), item_id=item.id, output_index=idx,
                                      content_index=0, text=part.text, stream_id=sid))
            out.append(ContentPartDone(sequence_number=self._next(), item_id=item.id, output_index=idx,
                                       content_index=0, part=part.model_copy(), stream_id=sid))
        else:
            out.append(FunctionCallArgumentsDone(sequence_number=self._next(), item_id=item.id,
                                                 output_index=idx, name=item.name,
                                                 arguments=item.arguments, stream_id=sid))
        item.status = status  # type: ignore[assignment]
        out.append(OutputItemDone(sequence_number=self._next(), output_index=idx,
                                  item=item.model_copy(deep=True), stream_id=sid))
        return out

    def _finish(self, done: Done) -> list[ServerEvent]:
        truncated = done.finish_reason == "max_output_tokens"
        out = self._close_open("incomplete" if truncated else "completed")
        self.state = BuildState.DONE
        self.finish_reason = done.finish_reason
        r = self.response
        r.completed_at = int(self._clock())
        r.usage = Usage(
            input_tokens=self.prompt_tokens,
            input_tokens_details=InputTokensDetails(
                cached_tokens=self.cached_tokens,
                # Tokens newly written to the prefix cache by this request's prefill.
                cache_write_tokens=self.prompt_tokens - self.cached_tokens,
            ),
            output_tokens=done.output_tokens,
            total_tokens=self.prompt_tokens + done.output_tokens,
        )
        seq, sid = self._next(), self.stream_id
        if truncated:
            r.status = "incomplete"
            r.incomplete_details = IncompleteDetails(reason="max_output_tokens")
            out.append(ResponseIncomplete(sequence_number=seq, response=self._snapshot(), stream_id=sid))
        else:
            r.status = "completed"
            out.append(ResponseCompleted(sequence_number=seq, response=self._snapshot(), stream_id=sid))
        return out
