"""What the what-if services charge a model call: the keyword classifier's rule, per
processed token — a carried conversation reads its new tokens plus a window, a rebuilt or
resent one all of it; the hook calls the hop, then the classifier, each a timed phase."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from actors.backend import ModelCall
from actors.backend.whatif_hook import Charge, WhatIfServices, charge
from actors.config import SessionConfig
from actors.core.inputs import ClientFrame, InferenceChunk
from actors.core.session import Session, Turn
from actors.core.timings import PhaseTimer
from inference.emulator.whatif import HopConfig, SafetyModelConfig, WhatIfConfig
from store import StoredResponse
from tests.actors.test_session import MODEL, answer_text, send
from tests.support.session_driver import handled

WINDOW = 8


def whatif(**sections) -> WhatIfConfig:
    return WhatIfConfig(
        safety_model=SafetyModelConfig(enabled=True, window_tokens=WINDOW),
        hop=HopConfig(enabled=True),
        **sections,
    )


def session(transport: str = "websocket", config: WhatIfConfig | None = None) -> Session:
    cfg = SessionConfig(whatif=config if config is not None else whatif())
    return Session(cfg, [MODEL], session_key="conn-1", transport=transport, clock=lambda: 1_700_000_000.0)


def charged(turn: Turn, config: WhatIfConfig | None = None) -> Charge | None:
    """What the hook charges the turn's next model call."""
    return charge(config if config is not None else whatif(), ModelCall.of(turn))


def prompt_len(fx) -> int:
    (turn,) = fx.start
    return len(turn.request.prompt_token_ids)


def test_off_by_default_no_call_is_charged():
    s = Session(SessionConfig(), [MODEL], session_key="c", clock=lambda: 0.0)
    (turn,) = send(s, input="hello").start
    assert charged(turn, s.config.whatif) is None


def test_a_first_turn_is_charged_its_input():
    s = session()
    fx = send(s, input="hello there")
    (turn,) = fx.start
    n = prompt_len(fx)  # no tools or instructions: the prompt is the input
    assert charged(turn) == Charge(hop_tokens=n, safety_tokens=n)


def test_a_carried_continuation_is_charged_the_new_tokens_plus_the_window():
    s = session()
    first = answer_text(s, fx1 := send(s, input="a first message that is long enough to pass the window"))
    before = prompt_len(fx1)
    rid = first.events[-1].response.id
    fx2 = send(s, input="next", previous_response_id=rid)
    (turn,) = fx2.start
    new = prompt_len(fx2) - before  # the parent's output and the new input
    assert charged(turn) == Charge(hop_tokens=new, safety_tokens=new + WINDOW)


def test_a_continuation_rebuilt_from_the_store_and_a_full_resend_are_charged_everything():
    ws = session()
    first = answer_text(
        ws, send(ws, input="a first message that is long enough to pass the window", store=True)
    )
    (record,) = first.persist
    http = session("http")
    fx = send(http, {record.id: record}, input="next", previous_response_id=record.id)
    (turn,) = fx.start
    assert charged(turn) == Charge(hop_tokens=prompt_len(fx), safety_tokens=prompt_len(fx))

    resend = session("http")
    fx = send(resend, input=[*record.context, {"role": "user", "content": "next"}])
    (turn,) = fx.start
    assert charged(turn) == Charge(hop_tokens=prompt_len(fx), safety_tokens=prompt_len(fx))


def test_only_the_enabled_services_are_charged():
    s = session(config=WhatIfConfig(hop=HopConfig(enabled=True)))
    (turn,) = send(s, input="hi").start
    cost = charged(turn, s.config.whatif)
    assert cost is not None and cost.safety_tokens is None and cost.hop_tokens


def test_a_service_call_is_api_work_not_inference_wait():
    now = [0.0]
    timer = PhaseTimer(lambda: now[0])
    timer.wait_inference()
    with timer.service("safety_model"):
        now[0] += 0.004
    now[0] += 0.010  # the model call
    timer.inference_done()
    report = timer.report(0.0, 5.0, 5.0)
    assert report["safety_model"] == 4.0 and report["api_overhead"] == 4.0 and report["other"] == 0.0


