"""The per-replica inference engine (pure Python; the Serve deployment wraps it).

``Engine.generate(request)`` turns one ``InferenceRequest`` into the stream described in
``inference.types``: items of ``TextDelta``/``FunctionCallDelta`` paced by the profile,
the first item led by ``Prefilled`` (it goes with the first token, when that token is due)
and the last item ending with ``Done``; an answer that fits in one chunk is the single
item ``[Prefilled, deltas..., Done]``.  The output follows the scripted policy; time comes
from the injected clock and sleeper, so a fake clock makes every emitted time exact in tests.

One request's life (docs/emulator.md):

1. it joins its model's batch (``batching.Batch``) or waits FIFO for a slot;
2. once admitted, the prefix cache is consulted; prefill takes
   ``(overhead + uncached * cost) * request jitter``;
3. its tokens are due on a ``DecodeSchedule`` whose step factor follows the batch size;
   due tokens go out in chunks (``pacing.Chunker``), whose window stretches when so many
   streams run that the replica would send more than ``max_items_per_s`` items
   (``pacing.ItemWindow``);
4. the slot is freed when the last token is sent or the consumer goes away.

The prompt's blocks enter the prefix cache when prefill completes; after the response
completes the cache also holds the rendered output, rendered with the same ``chat_format``
functions the session uses for output items, so the next turn's prompt starts with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from array import array
from collections.abc import AsyncGenerator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from inference import chat_format
from inference.emulator import breakpoint_cache
from inference.emulator.batching import Batch, DecodeSchedule
from inference.emulator.breakpoint_cache import BreakpointCache, prefix_key
from inference.emulator.jitter import RequestJitter
from inference.emulator.pacing import Chunker, Clock, ItemWindow, Sleeper, decode_work, paced_chunks, ttft_ms
from inference.emulator.policy import (
    FunctionCallSegment,
    OutputPlan,
    PolicyMemo,
    ReasoningSegment,
    Segment,
    TextSegment,
    plan,
)
from inference.emulator.prefix_cache import (
    Lookup,
    PrefixCache,
    as_bytes,
    block_keys,
    chain_keys,
    reported_cached_tokens,
)
from inference.emulator.profiles import InferenceConfig, ModelProfile
from inference.emulator.prompt_memo import Digest, Known, PromptMemo, digest_of
from inference.tokenizer import Detokenizer, decode, token_bytes
from inference.types import (
    Done,
    FinishReason,
    FunctionCallDelta,
    InferenceEvent,
    InferenceRequest,
    Prefilled,
    ReasoningDone,
    TextDelta,
)


class Observer(Protocol):
    """Where the engine reports measurements (the deployment sends them to Ray metrics)."""

    def first_token(self, model: str, ttft_s: float) -> None:
        """Arrival to first token sent, queueing included (once per response)."""

    def tokens(self, model: str, n: int) -> None:
        """``n`` tokens sent in one item (the first token's item too)."""

    def itl(self, model: str, itl_s: float) -> None:
        """Once per response of two tokens or more: the mean time between its tokens after
        the first, as sent (from the first token's item to the last item, per token)."""

    def batch(self, model: str, running: int, waiting: int) -> None:
        """The model's batch changed."""

    def prefix(self, hit_blocks: int, miss_blocks: int, evicted_blocks: int) -> None:
        """Prefix-cache block counts of one lookup or insert."""


class NullObserver:
    def first_token(self, model: str, ttft_s: float) -> None:
        pass

    def tokens(self, model: str, n: int) -> None:
        pass

    def itl(self, model: str, itl_s: float) -> None:
        pass

    def batch(self, model: str, running: int, waiting: int) -> None:
        pass

    def prefix(self, hit_blocks: int, miss_blocks: int, evicted_blocks: int) -> None:
        pass


class Engine:
    """One replica's engine: batches, latency model, prefix cache and scripted output."""

    def __init__(
        self,
        config: InferenceConfig,
        clock: Clock,
        sleeper: Sleeper,
        observer: Observer | None = None,
        replica: str = "",
    ) -> None:
        self._config = config
        self._clock = clock
        self._sleeper = sleeper
        self._observer: Observer = observer or NullObserver()
        self._replica = replica
        pc = config.prefix_cache
        self._cache = PrefixCache(pc.capacity_blocks, pc.block_tokens)
        self._breakpoints = BreakpointCache(pc.capacity_tokens, pc.max_entries)  # profiles of that rule
        self._memo = PromptMemo()  # each session's conversation as last cached: hash only what is new
        self._policies = PolicyMemo(config.policy)  # each distinct metadata's policy, validated once
        self._batches = {p.id: Batch(p.batching) for p in config.profiles}
        self._schedules: dict[str, dict[Hashable, DecodeSchedule]] = {p.id: {} for p in config.profiles}
        self._windows = {p.id: ItemWindow.of(p) for p in config.profiles}
        self._admissions: dict[Hashable, asyncio.Future[float]] = {}
        self._roots = {p.id: _stable_root(p.id) for p in config.profiles}
        self._requests = 0
        self._active = 0
        self._completed = 0
        self._cancelled = 0
        self._output_tokens_total = 0
        self._queue_ms_total = 0.0

    @property
    def config(self) -> InferenceConfig:
        return self._config

    @property
    def prefix_cache(self) -> PrefixCache:
        return self._cache

    def batch(self, model: str) -> Batch:
        return self._batches[model]

    async def generate(self, request: InferenceRequest) -> AsyncGenerator[list[InferenceEvent], None]:
        """Stream one response as chunks of events (see ``inference.types`` for the order).

        Raises ``UnknownModelProfile`` (unknown ``request.model``), ``UnknownToolChoice``,
        ``InvalidMetadata`` or ``EngineOverloaded`` before anything is yielded.
        ``generate=False`` only prefills: the prompt is stored in the prefix cache and the
        stream is one item ``[Prefilled, Done("stop", 0, 0.0)]``.  If the consumer stops
        early (``aclose()``/cancellation) the exception propagates, the batch slot is freed
        at once, and the cache keeps the prompt's blocks if prefill had completed.
        """
        t_arrive = self._clock.now()  # the emulated time of this request starts now, so
        # the replica's own work (planning, hashing) overlaps the emulated prefill
        call = self._intake(request, t_arrive)
        output = self._plan(call) if request.generate else None
        jitter = RequestJitter(call.profile.jitter, request.request_id)
        model = call.profile.id
        batch = self._batches[model]
        seq = object()
        admitted = batch.submit(seq)  # EngineOverloaded: nothing started
        self._requests += 1
        self._active += 1
        sent = _Sent()
        try:
            t_admit = t_arrive if admitted else await self._admission(model, batch, seq)
            self._rebatch(model, t_admit)
            prefilled = self._prefill(call, jitter, t_admit)
            t_first = t_admit + prefilled.prefill_ms / 1000.0
            if output is None:
                await self._sleeper.sleep_until(t_first, precise=True)
                self._cache_kv(call)
                sent.finished = True
                yield [prefilled, Done("stop", 0, 0.0)]
                return
            decoding = self._decode(call, output, prefilled, jitter, seq, t_first, sent)
            async with contextlib.aclosing(decoding) as items:
                async for item in items:
                    yield item
        except (GeneratorExit, asyncio.CancelledError):
            if not sent.finished:
                self._cancelled += 1
            raise
        finally:
            self._settle(call, sent)
            self._active -= 1
            if sent.finished:
                self._completed += 1
            self._release(model, seq)

    def _intake(self, request: InferenceRequest, arrived: float) -> _Call:
        """A request's model, its prompt's bytes and what this replica remembers of its
        session's conversation (``inference.emulator.prompt_memo``)."""
        profile = self._config.profile(request.model)
        root = self._root(profile.id, request.cache_scope)
        data = as_bytes(request.prompt_token_ids)
        known = self._memo.recall(request.session_key, root, data)
        return _Call(request, arrived, profile, root, data, known, profile.prompt_cache == "blocks")

    def _plan(self, call: _Call) -> OutputPlan:
        """The scripted output; its seed is the prompt's digest, continued from the memo's."""
        policy = self._policies.policy(call.request)

        def prompt_seed() -> int:
            value, call.digest = digest_of(call.data, policy.seed, call.known)
            return int.from_bytes(value, "little")

        return plan(call.request, policy, prompt_seed)

    def _prefill(self, call: _Call, jitter: RequestJitter, t_admit: float) -> Prefilled:
        """Consult the prompt cache under the profile's rule; the prefill's figures."""
        written: tuple[int, int] | None = None
        if call.blocks:
            known = call.known.keys if call.known is not None else ()
            call.found = self._cache.lookup(call.request.prompt_token_ids, call.root, known)
            self._observer.prefix(call.found.hit_blocks, call.found.miss_blocks, 0)
        else:
            call.found, written = self._serve_breakpoints(call.request, call.data, call.root, call.known)
        return self._prefilled(
            call.profile,
            len(call.request.prompt_token_ids),
            call.found.reused_tokens,
            jitter,
            call.arrived,
            t_admit,
            blocks=call.blocks,
            written=written,
        )

    async def _decode(
        self,
        call: _Call,
        output: OutputPlan,
        prefilled: Prefilled,
        jitter: RequestJitter,
        seq: Hashable,
        t_first: float,
        sent: _Sent,
    ) -> AsyncGenerator[list[InferenceEvent], None]:
        """The output's items as they fall due, the first led by ``prefilled``, the last
        ending with ``Done``; ``sent`` follows what went out (for :meth:`_settle`)."""
        model = call.profile.id
        total = output.total_tokens
        limit = call.request.max_output_tokens
        n = total if limit is None else max(0, min(total, limit))
        schedule = self._schedule(call, n, jitter, seq, t_first)
        chunker = Chunker(schedule, t_first, self._windows[model])
        streams = _segment_streams(output.segments)
        # The output as the conversation continues with it, rendered now if it will be
        # sent whole: this replica has nothing else to do for this call until prefill ends.
        whole = [t for stream in streams for t in stream.whole()] if n == total else None
        first: list[InferenceEvent] = [prefilled]
        events: list[InferenceEvent] = []
        if n == 0:
            await self._sleeper.sleep_until(t_first, precise=True)  # nothing to decode, prefill still costs
        else:
            t_last = call.arrived
            async for start, end in paced_chunks(chunker, self._clock, self._sleeper):
                now = self._clock.now()
                if start == 0:
                    sent.kv = ()  # prefill is done: the prompt's KV exists
                events = [e for s in streams if (e := s.take(start, end, n)) is not None]
                # A chunk's metrics are recorded once it is out, the last one's once Done is.
                sent.seen = (start, end, now - t_last)
                t_last = now
                sent.last_out = (now, end)
                if start == 0:
                    sent.first_out = sent.last_out
                if end < n:
                    if events:  # a chunk holding only part of a character waits
                        yield first + events
                        first = []
                        if sent.kv is not None:  # cached once the tokens it made are out
                            self._cache_kv(call, sent.kv)
                            sent.kv = None
                    self._seen(model, *sent.seen)
                    sent.seen = None
        if events and self._windows[model].aligned:
            # Under load the last tokens leave when they are due, before the end work
            # (rendering and caching the output) that every stream ending on the same
            # tick would otherwise queue in front of them; Done follows on its own.
            yield first + events
            first, events = [], []
        # The final item: the last chunk's events (if any) plus Done.  The finished
        # state is cached after it is out (also if the consumer stops right after Done:
        # :meth:`_settle`), so caching a long conversation never delays a response's end.
        rendered = whole if whole is not None else [t for stream in streams for t in stream.rendered()]
        sent.kv = rendered
        self._output_tokens_total += n
        reason = _finish_reason(n, total, output.segments)
        decode_ms = (schedule.deadline(n - 1) - t_first) * 1000.0 if n else 0.0
        sent.finished = True
        # The output as the conversation continues with it: the session appends these ids
        # instead of rendering the output items again (the same chat_format functions
        # over the same text, so the same ids, and what the next prompt's cache hit is on).
        yield first + [*events, Done(reason, n, decode_ms, tuple(rendered) if rendered else None)]

    def _schedule(
        self, call: _Call, n: int, jitter: RequestJitter, seq: Hashable, t_first: float
    ) -> DecodeSchedule:
        """When each of ``n`` output tokens is due, from ``t_first``; it follows the batch."""
        model = call.profile.id
        token_factors = jitter.tokens(n) if call.profile.jitter.token_sigma else None
        work = decode_work(call.profile, n, jitter.request, token_factors)
        schedule = DecodeSchedule(work, t_first, self._batches[model].factor)
        self._schedules[model][seq] = schedule
        return schedule

    def _settle(self, call: _Call, sent: _Sent) -> None:
        """After the stream, however it ended: the metrics of what went out, and the KV made
        cached."""
        model = call.profile.id
        if sent.seen is not None:
            self._seen(model, *sent.seen)
        first_out, last_out = sent.first_out, sent.last_out
        if first_out is not None and last_out is not None and last_out[1] > first_out[1]:
            self._observer.itl(model, (last_out[0] - first_out[0]) / (last_out[1] - first_out[1]))
        if sent.kv is not None:
            self._cache_kv(call, sent.kv)

    async def _admission(self, model: str, batch: Batch, seq: Hashable) -> float:
        """Wait for a slot in the model's full batch; the emulated time it is admitted."""
        waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._admissions[seq] = waiter
        self._observer.batch(model, batch.running, batch.waiting)
        return await waiter

    def _prefilled(
        self,
        profile: ModelProfile,
        prompt_tokens: int,
        reused: int,
        jitter: RequestJitter,
        t_arrive: float,
        t_admit: float,
        *,
        blocks: bool,
        written: tuple[int, int] | None,
    ) -> Prefilled:
        """The prefill's figures: its queue wait and its emulated time for what the cache missed;
        ``cached_tokens`` by the block rule's steps (``blocks``) or exactly what was read, and
        the breakpoint rule's writes by lifetime (``written``)."""
        prefill_ms = ttft_ms(profile, prompt_tokens, reused) * jitter.request
        queue_ms = (t_admit - t_arrive) * 1000.0
        self._queue_ms_total += queue_ms
        return Prefilled(
            prompt_tokens,
            reported_cached_tokens(reused) if blocks else reused,
            queue_ms,
            prefill_ms,
            reused_tokens=reused,
            replica=self._replica,
            written=written,
        )

    def _seen(self, model: str, start: int, end: int, waited_s: float) -> None:
        """A chunk of tokens ``[start, end)`` went out ``waited_s`` after the one before it
        (the first token: after the request arrived)."""
        if start == 0:
            self._observer.first_token(model, waited_s)
        self._observer.tokens(model, end - start)

    def _root(self, model: str, scope: str | None) -> int:
        """Where this request's block chains start: per model and per cache scope (the API
        key's, see ``PrefixCacheConfig``); a request without a scope uses the model's root."""
        if scope is None:
            return self._roots[model]
        return hash((self._roots[model], scope))

    def _cache_kv(self, call: _Call, output: Sequence[int] = ()) -> None:
        """Cache the KV of the call's prompt followed by ``output`` under the block rule, and
        remember them as its session's conversation (``inference.emulator.prompt_memo``): the
        breakpoint rule's keys chain on the same block keys.  Only the blocks past what the
        lookup computed are hashed."""
        prompt, block = call.request.prompt_token_ids, self._cache.block_tokens
        known = call.found.keys if call.found is not None else ()
        if output:  # the blocks past the known ones, read from the prompt's tail and the output
            start = min(len(known), len(prompt) // block) * block
            tail = array("I", prompt[start:])
            tail.extend(output)
            keys = [
                *known[: start // block],
                *chain_keys(tail, block, known[start // block - 1] if start else call.root),
            ]
        else:
            keys = block_keys(prompt, block, known, call.root)
        evicted = self._cache.insert_keys(keys) if call.blocks else 0
        if evicted:
            self._observer.prefix(0, 0, evicted)
        output_bytes = array("I", output).tobytes() if output else b""
        known_now = Known(call.data, output_bytes, call.root, tuple(keys), call.digest)
        self._memo.remember(call.request.session_key, known_now)

    def _serve_breakpoints(
        self, request: InferenceRequest, data: bytes, root: int, known: Known | None
    ) -> tuple[Lookup, tuple[int, int]]:
        """The breakpoint rule (``inference.emulator.breakpoint_cache``): read the longest held
        candidate, write the request's breakpoints; the prompt's block keys (hashed only past
        what ``known`` holds) for the memo."""
        n = len(data) // 4
        block = self._cache.block_tokens
        keys = block_keys(request.prompt_token_ids, block, known.keys if known is not None else (), root)
        todo = breakpoint_cache.plan(request.breakpoints, n, request.cache_mode, request.cache_ttl)
        outcome = self._breakpoints.serve(
            [(o, prefix_key(data, o, block, keys, root)) for o in todo.candidates],
            [(o, prefix_key(data, o, block, keys, root), ttl) for o, ttl in todo.writes],
            self._clock.now(),
        )
        return Lookup(outcome.read, 0, 0, tuple(keys)), outcome.written

    def _rebatch(self, model: str, t: float) -> None:
        """The batch changed at ``t``: every running sequence's step factor follows."""
        batch = self._batches[model]
        factor = batch.factor
        for schedule in self._schedules[model].values():
            schedule.set_factor(t, factor)
        self._windows[model].follow(batch.running)
        self._observer.batch(model, batch.running, batch.waiting)

    def _release(self, model: str, seq: Hashable) -> None:
        """Free ``seq``'s slot (or queue place) and admit whoever waits next."""
        self._schedules[model].pop(seq, None)
        self._admissions.pop(seq, None)
        now = self._clock.now()
        for nxt in self._batches[model].release(seq):
            waiter = self._admissions.pop(nxt)
            if not waiter.done():
                waiter.set_result(now)
        self._rebatch(model, now)

    def sequences(self) -> int:
        """Sequences in every batch of this replica, running and waiting: its load as the
        autoscaler sees it (calls over the direct channel included)."""
        return sum(b.running + b.waiting for b in self._batches.values())

    def stats(self) -> dict[str, Any]:
        """Counters for this replica, including the prefix cache's and each batch's."""
        return {
            "requests": self._requests,
            "active": self._active,
            "completed": self._completed,
            "cancelled": self._cancelled,
            "output_tokens_total": self._output_tokens_total,
            "queue_ms_total": self._queue_ms_total,
            "batches": {m: {"running": b.running, "waiting": b.waiting} for m, b in self._batches.items()},
            "prefix_cache": self._cache.stats(),
            "breakpoint_cache": self._breakpoints.stats(),
        }


@dataclass(slots=True)
class _Call:
    """One request as the engine works on it: its model, its prompt (bytes, what the memo
    knew), the prompt digest once the plan asked for it, and the cache lookup."""

    request: InferenceRequest
    arrived: float  # the emulated time it arrived
    profile: ModelProfile
    root: int
    data: bytes
    known: Known | None
    blocks: bool  # the block rule (else the breakpoint rule)
    digest: Digest | None = None
    found: Lookup | None = None


@dataclass(slots=True)
class _Sent:
    """What of a stream has gone out: whether its end did, the last chunk's metrics not yet
    recorded, the first and latest item's (time, end token), and the KV made but not cached
    (the output ids after the prompt; ``()``: the prompt alone)."""

    finished: bool = False
    seen: tuple[int, int, float] | None = None
    first_out: tuple[float, int] | None = None
    last_out: tuple[float, int] | None = None
    kv: Sequence[int] | None = None


def _stable_root(model: str) -> int:
    """A chain root per model, so two models never share KV blocks."""
    return hash(("model", model))


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
        # Each token's bytes, taken now (the stream is made while its prompt is in prefill),
        # so sending a chunk joins bytes instead of calling the tokenizer as tokens fall due.
        self._bytes = [] if isinstance(segment, ReasoningSegment) else _token_bytes(segment.token_ids)
        self._parts: list[str] = []
        self._carried = 0
        self._taken = 0  # of the segment's tokens
        self._started = False

    def take(self, start: int, end: int, limit: int) -> InferenceEvent | None:
        seg_end = min(self._offset + len(self._segment.token_ids), limit)
        lo, hi = max(start, self._offset), min(end, seg_end)
        if lo >= hi:
            return None
        if isinstance(self._segment, ReasoningSegment):  # hidden: one count when it ends
            self._carried += hi - lo
            if hi < seg_end:
                return None
            tokens, self._carried = self._carried, 0
            return ReasoningDone(tokens)
        text = self._detokenizer.feed_bytes(b"".join(self._bytes[lo - self._offset : hi - self._offset]))
        if hi == seg_end:
            text += self._detokenizer.finish()
        self._started = True
        self._carried += hi - lo
        self._taken += hi - lo
        if not text:
            return None
        self._parts.append(text)
        tokens, self._carried = self._carried, 0
        if isinstance(self._segment, FunctionCallSegment):
            return FunctionCallDelta(
                self._call_index, self._segment.name, text, tokens, custom=self._segment.custom
            )
        return TextDelta(text, tokens)

    def rendered(self) -> list[int]:
        """The output item as the session will render it (empty if nothing was emitted;
        reasoning is not kept in the context)."""
        seg = self._segment
        if not self._started or isinstance(seg, ReasoningSegment):
            return []
        if self._taken == len(seg.token_ids):
            return self.whole()
        return _render(seg, "".join(self._parts), None)

    def whole(self) -> list[int]:
        """:meth:`rendered` once the segment is sent whole, known before any of it is: the
        engine takes it while the prompt is in prefill, not as the response ends.  A segment
        whose ids are its text's encoding (a call's arguments always are) renders with them,
        instead of encoding a long answer again."""
        seg = self._segment
        if not seg.token_ids or isinstance(seg, ReasoningSegment):
            return []
        if isinstance(seg, FunctionCallSegment):
            return _render(seg, seg.arguments, seg.token_ids)
        return _render(seg, decode(seg.token_ids), seg.token_ids if seg.canonical else None)


_TOKEN_BYTES: dict[int, bytes] = {}  # each token's bytes as met (at most the vocabulary; ints and
# bytes only, so the collector does not track it)


def _token_bytes(ids: Sequence[int]) -> list[bytes]:
    """:func:`inference.tokenizer.token_bytes` of ``ids``, each token's taken from the tokenizer
    once a process: a response's few dozen tokens are dict lookups, not tokenizer calls."""
    known = _TOKEN_BYTES
    try:
        return [known[t] for t in ids]
    except KeyError:
        known.update(zip(ids, token_bytes(ids)))
        return [known[t] for t in ids]


def _render(seg: TextSegment | FunctionCallSegment, text: str, encoded: Sequence[int] | None) -> list[int]:
    if isinstance(seg, FunctionCallSegment):
        if seg.custom:
            return chat_format.render_custom_tool_call(seg.name, text, encoded=encoded)
        return chat_format.render_function_call(seg.name, text, encoded=encoded)
    return chat_format.render_message("assistant", text, encoded=encoded)


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


def _finish_reason(n: int, total: int, segments: Sequence[object]) -> FinishReason:
    """Why a response of ``n`` of its plan's ``total`` tokens ended."""
    if n < total:
        return "max_output_tokens"
    if any(isinstance(s, FunctionCallSegment) for s in segments):
        return "tool_calls"
    return "stop"
