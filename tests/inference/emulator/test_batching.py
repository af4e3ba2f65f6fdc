"""batching: step factor, running batch and waiting queue, deadlines under a changing batch;
and the engine under load with a simulated clock (exact times, any machine)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from inference import chat_format as cf
from inference.emulator.batching import (
    Batch,
    DecodeSchedule,
    EngineOverloaded,
    steady_tokens_per_s,
    step_factor,
)
from inference.emulator.engine import Engine
from inference.emulator.pacing import decode_s, ttft_ms
from inference.emulator.profiles import BatchingConfig, PolicyConfig
from inference.types import Done, InferenceRequest, Prefilled, TextDelta

PROMPT = tuple(cf.render_message("user", "Fix the bug."))
LONG = tuple(cf.render_message("user", "word " * 400))


def req(rid: str, **kw) -> InferenceRequest:
    return InferenceRequest(**{"request_id": rid, "model": "emu-test", "prompt_token_ids": PROMPT, **kw})


# --- the load model --------------------------------------------------------------------


def test_step_factor_is_flat_to_the_knee_then_linear():
    cfg = BatchingConfig(max_running=16, knee=4, itl_growth_per_seq=0.1)
    assert [step_factor(b, cfg) for b in (0, 1, 2, 4)] == [1.0, 1.0, pytest.approx(1.1), pytest.approx(1.3)]
    assert step_factor(8, cfg) == pytest.approx(1.3 * 2)
    # past the knee the replica's throughput (b streams / factor) stays flat
    thr = [b / step_factor(b, cfg) for b in (4, 8, 16)]
    assert thr == [pytest.approx(4 / 1.3)] * 3
    assert steady_tokens_per_s(1000, 8, cfg) == pytest.approx(1000 / 2.6)
    assert steady_tokens_per_s(1000, 99, cfg) == steady_tokens_per_s(1000, 16, cfg)  # bounded batch


def test_batch_admits_up_to_max_running_then_queues_fifo():
    batch = Batch(BatchingConfig(max_running=2, max_waiting=2, knee=1))
    assert [batch.submit(s) for s in "abcd"] == [True, True, False, False]
    with pytest.raises(EngineOverloaded):
        batch.submit("e")
    assert batch.release("d") == []  # a waiting sequence leaves the queue
    assert batch.release("a") == ["c"]
    assert (batch.running, batch.waiting) == (2, 0)
    assert batch.submit("f") is False  # full: newcomers wait


def test_deadlines_follow_factor_changes_from_an_anchor():
    sched = DecodeSchedule([0.001 * (i + 1) for i in range(10)], start=1.0, factor=1.0)
    assert sched.deadline(3) == pytest.approx(1.004)
    sched.set_factor(1.004, 2.0)  # 4 tokens' work done; the rest at half speed
    assert sched.deadline(4) == pytest.approx(1.006)
    assert sched.deadline(9) == pytest.approx(1.016)
    sched.set_factor(0.5, 3.0)  # a change dated before the anchor only changes the rate
    assert sched.deadline(9) == pytest.approx(1.004 + 0.006 * 3)
    assert sched.due(1.004) == 4 and sched.due(sched.deadline(7)) == 8


def test_a_change_before_decode_starts_only_sets_the_rate():
    sched = DecodeSchedule([0.001, 0.002], start=1.0, factor=1.0)
    sched.set_factor(0.5, 2.0)
    assert sched.deadline(0) == pytest.approx(1.002)


# --- the engine under load (simulated time) ---------------------------------------------


def collect(engine: Engine, request: InferenceRequest, clock, out: dict) -> asyncio.Future:
    async def go():
        items = []
        async for chunk in engine.generate(request):
            items.append((clock.now(), chunk))
        out[request.request_id] = items

    return go()


def gather(sim, *coros):
    async def main():
        await asyncio.gather(*coros)

    sim.run(main())


def test_a_full_batch_makes_the_next_request_wait_for_the_slot(make_config, make_profile, sim):
    p = make_profile(batching={"max_running": 1, "knee": 1})
    engine = Engine(make_config(p), sim, sim)
    out: dict = {}
    gather(sim, collect(engine, req("a"), sim, out), collect(engine, req("b"), sim, out))
    n = engine.config.policy.text_tokens
    prefill_ms = ttft_ms(p, len(PROMPT), 0)
    a_end = prefill_ms / 1000 + decode_s(p, n)
    assert out["a"][-1][0] == pytest.approx(a_end, abs=1e-9)
    prefilled_b = out["b"][0][1][0]
    assert prefilled_b.queue_ms == pytest.approx(a_end * 1000)  # TTFT = queue + prefill
    assert out["b"][0][0] == pytest.approx(a_end + prefill_ms / 1000 + decode_s(p, 1), abs=1e-9)
    assert engine.stats()["batches"]["emu-test"] == {"running": 0, "waiting": 0}


def test_inter_token_latency_grows_while_the_batch_is_larger(make_config, make_profile, sim):
    # knee 1: two sequences run at half speed each.  B is a prefill-only request whose
    # long prompt holds its slot until B_end; A decodes at half speed until then.
    p = make_profile(batching={"max_running": 4, "knee": 1})
    engine = Engine(make_config(p), sim, sim)
    out: dict = {}
    gather(
        sim,
        collect(engine, req("a"), sim, out),
        collect(engine, req("b", prompt_token_ids=LONG, generate=False), sim, out),
    )
    a_first = ttft_ms(p, len(PROMPT), 0) / 1000
    b_end = ttft_ms(p, len(LONG), 0) / 1000
    n = engine.config.policy.text_tokens
    assert a_first < b_end < a_first + 2 * decode_s(p, n)
    banked = (b_end - a_first) / 2  # work done at factor 2
    expected_end = b_end + decode_s(p, n) - banked
    done_time, last = out["a"][-1]
    assert done_time == pytest.approx(expected_end, abs=1e-9)
    assert last[-1].decode_ms == pytest.approx((expected_end - a_first) * 1000)
    # and it is never sent before its deadline: the first token at factor 2
    assert out["a"][0][0] == pytest.approx(a_first + 2 * decode_s(p, 1), abs=1e-9)


def test_two_streams_started_together_share_the_step(make_config, make_profile, sim):
    p = make_profile(batching={"max_running": 4, "knee": 1})
    engine = Engine(make_config(p), sim, sim)
    out: dict = {}
    gather(sim, collect(engine, req("a"), sim, out), collect(engine, req("b"), sim, out))
    n = engine.config.policy.text_tokens
    first = ttft_ms(p, len(PROMPT), 0) / 1000
    for rid in "ab":
        assert out[rid][-1][0] == pytest.approx(first + 2 * decode_s(p, n), abs=1e-9)


def test_cancelling_a_running_stream_admits_the_next_at_once(make_config, make_profile, sim):
    p = make_profile(batching={"max_running": 1, "knee": 1})
    engine = Engine(make_config(p), sim, sim)
    out: dict = {}
    cancelled_at = []

    async def consume_two_items_then_leave():
        stream = engine.generate(req("a"))
        await stream.__anext__()
        await stream.__anext__()
        cancelled_at.append(sim.now())
        await stream.aclose()

    gather(sim, consume_two_items_then_leave(), collect(engine, req("b"), sim, out))
    assert out["b"][0][1][0].queue_ms == pytest.approx(cancelled_at[0] * 1000)
    stats = engine.stats()
    assert stats["cancelled"] == 1 and stats["completed"] == 1


def test_a_full_waiting_queue_refuses_before_anything_is_sent(make_config, make_profile, sim):
    p = make_profile(batching={"max_running": 1, "max_waiting": 0, "knee": 1})
    engine = Engine(make_config(p), sim, sim)
    out: dict = {}
    errors = []

    async def second():
        await asyncio.sleep(0)
        try:
            async for _ in engine.generate(req("b")):
                pass
        except EngineOverloaded as e:
            errors.append(e)

    gather(sim, collect(engine, req("a"), sim, out), second())
    assert len(errors) == 1 and errors[0].code == "server_is_overloaded"
    assert engine.stats()["requests"] == 1


def test_metrics_observer_sees_ttft_tokens_batch_and_cache(make_config, make_profile, clock):
    class Recorder:
        def __init__(self):
            self.ttft, self.sent, self.itls, self.batches, self.blocks = [], 0, [], [], [0, 0, 0]

        def first_token(self, model, ttft_s):
            self.ttft.append(ttft_s)

        def tokens(self, model, n):
            self.sent += n

        def itl(self, model, itl_s):
            self.itls.append(itl_s)

        def batch(self, model, running, waiting):
            self.batches.append((running, waiting))

        def prefix(self, hit, miss, evicted):
            self.blocks = [a + b for a, b in zip(self.blocks, (hit, miss, evicted))]

    rec = Recorder()
    p = make_profile()
    engine = Engine(make_config(p, prefix_cache={"block_tokens": 4, "capacity_tokens": 8}), clock, clock, rec)

    async def run():
        async for _ in engine.generate(req("a")):
            pass

    asyncio.run(run())
    n = engine.config.policy.text_tokens
    assert rec.ttft == [pytest.approx(ttft_ms(p, len(PROMPT), 0) / 1000 + decode_s(p, 1))]
    assert rec.sent == n
    # one ITL a response: its tokens after the first, from the first token's item to the last
    assert rec.itls == [pytest.approx((decode_s(p, n) - decode_s(p, 1)) / (n - 1))]
    assert rec.batches[0] == (1, 0) and rec.batches[-1] == (0, 0)
    hit, miss, evicted = rec.blocks
    assert hit == 0 and miss == (len(PROMPT) - 1) // 4 and evicted > 0  # 2-block cache overflows


def test_a_chunks_metrics_are_recorded_once_it_is_out(make_config, clock):
    """Recording a chunk's metrics is not in front of its tokens: the consumer has each chunk
    (the last, with Done, too) before the observer hears of it."""
    log: list[str] = []

    class Recorder:
        def first_token(self, model, ttft_s):
            pass  # with the first item's count, which follows

        def tokens(self, model, n):
            log.append("seen")

        def itl(self, model, itl_s):
            pass

        def batch(self, model, running, waiting):
            pass

        def prefix(self, hit, miss, evicted):
            pass

    engine = Engine(make_config(), clock, clock, Recorder())

    async def run():
        async for _ in engine.generate(req("a")):
            log.append("got")

    asyncio.run(run())
    assert log.count("got") >= 2 and log[0] == "got"
    assert all(a == "got" for a, b in itertools.pairwise(log) if b == "seen"), log


def test_prefilled_reports_the_replica(make_config, clock):
    engine = Engine(make_config(), clock, clock, replica="r1")

    async def first():
        async for chunk in engine.generate(req("a")):
            return chunk

    chunk = asyncio.run(first())
    assert isinstance(chunk[0], Prefilled) and chunk[0].replica == "r1"
    assert not any(isinstance(e, Done) for e in chunk)


def test_many_streams_share_the_replicas_item_budget_and_keep_their_times(make_config, make_profile, sim):
    # 64 streams at 1000 tok/s on a 3200 items/s budget: 20 ms items instead of 5 ms ones,
    # and every stream's first and last tokens still leave exactly when they are due.
    n, streams, cap = 500, 64, 3200
    p = make_profile(batching={"max_running": 64, "knee": 64}, max_items_per_s=cap)
    engine = Engine(make_config(p, policy=PolicyConfig(tool_rounds=0, text_tokens=n, seed=7)), sim, sim)
    out: dict = {}
    gather(sim, *(collect(engine, req(f"s{i}"), sim, out) for i in range(streams)))
    first = ttft_ms(p, len(PROMPT), 0) / 1000
    for items in out.values():
        assert items[0][0] == pytest.approx(first + decode_s(p, 1), abs=1e-9)
        assert items[-1][0] == pytest.approx(first + decode_s(p, n), abs=1e-9)
        assert sum(e.tokens for _, chunk in items for e in chunk if isinstance(e, TextDelta)) == n
    # While the batch is above the budget's 16 streams, a stream's last tokens leave on their
    # own, ahead of the end work, and Done follows at the same moment; the last 16 to end
    # find a light load and send them together.
    split = [items for items in out.values() if [type(e) for e in items[-1][1]] == [Done]]
    assert len(split) == streams - 16
    assert all(items[-2][0] == items[-1][0] for items in split)
    ends = 2 * len(split) + (streams - len(split))
    between = sum(len(items) for items in out.values()) - streams - ends  # all but the first and last items
    assert between <= cap * decode_s(p, n) + streams
    assert between >= streams * (n / 20 - 2)  # ~one item per 20 ms tick per stream
