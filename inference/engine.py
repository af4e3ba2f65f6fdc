"""The per-replica inference engine (pure Python; the Serve deployment wraps it).

``Engine.generate(request)`` turns one ``InferenceRequest`` into the stream described in
``inference.types``: items of ``TextDelta``/``FunctionCallDelta`` paced by the profile,
the first item led by ``Prefilled`` (it goes with the first token, when that token is due)
and the last item ending with ``Done``; an answer that fits in one chunk is the single
item ``[Prefilled, deltas..., Done]``.  The output follows the scripted policy; time comes
from the injected clock and sleeper, so a fake clock makes every emitted time exact in tests.

After a response completes, the prefix cache holds ``prompt + rendered output`` for the
session, rendered with the same ``chat_format`` functions the session uses for output
items; the next turn's prompt therefore starts with it and is a full-prefix hit.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

from inference import chat_format
from inference.pacing import Chunker, Clock, Sleeper, paced_chunks, token_deadlines, ttft_ms
from inference.policy import FunctionCallSegment, OutputPlan, Segment, plan
from inference.prefix_cache import PrefixCache
from inference.profiles import InferenceConfig, ModelProfile
from inference.tokenizer import Detokenizer
from inference.types import (
    Done,
    FinishReason,
    FunctionCallDelta,
    InferenceEvent,
    InferenceRequest,
    Prefilled,
    TextDelta,
)


class Engine:
    """One replica's engine: latency model, prefix cache and scripted output."""

    def __init__(self, config: InferenceConfig, clock: Clock, sleeper: Sleeper) -> None:
        self._config = config
        self._clock = clock
        self._sleeper = sleeper
        self._cache = PrefixCache(config.prefix_cache_sessions)
        self._requests = 0
        self._active = 0
        self._completed = 0
        self._cancelled = 0
        self._output_tokens_total = 0

    @property
    def config(self) -> InferenceConfig:
        return self._config

    @property
    def prefix_cache(self) -> PrefixCache:
        return self._cache

    async def generate(self, request: InferenceRequest) -> AsyncIterator[list[InferenceEvent]]:
        """Stream one response as chunks of events (see ``inference.types`` for the order).

        Raises ``ModelNotFound`` (unknown ``request.model``) or ``UnknownToolChoice`` before
        anything is yielded.  ``generate=False`` only prefills: the prompt is stored in the
        prefix cache and the stream is one item ``[Prefilled, Done("stop", 0, 0.0)]``.  If the
        consumer stops early (``aclose()``/cancellation) the exception propagates and the
        prefix cache is left as it was: only a finished response is stored.
        """
        profile = self._config.profile(request.model)
        output = plan(request, self._config.policy) if request.generate else None
        prompt = request.prompt_token_ids
        t_start = self._clock.now()
        self._requests += 1
        self._active += 1
        finished = False
        try:
            cached = self._cache.lookup(request.session_key, prompt)
            prefill_ms = ttft_ms(profile, len(prompt), cached)
            t_first = t_start + prefill_ms / 1000.0
            prefilled = Prefilled(len(prompt), cached, queue_ms=0.0, prefill_ms=prefill_ms)
            if output is None:
                await self._sleeper.sleep_until(t_first)
                self._cache.store(request.session_key, prompt)
                finished = True
                yield [prefilled, Done("stop", 0, 0.0)]
                return
            # Prefilled rides in the first item (with the first token): one Ray item fewer
            # per turn.  aclosing: if we are closed mid-stream, close the inner generator now.
            first: list[InferenceEvent] = [prefilled]
            async with aclosing(self._decode(request, profile, output, t_first)) as stream:
                async for events in stream:
                    finished = isinstance(events[-1], Done)
                    yield first + events
                    first = []
        except (GeneratorExit, asyncio.CancelledError):
            if not finished:
                self._cancelled += 1
            raise
        finally:
            self._active -= 1
            if finished:
                self._completed += 1

    async def _decode(
        self,
        request: InferenceRequest,
        profile: ModelProfile,
        output: OutputPlan,
        t_first: float,
    ) -> AsyncIterator[list[InferenceEvent]]:
        total = output.total_tokens
        limit = request.max_output_tokens
        n = total if limit is None else max(0, min(total, limit))
        streams = _segment_streams(output.segments)
        deadlines = token_deadlines(profile, t_first, n)
        chunker = Chunker(deadlines, t_first, profile.chunk_ms, profile.min_chunk_tokens)
        events: list[InferenceEvent] = []
        if n == 0:
            await self._sleeper.sleep_until(t_first)  # nothing to decode, prefill still costs
        async for start, end in paced_chunks(chunker, self._clock, self._sleeper):
            events = [e for s in streams if (e := s.take(start, end, n)) is not None]
            if end < n and events:  # a chunk holding only part of a character waits
                yield events
        # The final item: the last chunk's events (if any) plus Done.  Store first, so a
        # consumer that stops right after Done still leaves the finished state cached.
        held = array("I", request.prompt_token_ids)
        for stream in streams:
            held.extend(stream.rendered())
        self._cache.store(request.session_key, held)
        self._output_tokens_total += n
        reason: FinishReason
        if n < total:
            reason = "max_output_tokens"
        elif any(isinstance(s, FunctionCallSegment) for s in output.segments):
            reason = "tool_calls"
        else:
            reason = "stop"
        decode_ms = (deadlines[-1] - t_first) * 1000.0 if n else 0.0
        yield [*events, Done(reason, n, decode_ms)]

    def stats(self) -> dict[str, Any]:
        """Counters for this replica, including the prefix cache's."""
        return {
            "requests": self._requests,
            "active": self._active,
            "completed": self._completed,
            "cancelled": self._cancelled,
            "output_tokens_total": self._output_tokens_total,
            "prefix_cache": self._cache.stats(),
        }


