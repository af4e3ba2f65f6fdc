"""The memory-per-connection benchmark's pure parts: its model of the cache evicts what the
session evicts, and its inputs have the size it claims."""

from __future__ import annotations

import json
import random

from actors.config import SessionConfig
from actors.core.inputs import ClientFrame, InferenceChunk, Written
from actors.core.session import Session
from bench.kinds.memory import CacheModel, fresh_text, rendered_output_tokens
from inference import tokenizer
from inference.types import Done, Prefilled, TextDelta
from tests.support.session_driver import handled

MODEL = "emu-fast"


def test_the_client_model_of_the_cache_evicts_exactly_what_the_session_evicts():
    cap = 400
    session = Session(SessionConfig(max_cached_tokens=cap), [MODEL], session_key="c", clock=lambda: 0.0)
    model = CacheModel(cap)
    rng = random.Random(3)
    evictions = 0
    for _ in range(60):
        lane = rng.choice("abcd")
        prev = model.ids[lane] if lane in model.tokens else None
        fx = handled(
            session,
            ClientFrame(
                json.dumps(
                    {
                        "type": "response.create",
                        "model": MODEL,
                        "store": False,
                        "stream_id": lane,
                        "input": "word " * rng.randint(5, 60),
                        "previous_response_id": prev,
                    }
                )
            ),
        )
        (turn,) = fx.start
        fx += handled(
            session,
            InferenceChunk(
                turn.turn_id,
                [Prefilled(len(turn.request.prompt_token_ids), 0, 0, 1), TextDelta("Hi there", 2)],
            ),
        )
        fx += handled(session, InferenceChunk(turn.turn_id, [Done("stop", 2, 1.0)]))
        response = fx.events[-1].model_dump(mode="json")["response"]
        assert response["status"] == "completed"
        handled(session, Written(response["id"], True))  # the driver's part: its ledger line is kept
        context = response["usage"]["input_tokens"] + rendered_output_tokens(response)
        evictions += len(model.finished(lane, response["id"], context))
        cached = {name: lane_.latest for name, lane_ in session._lanes.items() if lane_.latest is not None}
        assert set(cached) == set(model.tokens)
        assert {name: len(entry.tokens) for name, entry in cached.items()} == model.tokens
    assert evictions > 5, "the run must exercise eviction"


def test_fresh_text_has_about_the_requested_number_of_tokens_and_differs_each_time():
    rng = random.Random(1)
    for tokens in (2000, 6000, 20000):
        n = len(tokenizer.encode(fresh_text(rng, tokens)))
        assert 0.85 * tokens <= n <= 1.15 * tokens, (tokens, n)
    assert fresh_text(random.Random(1), 100) != fresh_text(random.Random(2), 100)
