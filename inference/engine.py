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
from array import array
from collections.abc import AsyncGenerator, Hashable, Sequence
from typing import Any, Protocol

from inference import breakpoint_cache, chat_format
from inference.batching import Batch, DecodeSchedule
from inference.breakpoint_cache import BreakpointCache, prefix_key
from inference.jitter import RequestJitter
from inference.pacing import Chunker, Clock, ItemWindow, Sleeper, decode_work, paced_chunks, ttft_ms
from inference.policy import FunctionCallSegment, ReasoningSegment, Segment, TextSegment, plan, policy_for
from inference.prefix_cache import Lookup, PrefixCache, as_bytes, block_keys, reported_cached_tokens
from inference.profiles import InferenceConfig, ModelProfile
from inference.prompt_memo import Check, Digest, Known, PromptMemo, check, digest_of
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
        profile = self._config.profile(request.model)
        prompt = request.prompt_token_ids
        root = self._root(profile.id, request.cache_scope)
        data = as_bytes(prompt)
        known, prompt_check = self._memo.recall(request.session_key, root, data)
        digest: Digest | None = None
        output = None
        if request.generate:
            policy = policy_for(request, self._config.policy)

            def prompt_seed() -> int:
                nonlocal digest
                value, digest = digest_of(data, policy.seed, known)
                return int.from_bytes(value, "little")

            output = plan(request, policy, prompt_seed)
        jitter = RequestJitter(profile.jitter, request.request_id)
        model = profile.id
        batch = self._batches[model]
        seq = object()
        admitted = batch.submit(seq)  # EngineOverloaded: nothing started
        self._requests += 1
        self._active += 1
        finished = False
        # KV to cache once the chunk that made it is out: the prompt (its check), and the output after it
        pending: tuple[Sequence[int], Check, Sequence[int]] | None = None
        seen: tuple[int, int, float] | None = None  # the last chunk's metrics, recorded once it is out
        first_out: tuple[float, int] | None = None  # when the first item went out, and its end
        last_out: tuple[float, int] | None = None  # the same of the latest item
        try:
            t_admit = t_arrive if admitted else await self._admission(model, batch, seq)
            self._rebatch(model, t_admit)
            blocks = profile.prompt_cache == "blocks"
            written: tuple[int, int] | None = None
            if blocks:
                found = self._cache.lookup(prompt, root, known.keys if known is not None else ())
                self._observer.prefix(found.hit_blocks, found.miss_blocks, 0)
            else:
                found, written = self._serve_breakpoints(request, data, root, known)
            prefilled = self._prefilled(
                profile,
                len(prompt),
                found.reused_tokens,
                jitter,
                t_arrive,
                t_admit,
                blocks=blocks,
                written=written,
            )
            t_first = t_admit + prefilled.prefill_ms / 1000.0
            if output is None:
                await self._sleeper.sleep_until(t_first, precise=True)
                self._insert(request.session_key, prompt, prompt_check, (), found.keys, root, digest, blocks)
                finished = True
                yield [prefilled, Done("stop", 0, 0.0)]
                return
            total = output.total_tokens
            limit = request.max_output_tokens
            n = total if limit is None else max(0, min(total, limit))
            token_factors = jitter.tokens(n) if profile.jitter.token_sigma else None
            schedule = DecodeSchedule(
                decode_work(profile, n, jitter.request, token_factors), t_first, batch.factor
            )
            self._schedules[model][seq] = schedule
            chunker = Chunker(schedule, t_first, self._windows[model])
            streams = _segment_streams(output.segments)
            # The output as the conversation continues with it, rendered now if it will be
            # sent whole: this replica has nothing else to do for this call until prefill ends.
            whole = [t for stream in streams for t in stream.whole()] if n == total else None
            first: list[InferenceEvent] = [prefilled]
            events: list[InferenceEvent] = []
            if n == 0:
                await self._sleeper.sleep_until(
                    t_first, precise=True
                )  # nothing to decode, prefill still costs
            else:
                t_last = t_arrive
                async for start, end in paced_chunks(chunker, self._clock, self._sleeper):
                    now = self._clock.now()
                    if start == 0:
                        pending = (prompt, prompt_check, ())  # prefill is done: its KV exists
                    events = [e for s in streams if (e := s.take(start, end, n)) is not None]
                    # A chunk's metrics are recorded once it is out, the last one's once Done is.
                    seen = (start, end, now - t_last)
                    t_last = now
                    last_out = (now, end)
                    if start == 0:
                        first_out = last_out
                    if end < n:
                        if events:  # a chunk holding only part of a character waits
                            yield first + events
                            first = []
                            if pending is not None:  # cached once the tokens it made are out
                                self._insert(request.session_key, *pending, found.keys, root, digest, blocks)
                                pending = None
                        self._seen(model, *seen)
                        seen = None
            if events and self._windows[model].aligned:
                # Under load the last tokens leave when they are due, before the end work
                # (rendering and caching the output) that every stream ending on the same
                # tick would otherwise queue in front of them; Done follows on its own.
                yield first + events
                first, events = [], []
            # The final item: the last chunk's events (if any) plus Done.  The finished
            # state is cached after it is out (also if the consumer stops right after Done:
            # ``finally``), so caching a long conversation never delays a response's end.
            rendered = whole if whole is not None else [t for stream in streams for t in stream.rendered()]
            pending = (prompt, prompt_check, rendered)
            self._output_tokens_total += n
            reason = _finish_reason(n, total, output.segments)
            decode_ms = (schedule.deadline(n - 1) - t_first) * 1000.0 if n else 0.0
            finished = True
            # The output as the conversation continues with it: the session appends these ids
            # instead of rendering the output items again (the same chat_format functions
            # over the same text, so the same ids, and what the next prompt's cache hit is on).
            yield first + [*events, Done(reason, n, decode_ms, tuple(rendered) if rendered else None)]
        except (GeneratorExit, asyncio.CancelledError):
            if not finished:
                self._cancelled += 1
            raise
        finally:
            if seen is not None:
                self._seen(model, *seen)
            if first_out is not None and last_out is not None and last_out[1] > first_out[1]:
                self._observer.itl(model, (last_out[0] - first_out[0]) / (last_out[1] - first_out[1]))
            if pending is not None:
                self._insert(request.session_key, *pending, found.keys, root, digest, blocks)
            self._active -= 1
            if finished:
                self._completed += 1
            self._release(model, seq)

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

    def _insert(
        self,
        session: str | None,
        prompt: Sequence[int],
        prompt_check: Check,
        output: Sequence[int],
        known: Sequence[int],
        root: int,
        digest: Digest | None,
        blocks: bool = True,
    ) -> None:
        """Cache the KV of ``prompt`` followed by ``output`` (``known``: the block keys of a
        prefix of them) under the block rule (``blocks``), and remember them as
        ``session``'s conversation (``inference.prompt_memo``): the breakpoint rule's keys
        chain on the same block keys."""
        tokens, tokens_check = prompt, prompt_check
        if output:
            tokens = array("I", prompt)
            tokens.extend(output)
            tokens_check = check(array("I", output).tobytes(), prompt_check)
        keys = block_keys(tokens, self._cache.block_tokens, known, root)
        evicted = self._cache.insert_keys(keys) if blocks else 0
        if evicted:
            self._observer.prefix(0, 0, evicted)
        self._memo.remember(session, Known(len(tokens), tokens_check, root, tuple(keys), digest))

    def _serve_breakpoints(
        self, request: InferenceRequest, data: bytes, root: int, known: Known | None
    ) -> tuple[Lookup, tuple[int, int]]:
        """The breakpoint rule (``inference.breakpoint_cache``): read the longest held
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
        self._bytes = [] if isinstance(segment, ReasoningSegment) else token_bytes(segment.token_ids)
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