class _SegmentStream:
    """Turns one planned segment's tokens, taken chunk by chunk, into deltas.

    Token ranges are global (over the whole response); the stream handles the part that
    falls inside its segment.  A chunk that ends inside a multibyte character yields no
    text; its tokens are carried into the next delta, so ``sum(delta.tokens)`` is exact.
    """

    def __init__(self, segment: Segment, offset: int, call_index: int) -> None:
        self._segment = segment
        self._offset = offset
        self._call_index = call_index
        self._detokenizer = Detokenizer()
        self._parts: list[str] = []
        self._carried = 0
        self._started = False

    def take(self, start: int, end: int, limit: int) -> InferenceEvent | None:
        seg_end = min(self._offset + len(self._segment.token_ids), limit)
        lo, hi = max(start, self._offset), min(end, seg_end)
        if lo >= hi:
            return None
        ids = self._segment.token_ids[lo - self._offset : hi - self._offset]
        text = self._detokenizer.feed(ids)
        if hi == seg_end:
            text += self._detokenizer.finish()
        self._started = True
        self._carried += len(ids)
        if not text:
            return None
        self._parts.append(text)
        tokens, self._carried = self._carried, 0
        if isinstance(self._segment, FunctionCallSegment):
            return FunctionCallDelta(self._call_index, self._segment.name, text, tokens)
        return TextDelta(text, tokens)

    def rendered(self) -> list[int]:
        """The output item as the session will render it (empty if nothing was emitted)."""
        if not self._started:
            return []
        text = "".join(self._parts)
        if isinstance(self._segment, FunctionCallSegment):
            return chat_format.render_function_call(self._segment.name, text)
        return chat_format.render_message("assistant", text)


def _segment_streams(segments: Sequence[Segment]) -> list[_SegmentStream]:
    streams = []
    offset = 0
    calls = 0
    for segment in segments:
        streams.append(_SegmentStream(segment, offset, calls))
        offset += len(segment.token_ids)
        if isinstance(segment, FunctionCallSegment):
            calls += 1
    return streams

