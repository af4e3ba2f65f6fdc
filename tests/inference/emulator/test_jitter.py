"""jitter: seeded lognormal factors with mean 1, per request and per token; zero-jitter mode."""

from __future__ import annotations

import asyncio
import math
import random
import statistics

import pytest

from inference import chat_format as cf
from inference.emulator.engine import Engine
from inference.emulator.jitter import RequestJitter, lognormal_mean_one
from inference.emulator.pacing import decode_s, ttft_ms
from inference.emulator.profiles import JitterConfig
from inference.types import InferenceRequest


def test_zero_sigma_is_exactly_one_and_leaves_the_rng_alone():
    rng = random.Random(1)
    assert lognormal_mean_one(rng, 0.0) == 1.0
    assert rng.random() == random.Random(1).random()
    j = RequestJitter(JitterConfig(), "r")
    assert j.request == 1.0 and j.tokens(3) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("sigma", [0.1, 0.5, 1.0])
def test_factors_have_mean_one_and_the_given_log_spread(sigma):
    rng = random.Random(42)
    xs = [lognormal_mean_one(rng, sigma) for _ in range(40_000)]
    # standard error of the mean is sqrt(exp(sigma^2) - 1) / 200: at most ~0.007 here
    assert statistics.fmean(xs) == pytest.approx(1.0, abs=0.03)
    assert statistics.pstdev([math.log(x) for x in xs]) == pytest.approx(sigma, rel=0.03)


def test_factors_are_a_function_of_seed_and_request_id():
    cfg = JitterConfig(request_sigma=0.3, token_sigma=0.2, seed=5)
    a, b = RequestJitter(cfg, "resp_1"), RequestJitter(cfg, "resp_1")
    assert a.request == b.request and a.tokens(50) == b.tokens(50)
    assert RequestJitter(cfg, "resp_2").request != a.request
    assert RequestJitter(cfg.model_copy(update={"seed": 6}), "resp_1").request != a.request


def test_request_jitter_scales_prefill_and_every_token(make_config, make_profile, clock):
    p = make_profile(jitter={"request_sigma": 0.5, "seed": 3})
    engine = Engine(make_config(p), clock, clock)
    prompt = tuple(cf.render_message("user", "hi"))
    request = InferenceRequest("resp_x", "emu-test", prompt)
    factor = RequestJitter(p.jitter, "resp_x").request
    assert factor != 1.0

    async def run():
        return [(clock.now(), c) async for c in engine.generate(request)]

    timed = asyncio.run(run())
    prefilled = timed[0][1][0]
    assert prefilled.prefill_ms == pytest.approx(ttft_ms(p, len(prompt), 0) * factor)
    n = engine.config.policy.text_tokens
    assert timed[-1][1][-1].decode_ms == pytest.approx(decode_s(p, n) * factor * 1000)


def test_token_jitter_moves_tokens_but_keeps_order_and_count(make_config, make_profile, clock):
    p = make_profile(jitter={"token_sigma": 0.8, "seed": 1})
    engine = Engine(make_config(p), clock, clock)
    request = InferenceRequest("resp_y", "emu-test", tuple(cf.render_message("user", "hi")))

    async def run():
        return [(clock.now(), c) async for c in engine.generate(request)]

    timed = asyncio.run(run())
    times = [t for t, _ in timed]
    assert times == sorted(times)
    n = engine.config.policy.text_tokens
    assert timed[-1][1][-1].output_tokens == n
    assert timed[-1][1][-1].decode_ms != pytest.approx(decode_s(p, n) * 1000)