def test_a_stored_record_round_trip_keeps_the_whole_history_unread():
    record = StoredResponse(
        id="resp_x",
        owner="",
        created_at=0.0,
        response={},
        input_items=[],
        context=[{"type": "message", "role": "user", "content": "hi", "id": "msg_1"}],
    )
    from actors.core.context import from_record

    entry = from_record(record, lambda: session()._prep.new_scan(), PhaseTimer(lambda: 0.0))
    assert entry.fresh_tokens == len(entry.tokens) > 0


def test_an_append_mode_resume_is_charged_what_the_conversation_gained_plus_the_window():
    import json

    from inference.types import Done, FunctionCallDelta, Prefilled
    from tests.actors.test_session import TOOL

    s = Session(SessionConfig(whatif=whatif()), [MODEL], session_key="c", append_mode=True, clock=lambda: 1.0)
    fx = send(s, input="fix it", tools=[TOOL], store=False)
    (turn,) = fx.start
    first = len(turn.request.prompt_token_ids)
    paused = handled(
        s,
        InferenceChunk(
            turn.turn_id,
            [
                Prefilled(first, 0, 0, 1),
                FunctionCallDelta(0, "read_file", '{"path":"a.py"}', 5),
                Done("tool_calls", 5, 5.0),
            ],
        ),
    )
    call_id = paused.events[-1].item.call_id
    handled(
        s,
        ClientFrame(
            json.dumps(
                {
                    "type": "response.append",
                    "response_id": turn.builder.response.id,
                    "input": [{"type": "function_call_output", "call_id": call_id, "output": "x=1"}],
                }
            )
        ),
    )
    gained = len(turn.request.prompt_token_ids) - first  # the call and its result
    window = min(WINDOW, first - turn.prefix_len)  # a short conversation: all of it is the window
    assert charged(turn) == Charge(hop_tokens=gained, safety_tokens=gained + window)


class Services:
    """The services on a fake clock: each call takes ``ms`` and is recorded in order."""

    def __init__(self, now: list[float], ms: float) -> None:
        self.now, self.ms = now, ms
        self.calls: list[tuple[str, int]] = []

    async def forward(self, tokens: int) -> None:
        self.calls.append(("hop", tokens))
        self.now[0] += self.ms / 1000

    async def classify(self, tokens: int) -> None:
        self.calls.append(("safety_model", tokens))
        self.now[0] += self.ms / 1000


def test_the_hook_calls_the_hop_then_the_classifier_each_a_phase_of_the_response():
    s = session()
    rid = (
        answer_text(s, send(s, input="a first message that is long enough to pass the window"))
        .events[-1]
        .response.id
    )
    (turn,) = send(s, input="next", previous_response_id=rid).start
    now = [0.0]
    timer = PhaseTimer(lambda: now[0])
    services = Services(now, ms=2.0)
    timer.wait_inference()
    asyncio.run(WhatIfServices(whatif(), services)(replace(ModelCall.of(turn), timer=timer)))
    now[0] += 0.010  # the model call
    timer.inference_done()
    cost = charged(turn)
    assert cost is not None
    assert services.calls == [("hop", cost.hop_tokens), ("safety_model", cost.safety_tokens)]
    report = timer.report(0.0, 5.0, 5.0)
    assert report["hop"] == report["safety_model"] == 2.0
    assert report["api_overhead"] == 4.0 and report["other"] == 0.0


def test_the_hook_calls_only_the_enabled_services():
    s = session(config=WhatIfConfig(safety_model=SafetyModelConfig(enabled=True)))
    (turn,) = send(s, input="hi").start
    services = Services([0.0], ms=0.0)
    asyncio.run(WhatIfServices(s.config.whatif, services)(ModelCall.of(turn)))
    assert [name for name, _ in services.calls] == ["safety_model"]
    assert "hop" not in turn.timer.ms
