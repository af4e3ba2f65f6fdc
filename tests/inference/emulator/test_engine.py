"""engine: one request in, a paced stream of event chunks out (fake clock, exact times)."""

from __future__ import annotations

import asyncio
import json
from array import array

import pytest

from inference import chat_format as cf
from inference.emulator import engine as engine_module
from inference.emulator.engine import Engine
from inference.emulator.pacing import decode_s, token_deadlines
from inference.emulator.policy import FunctionCallSegment, OutputPlan, TextSegment, plan
from inference.emulator.profiles import UnknownModelProfile
from inference.tokenizer import decode, encode
from inference.types import (
    Done,
    FunctionCallDelta,
    InferenceRequest,
    Prefilled,
    ReasoningDone,
    TextDelta,
    ToolSpec,
)

TOOL = ToolSpec(
    "read_file",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
PROMPT = tuple(cf.render_instructions("Be brief.") + cf.render_message("user", "Fix the bug."))


def request(**kw) -> InferenceRequest:
    fields = {
        "request_id": "r1",
        "model": "emu-test",
        "prompt_token_ids": PROMPT,
        "session_key": "sess",
        "cache_scope": "key:a",
    }
    fields.update(kw)
    return InferenceRequest(**fields)


def run(engine: Engine, req: InferenceRequest, clock=None) -> list[list]:
    """All chunks of one stream; with ``clock``, each chunk is paired with its time."""

    async def collect():
        chunks = []
        async for chunk in engine.generate(req):
            chunks.append((clock.now(), chunk) if clock else chunk)
        return chunks

    return asyncio.run(collect())


def events_of(chunks) -> list:
    return [e for chunk in chunks for e in chunk]


def assert_event_types(events, expected_first, expected_middle, expected_last):
    assert type(events[0]) is expected_first
    assert all(type(e) is expected_middle for e in events[1:-1])
    assert type(events[-1]) is expected_last


@pytest.fixture
def engine(make_config, clock) -> Engine:
    return Engine(make_config(prefix_cache={"block_tokens": 4}), clock, clock)


def engine_root(engine: Engine, cache_scope: str | None = "key:a") -> int:
    return engine._root("emu-test", cache_scope)


# --- the stream ------------------------------------------------------------------------


def test_stream_is_prefilled_then_text_deltas_then_done(engine):
    chunks = run(engine, request())
    events = events_of(chunks)
    assert_event_types(events, Prefilled, TextDelta, Done)
    # Prefilled rides in the first item, together with the first token (which goes alone)
    assert [type(e) for e in chunks[0]] == [Prefilled, TextDelta] and chunks[0][1].tokens == 1
    assert sum(isinstance(e, Done) for e in events) == 1
    assert isinstance(chunks[-1][-1], Done) and len(chunks[-1]) > 1  # Done rides the last chunk


def test_text_deltas_concatenate_to_the_planned_tokens(engine):
    expected = plan(request(), engine.config.policy).segments[0].token_ids
    events = events_of(run(engine, request()))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert "".join(d.text for d in deltas) == decode(expected)
    assert sum(d.tokens for d in deltas) == len(expected) == events[-1].output_tokens
    assert events[-1].finish_reason == "stop"


def test_prefilled_arrives_with_the_first_token_and_done_when_the_last_token_is_due(engine, clock):
    clock.t = 100.0
    timed = run(engine, request(), clock)
    p = engine.config.profile("emu-test")
    t_first = 100.0 + (p.prefill_overhead_ms + len(PROMPT) * 1000 / p.prefill_tokens_per_s) / 1000
    prefilled = timed[0][1][0]
    assert prefilled == Prefilled(len(PROMPT), 0, 0.0, pytest.approx((t_first - 100.0) * 1000))
    # the first item goes when the first token is due: TTFT plus one token-time, not later
    assert timed[0][0] == pytest.approx(t_first + decode_s(p, 1), abs=1e-9)
    n = engine.config.policy.text_tokens
    assert timed[-1][0] == pytest.approx(t_first + decode_s(p, n), abs=1e-9)
    assert timed[-1][1][-1].decode_ms == pytest.approx(decode_s(p, n) * 1000)


def test_chunks_follow_the_pacing_schedule(engine, clock):
    timed = run(engine, request(), clock)
    p = engine.config.profile("emu-test")  # 1000 tok/s, chunk_ms 5, min_chunk_tokens 8
    t_first = (p.prefill_overhead_ms + len(PROMPT) * 1000 / p.prefill_tokens_per_s) / 1000
    n = engine.config.policy.text_tokens  # 40: token i is due at t_first + (i + 1) ms
    deadlines = token_deadlines(p, t_first, n)
    # token 0 alone at 1 ms, then every 5 ms (only 5 tokens per window, min 8 never hit),
    # and the last 4 tokens with Done when token 39 is due at 40 ms
    expected_ms = (1, 6, 11, 16, 21, 26, 31, 36, 40)
    assert [t for t, _ in timed] == [pytest.approx(t_first + ms / 1000, abs=1e-9) for ms in expected_ms]
    sent = 0
    for t, chunk in timed:
        sent += sum(e.tokens for e in chunk if isinstance(e, TextDelta))
        assert t >= deadlines[sent - 1]  # never before a token is due
    assert sent == n


def test_function_call_streams_its_arguments_and_finishes_with_tool_calls(engine):
    req = request(tools=(TOOL,))
    call = plan(req, engine.config.policy).segments[0]
    events = events_of(run(engine, req))
    assert_event_types(events, Prefilled, FunctionCallDelta, Done)
    deltas = events[1:-1]
    assert {(d.index, d.name) for d in deltas} == {(0, "read_file")}
    assert "".join(d.arguments_delta for d in deltas) == call.arguments
    assert "path" in json.loads(call.arguments)
    assert events[-1].finish_reason == "tool_calls"
    assert events[-1].output_tokens == len(call.token_ids)


def test_max_output_tokens_cuts_the_answer(engine):
    full = plan(request(), engine.config.policy).segments[0].token_ids
    events = events_of(run(engine, request(max_output_tokens=5)))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert "".join(d.text for d in deltas) == decode(full[:5])
    # Done carries the output as the session renders it: the cut text, not the plan
    rendered = tuple(cf.render_message("assistant", decode(full[:5])))
    assert events[-1] == Done("max_output_tokens", 5, pytest.approx(5.0), rendered)


def test_max_output_tokens_equal_to_the_answer_is_not_a_cut(engine):
    n = engine.config.policy.text_tokens
    assert events_of(run(engine, request(max_output_tokens=n)))[-1].finish_reason == "stop"


def test_max_output_tokens_zero_emits_nothing(engine):
    chunks = run(engine, request(max_output_tokens=0))
    assert len(chunks) == 1 and isinstance(chunks[0][0], Prefilled)
    assert chunks[0][1:] == [Done("max_output_tokens", 0, 0.0)]


def test_an_answer_that_fits_in_one_chunk_is_a_single_item(engine, clock):
    clock.t = 100.0
    full = plan(request(), engine.config.policy).segments[0].token_ids
    timed = run(engine, request(max_output_tokens=1), clock)
    p = engine.config.profile("emu-test")
    prefill_ms = p.prefill_overhead_ms + len(PROMPT) * 1000 / p.prefill_tokens_per_s
    assert len(timed) == 1
    t, chunk = timed[0]
    assert chunk == [
        Prefilled(len(PROMPT), 0, 0.0, pytest.approx(prefill_ms)),
        TextDelta(decode(full[:1]), 1),
        Done(
            "max_output_tokens",
            1,
            pytest.approx(decode_s(p, 1) * 1000),
            tuple(cf.render_message("assistant", decode(full[:1]))),
        ),
    ]
    assert t == pytest.approx(100.0 + prefill_ms / 1000 + decode_s(p, 1), abs=1e-9)


def test_prefill_only_request_caches_the_prompt_and_emits_no_output(engine, clock):
    clock.t = 100.0
    timed = run(engine, request(generate=False), clock)
    p = engine.config.profile("emu-test")
    prefill_ms = p.prefill_overhead_ms + len(PROMPT) * 1000 / p.prefill_tokens_per_s
    # the whole stream is one item, sent at time to first token
    assert [chunk for _, chunk in timed] == [
        [Prefilled(len(PROMPT), 0, 0.0, pytest.approx(prefill_ms)), Done("stop", 0, 0.0)]
    ]
    assert timed[0][0] == pytest.approx(100.0 + prefill_ms / 1000, abs=1e-9)
    later = run(engine, request(prompt_token_ids=PROMPT + tuple(encode(" more"))))
    assert later[0][0].reused_tokens == len(PROMPT) // 4 * 4


def test_unknown_model_raises_before_any_event(engine):
    with pytest.raises(UnknownModelProfile) as info:
        run(engine, request(model="gpt-nope"))
    assert info.value.model == "gpt-nope"
    assert engine.stats()["requests"] == 0


# --- the prefix cache across turns -----------------------------------------------------
# The engine fixture uses 4-token blocks, so short prompts exercise the block cache; what
# usage *reports* is 0 below 1024 tokens (OpenAI's rule), what is *reused* is exact.


def floor_block(n: int, block: int = 4) -> int:
    return n // block * block


def test_next_turn_of_a_session_reuses_prompt_and_rendered_answer(engine):
    events = events_of(run(engine, request()))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    previous = PROMPT + tuple(cf.render_message("assistant", text))
    turn2 = previous + tuple(cf.render_message("user", "Thanks. Now run the tests."))
    prefilled = run(engine, request(prompt_token_ids=turn2))[0][0]
    assert prefilled.reused_tokens == floor_block(len(previous))
    assert prefilled.cached_tokens == 0  # below 1024 prompt tokens nothing is reported
    assert prefilled.prompt_tokens == len(turn2)


def test_reported_cached_tokens_are_the_reused_prefix_in_128_token_steps(engine):
    long_prompt = PROMPT + tuple(cf.render_message("user", "word " * 1500))
    run(engine, request(prompt_token_ids=long_prompt, max_output_tokens=1))
    turn2 = long_prompt + tuple(cf.render_message("user", "again"))
    prefilled = run(engine, request(prompt_token_ids=turn2))[0][0]
    assert prefilled.reused_tokens >= floor_block(len(long_prompt))
    assert prefilled.cached_tokens == prefilled.reused_tokens // 128 * 128 >= 1024


def test_prompt_as_a_uint32_array_works_like_a_tuple(engine):
    run(engine, request(prompt_token_ids=array("I", PROMPT), generate=False))
    assert engine.prefix_cache.contains_prefix(PROMPT, engine_root(engine)) == floor_block(len(PROMPT))
    longer = array("I", PROMPT + (1, 2, 3, 4))
    assert run(engine, request(prompt_token_ids=longer))[0][0].reused_tokens == floor_block(len(PROMPT))


def test_next_turn_after_a_tool_call_reuses_the_rendered_call(engine):
    req = request(tools=(TOOL,))
    events = events_of(run(engine, req))
    arguments = "".join(e.arguments_delta for e in events if isinstance(e, FunctionCallDelta))
    previous = PROMPT + tuple(cf.render_function_call("read_file", arguments))
    turn2 = previous + tuple(cf.render_function_call_output("contents"))
    prefilled = run(engine, request(prompt_token_ids=turn2, tools=(TOOL,)))[0][0]
    assert prefilled.reused_tokens == floor_block(len(previous))


def test_a_custom_tool_call_streams_its_input_and_is_cached_as_rendered(engine):
    req = request(tools=(ToolSpec("apply_patch", custom=True),))
    call = plan(req, engine.config.policy).segments[0]
    events = events_of(run(engine, req))
    deltas = [e for e in events if isinstance(e, FunctionCallDelta)]
    assert deltas and all(d.custom and d.name == "apply_patch" for d in deltas)
    assert "".join(d.arguments_delta for d in deltas) == call.arguments
    assert events[-1].finish_reason == "tool_calls"
    previous = PROMPT + tuple(cf.render_custom_tool_call("apply_patch", call.arguments))
    assert engine.prefix_cache.contains_prefix(previous, engine_root(engine)) == floor_block(len(previous))


def test_a_cut_answer_is_cached_as_the_client_saw_it(engine):
    events = events_of(run(engine, request(max_output_tokens=3)))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    previous = PROMPT + tuple(cf.render_message("assistant", text))
    root = engine_root(engine)
    assert engine.prefix_cache.contains_prefix(previous, root) == floor_block(len(previous))


def test_cached_prompt_shortens_time_to_first_token(engine):
    run(engine, request(generate=False))
    p = engine.config.profile("emu-test")
    prefilled = run(engine, request())[0][0]
    uncached = len(PROMPT) - floor_block(len(PROMPT) - 1)
    assert prefilled.prefill_ms == pytest.approx(
        p.prefill_overhead_ms + uncached * 1000 / p.prefill_tokens_per_s
    )


def test_the_cache_scope_is_the_api_key_not_the_connection(engine):
    """docs/protocol.md check 27: one scope per API key, whatever the connection."""
    run(engine, request(generate=False))  # key a, connection "sess"
    reusable = floor_block(len(PROMPT) - 1)
    assert run(engine, request(session_key="other"))[0][0].reused_tokens == reusable  # a's other socket
    assert run(engine, request(session_key=None))[0][0].reused_tokens == reusable  # a over HTTP
    assert run(engine, request(cache_scope="key:b"))[0][0].reused_tokens == 0  # key b: never
    assert run(engine, request(cache_scope=None, session_key=None))[0][0].reused_tokens == 0  # unscoped
    run(engine, request(cache_scope=None, session_key=None, generate=False))
    assert run(engine, request(cache_scope=None, session_key="x"))[0][0].reused_tokens == reusable


def test_sharing_across_keys_is_no_longer_an_option(make_config):
    with pytest.raises(ValueError, match="scoped per API key"):
        make_config(prefix_cache={"block_tokens": 4, "share_across_sessions": True})


def test_models_do_not_share_kv_blocks(make_config, make_profile, clock):
    eng = Engine(
        make_config(make_profile(), make_profile(id="emu-b"), prefix_cache={"block_tokens": 4}), clock, clock
    )
    run(eng, request(generate=False))
    assert run(eng, request(model="emu-b"))[0][0].reused_tokens == 0


def test_a_cancelled_stream_keeps_its_prompt_but_not_its_output(engine):
    async def stop_after_two_chunks():
        stream = engine.generate(request())
        await stream.__anext__()
        await stream.__anext__()
        await stream.aclose()

    asyncio.run(stop_after_two_chunks())
    root = engine_root(engine)
    assert engine.prefix_cache.contains_prefix(PROMPT, root) == floor_block(len(PROMPT))
    assert len(engine.prefix_cache) == floor_block(len(PROMPT)) // 4
    stats = engine.stats()
    assert stats["cancelled"] == 1 and stats["active"] == 0 and stats["completed"] == 0
    assert stats["batches"]["emu-test"] == {"running": 0, "waiting": 0}  # the slot is free


def test_a_task_cancelled_while_waiting_propagates_cancellation(make_config):
    class NeverWakes:
        def now(self):
            return 0.0

        async def sleep_until(self, t, precise=False):
            await asyncio.Event().wait()

    eng = Engine(make_config(), NeverWakes(), NeverWakes())

    async def main():
        task = asyncio.create_task(anext(aiter(eng.generate(request()))))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(eng.prefix_cache) == 0  # prefill never completed
    assert eng.stats()["cancelled"] == 1
    assert eng.batch("emu-test").running == 0


# --- multibyte output ------------------------------------------------------------------


def test_multibyte_text_split_across_chunks_is_reassembled_exactly(
    make_config, make_profile, clock, monkeypatch
):
    # One token per chunk, so chunks often end inside a character.
    engine = Engine(make_config(make_profile(min_chunk_tokens=1)), clock, clock)
    ids = tuple(encode("naïve café 🙂🙂 日本語のテキスト " * 4))
    monkeypatch.setattr(engine_module, "plan", lambda req, pol, *_: OutputPlan((TextSegment(ids),)))
    for limit in (None, 7, 9):
        chunks = run(engine, request(max_output_tokens=limit))
        assert all(chunks)  # no empty stream items
        events = events_of(chunks)
        deltas = [e for e in events if isinstance(e, TextDelta)]
        n = len(ids) if limit is None else limit
        assert "".join(d.text for d in deltas) == decode(ids[:n])
        assert sum(d.tokens for d in deltas) == n
        assert all(d.text for d in deltas)


@pytest.mark.parametrize("canonical", [True, False])
def test_done_carries_the_answer_as_the_session_renders_it(engine, monkeypatch, canonical):
    """A long answer sent whole renders with its own ids when they are its text's encoding;
    ids that are not (here "hel" + "lo", which "hello" does not encode to) render from the text."""
    ids = tuple(encode("The test passes now. " * 300)) if canonical else tuple(encode("hel") + encode("lo"))
    assert (tuple(encode(decode(ids))) == ids) is canonical
    monkeypatch.setattr(
        engine_module, "plan", lambda req, pol, *_: OutputPlan((TextSegment(ids, canonical=canonical),))
    )
    done = events_of(run(engine, request()))[-1]
    assert done.context_token_ids == tuple(cf.render_message("assistant", decode(ids)))


def test_a_consumer_that_stops_at_done_still_leaves_the_finished_state_cached(engine):
    """The output's KV is cached after ``Done`` is out (so caching never delays a
    response's end), and also when the consumer closes the stream right after it."""

    async def stop_at_done():
        stream = engine.generate(request())
        done = None
        while done is None:
            chunk = await stream.__anext__()
            done = next((e for e in chunk if isinstance(e, Done)), None)
        await stream.aclose()
        return done

    done = asyncio.run(stop_at_done())
    held = PROMPT + tuple(done.context_token_ids)
    assert engine.prefix_cache.contains_prefix(held, engine_root(engine)) == floor_block(len(held))
    assert engine.stats()["completed"] == 1


def test_several_calls_in_one_plan_are_numbered_from_zero(engine, monkeypatch):
    calls = tuple(
        FunctionCallSegment(name, args, tuple(encode(args)))
        for name, args in (("a", '{"x": 1}'), ("b", '{"y": "two"}'))
    )
    monkeypatch.setattr(engine_module, "plan", lambda req, pol, *_: OutputPlan(calls))
    events = events_of(run(engine, request()))
    per_call: dict[tuple[int, str], str] = {}
    for e in events:
        if isinstance(e, FunctionCallDelta):
            per_call[(e.index, e.name)] = per_call.get((e.index, e.name), "") + e.arguments_delta
    assert per_call == {(0, "a"): '{"x": 1}', (1, "b"): '{"y": "two"}'}
    expected = (
        PROMPT
        + tuple(cf.render_function_call("a", '{"x": 1}'))
        + tuple(cf.render_function_call("b", '{"y": "two"}'))
    )
    assert engine.prefix_cache.contains_prefix(expected, engine_root(engine)) == len(expected) // 4 * 4


def test_stats_count_requests_and_tokens(engine):
    run(engine, request())
    run(engine, request(cache_scope="key:b", max_output_tokens=4))
    stats = engine.stats()
    assert stats["requests"] == 2 and stats["completed"] == 2 and stats["active"] == 0
    assert stats["output_tokens_total"] == engine.config.policy.text_tokens + 4
    assert stats["prefix_cache"]["lookups"] == 2 and stats["queue_ms_total"] == 0.0


# --- hidden reasoning --------------------------------------------------------------------


def test_reasoning_is_decoded_and_counted_but_never_sent(engine, clock):
    req = request(tools=(TOOL,), metadata=(("emulator.reasoning_tokens", "300"),))
    plain = events_of(run(engine, request(tools=(TOOL,), request_id="r0")))
    start = clock.now()
    timed = run(engine, req, clock)
    events = events_of([c for _, c in timed])
    reasoning = [e for e in events if isinstance(e, ReasoningDone)]
    calls = [e for e in events if isinstance(e, FunctionCallDelta)]
    assert [r.tokens for r in reasoning] == [300]  # one count, when the reasoning ends
    # the visible call is the one the same request plans without reasoning
    assert "".join(c.arguments_delta for c in calls) == "".join(
        e.arguments_delta for e in plain if isinstance(e, FunctionCallDelta)
    )
    done = events[-1]
    assert done.output_tokens == 300 + sum(c.tokens for c in calls)
    # the first visible token waits for the 300 reasoning tokens to be decoded
    profile = engine.config.profile("emu-test")
    first_visible = next(t for t, c in timed if any(isinstance(e, FunctionCallDelta) for e in c))
    prefilled = events[0]
    assert first_visible - start >= prefilled.prefill_ms / 1000 + decode_s(profile, 300) - 1e-9


def test_reasoning_is_not_kept_in_the_context(engine):
    req = request(tools=(TOOL,), metadata=(("emulator.reasoning_tokens", "64"),))
    events = events_of(run(engine, req))
    arguments = "".join(e.arguments_delta for e in events if isinstance(e, FunctionCallDelta))
    previous = PROMPT + tuple(cf.render_function_call("read_file", arguments))
    turn2 = previous + tuple(cf.render_function_call_output("contents"))
    prefilled = run(engine, request(prompt_token_ids=turn2, tools=(TOOL,), request_id="r2"))[0][0]
    assert prefilled.reused_tokens == floor_block(len(previous))


def test_max_output_tokens_can_cut_inside_the_reasoning(engine):
    req = request(max_output_tokens=10, metadata=(("emulator.reasoning_tokens", "40"),))
    events = events_of(run(engine, req))
    assert [type(e) for e in events] == [Prefilled, ReasoningDone, Done]
    assert events[1].tokens == 10
    assert (events[-1].finish_reason, events[-1].output_tokens) == ("max_output_tokens", 10)


def test_the_replicas_load_is_its_running_and_waiting_sequences(engine):
    """What the replica reports to Serve's autoscaler (inference/serve_autoscaling.py): every
    stream in its batches, however it was called."""

    async def two_in_flight() -> tuple[int, int, int]:
        streams = [engine.generate(request()) for _ in range(2)]
        for s in streams:
            await s.__anext__()
        batch = engine.stats()["batches"]["emu-test"]
        during = engine.sequences()
        for s in streams:
            await s.aclose()
        return during, batch["running"] + batch["waiting"], engine.sequences()

    during, batch, after = asyncio.run(two_in_flight())
    assert (during, batch, after) == (2, 2, 0)


def test_token_bytes_are_the_tokenizers_and_their_memo_is_not_walked_by_the_collector():
    import gc

    from inference.tokenizer import token_bytes

    ids = encode('{"path": "src/naïve/日本語.py"}') + encode(" plain words")
    assert engine_module._token_bytes(ids) == token_bytes(ids)  # filled on a miss
    assert engine_module._token_bytes(ids) == token_bytes(ids)  # read back
    assert not gc.is_tracked(engine_module._TOKEN_BYTES)


class _LateClock:
    """The fake clock, but every wake-up comes ``late_s`` after its deadline (a replica whose
    event loop or process is held up), and the replica's own work before its first sleep
    takes ``work_s``."""

    def __init__(self, late_s: float, work_s: float) -> None:
        self.t, self.late_s, self.work_s, self.started = 0.0, late_s, work_s, False

    def now(self) -> float:
        return self.t

    async def sleep_until(self, t: float, precise: bool = False) -> None:
        if not self.started:
            self.started, self.t = True, self.t + self.work_s
        self.t = max(self.t, t + self.late_s)


@pytest.mark.parametrize(("late_ms", "work_ms"), [(0.0, 0.0), (7.0, 0.0), (0.0, 30.0), (12.0, 4.0)])
def test_the_replicas_own_delays_are_never_reported_as_the_models_time(make_config, late_ms, work_ms):
    """The model's figures (queue, prefill, decode) are the emulated hardware's alone, the
    same however late the replica wakes or however long its own work takes: those delays
    stay in the caller's wait beyond them (a host's ``backend`` timing), not in the
    model's time."""
    late = _LateClock(late_ms / 1000, work_ms / 1000)
    eng = Engine(make_config(prefix_cache={"block_tokens": 4}), late, late)
    timed = run(eng, request(), late)
    p = eng.config.profile("emu-test")
    prefill_ms = p.prefill_overhead_ms + len(PROMPT) * 1000 / p.prefill_tokens_per_s
    n = eng.config.policy.text_tokens
    prefilled, done = timed[0][1][0], timed[-1][1][-1]
    assert prefilled.queue_ms == 0.0 and prefilled.prefill_ms == pytest.approx(prefill_ms)
    assert done.decode_ms == pytest.approx(decode_s(p, n) * 1000)
    model_s = (prefilled.queue_ms + prefilled.prefill_ms + done.decode_ms) / 1000
    beyond_ms = (timed[-1][0] - model_s) * 1000  # the caller's wait beyond the model's time (sent at 0)
    # a late wake-up shows there (at most by its lateness: a late item takes every token
    # then due); work that outlasts prefill only delays the items the stream then catches up
    assert (beyond_ms > 1e-6) == (late_ms > 0)
    assert -1e-6 <= beyond_ms <= late_ms + 1e-6
