"""The neighbours kind on the load runner: its burst's loops each continue a stored response
(``LoadSpec.continues``), its HTTP clients send one large stateless request a rollout (a
workload's document), and its figures are read from the runner's records."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import workload as wl
from bench.kinds import neighbours
from bench.neighbours_report import ProbeTurn, burst_summary, burst_window, http_summary, ratios
from bench.runner import ClientStats, LoadResult, LoadSpec, TurnRecord
from bench.runner.loop import Encoder, Loop, Pace
from inference.tokenizer import encode

pytestmark = pytest.mark.unit


def args(**over: object) -> argparse.Namespace:
    base = {"http_clients": 3, "http_tokens": 2000, "neighbour_output_tokens": 16, "http_warmup_s": 2.0}
    return argparse.Namespace(**(base | over))


def loop_of(spec: LoadSpec, index: int = 1) -> Loop:
    w = spec.custom_workload
    assert w is not None
    enc = Encoder(w, spec.transport, spec.store, [json.dumps("out")])
    previous = spec.continues[index] if spec.continues else None
    return Loop(index, spec.target(index), enc, Pace(1), [], lambda: None, continues=previous)  # type: ignore[arg-type, return-value]


def test_a_burst_loop_continues_its_stored_response_with_the_task_alone_once():
    spec = neighbours.burst_spec("http://a", ["resp_a", "resp_b"], 16)
    assert spec.loops == 2 and spec.rollouts_per_loop == 1 and spec.transport == "ws" and spec.hold
    loop = loop_of(spec)
    first = json.loads(loop.first_create())
    codex = wl.PRESETS["codex"]
    assert first["previous_response_id"] == "resp_b" and first["store"] is False
    assert first["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": wl.task(codex, 1)}]}
    ]
    assert (
        first["instructions"] == wl.fixed(codex)["instructions"]
        and first["tools"] == wl.fixed(codex)["tools"]
    )
    assert (
        first["metadata"]["emulator.tool_rounds"] == "0" and first["metadata"]["emulator.text_tokens"] == "16"
    )
    later = json.loads(loop.held_create())  # a later rollout continues nothing
    assert "previous_response_id" not in later


def test_a_spec_continues_one_stored_response_a_loop_and_not_over_http_full():
    for bad in (
        {"loops": 2, "continues": ("a",)},
        {"loops": 1, "continues": ("a",), "transport": "http-full"},
        {"loops": 1, "continues": ("a",), "workload": "chains"},
    ):
        with pytest.raises(ValueError, match="continues"):
            LoadSpec(targets=("http://a",), **bad)  # type: ignore[arg-type]
    LoadSpec(targets=("http://a",), loops=1, continues=("a",), transport="http-chained")


def test_the_http_clients_send_one_document_the_same_every_request_and_a_short_task():
    spec = neighbours.http_spec("http://a", args())
    assert (spec.loops, spec.transport, spec.workload, spec.warmup_s) == (3, "http-full", "codex", 2.0)
    loop = loop_of(spec)
    first = json.loads(loop.first_create())
    second = json.loads(loop.held_create())
    assert first["stream"] is True and first["store"] is False and "instructions" not in first
    assert "tools" not in first and "previous_response_id" not in first
    assert first["metadata"]["emulator.tool_rounds"] == "0"
    document, task = first["input"]
    assert second["input"][0] == document and second["input"][1] != task  # the same document, a new task
    assert len(encode(document["content"][0]["text"])) == 2000


def record(loop: int, sent: float, total_ms: float, ok: bool = True, **kw: object) -> TurnRecord:
    return TurnRecord(loop, "first", sent, total_ms, None, ok, **kw)  # type: ignore[arg-type]


def stats(saturated: bool = False) -> ClientStats:
    return ClientStats(None, None, 1, 0.5, 2.0, 0.25, 1.0, 2.0, saturated, "lag" if saturated else None)


def test_the_http_figures_count_the_requests_sent_since_the_probe_began():
    rows = [
        record(0, 10.0, 100.0, input_tokens=2000, server={"render": 4.0}),
        record(1, 12.0, 300.0, input_tokens=2000, server={"render": 8.0}),
        record(0, 13.0, 50.0, ok=False, error_code="http_503"),
    ]
    out = http_summary(LoadResult(rows, [stats(True)], errors={0: ["busy"]}), since=11.0)
    assert (out["requests"], out["requests_measured"], out["input_tokens"]) == (2, 1, 2000)
    assert out["ms"]["p50"] == 300.0 and out["server_ms_median"]["render"] == 8.0
    assert out["failures"] == {"http_503": 1} and out["errors"] == ["busy"]
    assert out["clients"] == {"cpu_s": 0.5, "saturated": ["lag"]}


def test_a_burst_spans_its_release_to_its_last_answer_and_its_turns_say_when_created():
    one = LoadResult(
        [record(0, 100.0, 400.0, first_event_ms=40.0), record(1, 100.0, 600.0, first_event_ms=80.0)],
        [stats()],
        release_at=100.0,
    )
    two = LoadResult([record(0, 200.0, 200.0, first_event_ms=20.0)], [stats()], release_at=200.0)
    assert burst_window(one) == (100.0, 100.6)
    out = burst_summary([one, two])
    assert out["bursts"] == 2 and out["window_ms"]["max"] == 600.0 and out["window_ms"]["n"] == 2
    assert out["created_ms"]["p50"] == 40.0 and out["total_ms"]["max"] == 600.0
    assert out["clients"]["saturated"] == [] and out["failures"] == {}


def test_each_loaded_phase_is_a_ratio_of_its_probe_p50_to_idle():
    def phase(p50: float) -> dict:
        return {"probe": {"turn_ms": {"p50": p50}}}

    assert ratios({"idle": phase(10.0), "http": phase(15.0), "burst": phase(30.0)}) == {
        "http": 1.5,
        "burst": 3.0,
    }
    turn = ProbeTurn(100.0, 250.0, 200.0, None)
    assert turn.ended == 100.25 and turn.nonmodel_ms == 50.0
