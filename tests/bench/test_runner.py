"""The load runner's pure parts: the saturation decision, the self-measurement window, the
driver's batching, the summary, the loop's pre-encoded creates, the placement of actors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench import workload as wl
from bench.client import is_final_frame, is_first_token_frame
from bench.conversation import TIMINGS_KEY
from bench.reference import Frames
from bench.runner import LAG_P99_LIMIT_MS, ClientStats, LoadResult, LoadSpec, TurnRecord, saturation
from bench.runner.channels import Channel, Reply
from bench.runner.cluster import client_nodes, no_client_nodes_message, placement
from bench.runner.drive import PULL_EVERY_S, drive, shares
from bench.runner.loop import Encoder, Loop, Pace, parse_reply
from bench.runner.model import client_stats, rollout_spans, window_usage


def test_a_client_is_saturated_by_its_lag_or_its_cpu_and_says_which():
    assert saturation(0.5, LAG_P99_LIMIT_MS) is None
    assert "lag p99 25.0 ms > 20 ms" in (saturation(0.5, 25.0) or "")
    assert "CPU 90 % of a core > 80 %" in (saturation(0.9, 1.0) or "")
    both = saturation(0.95, 40.0) or ""
    assert "lag" in both and "CPU" in both
    assert saturation(0.1, None) is None


def test_the_self_measurement_counts_only_the_window():
    cpu = [(0.0, 0.0), (1.0, 0.5), (2.0, 0.6), (3.0, 0.7), (4.0, 2.0)]
    ticks = [(0.5, 100.0)] * 5 + [(1.0 + i / 100, 1.0) for i in range(200)] + [(3.5, 100.0)] * 5
    cpu_s, wall_s, p99, worst = window_usage(cpu, ticks, 1.0, 3.0)
    assert (round(cpu_s, 6), wall_s, p99, worst) == (0.2, 2.0, 1.0, 1.0)  # the 100 ms ticks are outside
    stats = client_stats("n1", "10.0.0.2", 7, cpu, ticks, (1.0, 3.0), loops=4, connected=4)
    assert stats.cpu_fraction == 0.1 and not stats.saturated and stats.node_ip == "10.0.0.2"
    busy = client_stats(None, None, 7, cpu, ticks, (0.0, 4.0))
    assert busy.saturated and "lag" in (busy.reason or "")  # the 100 ms ticks are in


def test_a_client_without_samples_in_the_window_is_not_called_valid():
    stats = client_stats(None, None, 1, [], [], (0.0, 1.0))
    assert stats.saturated and "no CPU samples" in (stats.reason or "")


def rec(loop: int, sent: float, total_ms: float, ok: bool = True, code: str | None = None) -> TurnRecord:
    return TurnRecord(loop, "steady", sent, total_ms, 100.0, ok, None, "http://t", 50.0, code)


def stats(saturated: bool = False) -> ClientStats:
    return ClientStats(None, None, 1, 1.0, 10.0, 0.1, 1.0, 2.0, saturated, "CPU" if saturated else None)


def test_the_summary_counts_turns_answered_in_the_window_and_failures_by_type():
    records = [
        rec(0, 9.0, 500.0),  # answered 9.5: before the window
        rec(0, 10.0, 200.0),
        rec(1, 11.0, 300.0),
        rec(1, 12.0, 300.0, ok=False, code="rate_limit_exceeded"),
        rec(0, 19.9, 500.0),  # answered 20.4: after it
    ]
    result = LoadResult(records, [stats()], window=(10.0, 20.0), loops=2, connected=2)
    s = result.summary()
    assert s["turns"] == 2 and s["turns_per_s"] == 0.2
    assert s["nonmodel_ms"] == {"p50": 150.0, "p99": 199.0}
    assert s["ttft_ms"]["p50"] == 50.0
    assert s["failures"] == {"rate_limit_exceeded": 1}
    assert s["valid"] and s["invalid_reason"] is None
    bad = LoadResult(records, [stats(), stats(saturated=True)], window=(10.0, 20.0))
    assert bad.saturated and not bad.summary()["valid"] and "CPU" in (bad.reason or "")


def test_a_spec_refuses_what_the_runner_cannot_run():
    with pytest.raises(ValueError, match="transport"):
        LoadSpec(targets=("http://a",), loops=1, transport="carrier-pigeon")
    with pytest.raises(ValueError, match="target"):
        LoadSpec(targets=(), loops=1)
    with pytest.raises(ValueError, match="check_events"):
        LoadSpec(targets=("http://a",), loops=1, transport="http-full", check_events=True)
    spec = LoadSpec(targets=("http://a", "http://b"), loops=3)
    assert [spec.target(i) for i in range(3)] == ["http://a", "http://b", "http://a"]


def test_loops_are_dealt_round_robin_over_the_workers():
    assert shares(5, 2) == [[0, 2, 4], [1, 3]]
    assert shares(2, 4) == [[0], [1]]


class FakeFleet:
    """Workers answering as LoadWorker does; the clock moves only when the driver sleeps."""

    def __init__(self, workers: int) -> None:
        self.now = 1000.0
        self.workers = workers
        self.calls: list[str] = []
        self.turn = 0
        self.loops_end_at = 0.0  # each worker's loops run until then

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def call(self, method: str, *args: Any) -> list[Any]:
        self.calls.append(method)
        answers: dict[str, Any] = {
            "connect": 3,
            "start": None,
            "first_turns_answered": self.now + 2.0,
            "set_end": None,
            "running": int(self.now < self.loops_end_at),
        }
        if method in answers:
            return [answers[method]] * self.workers
        self.turn += 1
        batch = [rec(w, self.now - 1.0, 10.0) for w in range(self.workers)]
        if method == "pull":
            return [[r] for r in batch]
        return [
            {"records": [r], "errors": {}, "stats": stats(), "stalls": [], "lag_ms": [1.0]} for r in batch
        ]


def test_the_driver_pulls_records_in_batches_not_a_call_per_turn():
    fleet = FakeFleet(workers=2)
    seen: list[int] = []
    spec = LoadSpec(targets=("http://a",), loops=6, duration_s=4 * PULL_EVERY_S, warmup_s=3.0)
    result = drive(
        fleet, spec, on_records=lambda b: seen.append(len(b)), clock=fleet.clock, sleep=fleet.sleep
    )
    assert fleet.calls[:3] == ["connect", "start", "set_end"] and fleet.calls[-1] == "finish"
    # the warm-up and the window: 23 s pulled every 5 s (the release 1 s after connecting)
    assert fleet.calls.count("pull") == 5
    assert seen == [2] * 6 and len(result.records) == 12
    assert result.connected == 6 and result.window == (1004.0, 1024.0)
    assert result.release_at == 1001.0 and result.lag_ms == [1.0, 1.0]


def test_the_window_can_start_when_every_first_turn_is_answered():
    fleet = FakeFleet(workers=1)
    spec = LoadSpec(targets=("http://a",), loops=1, duration_s=1.0, window_after_first_turns=True)
    result = drive(fleet, spec, clock=fleet.clock, sleep=fleet.sleep)
    assert "first_turns_answered" in fleet.calls and result.window == (1002.0, 1003.0)


def test_with_rollouts_per_loop_the_window_ends_once_every_loop_ran_them():
    fleet = FakeFleet(workers=2)
    fleet.loops_end_at = 1003.2
    spec = LoadSpec(targets=("http://a",), loops=4, duration_s=60.0, warmup_s=0.0, rollouts_per_loop=1)
    result = drive(fleet, spec, clock=fleet.clock, sleep=fleet.sleep)
    assert fleet.calls.count("running") == 7 and fleet.calls[-1] == "finish"  # polled every 0.5 s
    assert result.window == (1001.0, 1003.5)  # ended at the first poll that found every loop done


def small_workload() -> wl.Workload:
    return wl.Workload(resume_tokens=0, shape=wl.CODEX, system_tokens=100, tool_def_tokens=200)


def loop_for(transport: str) -> Loop:
    enc = Encoder(small_workload(), transport, False, [json.dumps("out-a"), json.dumps("out-b")])
    return Loop(3, "http://t", enc, Pace(1), [], lambda: None)  # type: ignore[arg-type, return-value]


def test_a_loop_chains_its_creates_with_the_tool_outputs():
    loop = loop_for("ws")
    first = json.loads(loop.first_create())
    assert first["type"] == "response.create" and first["store"] is False
    assert first["input"][-1]["role"] == "user" and "previous_response_id" not in first
    assert first["metadata"][TIMINGS_KEY] == "1" and first["tools"]
    response = {"id": "resp_1", "output": [{"type": "function_call", "call_id": "c1", "name": "shell"}]}
    nxt = json.loads(loop.next_create(response) or "")
    assert nxt["previous_response_id"] == "resp_1" and nxt["input"][0]["call_id"] == "c1"
    assert nxt["input"][0]["output"] in ("out-a", "out-b") and nxt["metadata"] == first["metadata"]
    assert loop.next_create({"id": "resp_2", "output": [{"type": "message"}]}) is None


def test_http_transports_stream_and_http_full_resends_the_conversation():
    chained = loop_for("http-chained")
    first = json.loads(chained.first_create())
    assert first["stream"] is True and first["store"] is True and "type" not in first
    full = loop_for("http-full")
    first = json.loads(full.first_create())
    call = {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"}
    second = json.loads(full.next_create({"id": "resp_1", "output": [call]}) or "")
    assert first["store"] is False and "previous_response_id" not in second
    assert second["input"][: len(first["input"])] == first["input"]
    assert second["input"][-2]["call_id"] == "c1" and second["input"][-1]["type"] == "function_call_output"


def test_a_reply_is_told_completed_or_failed_by_its_code():
    done = '{"type":"response.completed","response":{"id":"r","output":[]}}'
    assert parse_reply(Reply(done, 0.0, 0.1, None))[1:] == (True, None)
    err = '{"type":"error","error":{"code":"rate_limit_exceeded"}}'
    assert parse_reply(Reply(err, 0.0, 0.1, None))[1:] == (False, "rate_limit_exceeded")
    assert parse_reply(Reply("busy", 0.0, 0.1, None, status=503))[1:] == (False, "http_503")
    assert parse_reply(Reply("", 0.0, 0.1, None))[1:] == (False, "stream_ended")


def test_frames_are_told_from_their_head():
    assert is_final_frame('{"type":"response.completed","response":{}}')
    assert is_final_frame('{"type":"error","error":{}}')
    assert not is_final_frame('{"type":"response.output_text.delta","delta":"response.completed"}')
    assert is_first_token_frame('{"type":"response.function_call_arguments.delta","delta":"{"}')


def test_the_reference_servers_frames_end_in_a_call_or_a_message():
    frames = Frames({"model": "emu-fast", "instructions": "be brief", "tools": [{"type": "function"}]})
    raw = Frames.fill(frames.tool, "abc")
    tool = [json.loads(f) for f in raw]
    assert tool[0]["type"] == "response.created" and tool[0]["response"]["instructions"] == "be brief"
    assert is_final_frame(raw[-1]) and not any(map(is_final_frame, raw[:-1]))
    assert tool[-1]["response"]["id"] == "abc" and tool[-1]["response"]["output"][0]["call_id"] == "call_abc"
    assert any(map(is_first_token_frame, raw))
    text = [json.loads(f) for f in Frames.fill(frames.text, "abd")]
    assert text[-1]["response"]["output"][0]["type"] == "message"


def test_load_actors_go_to_client_nodes_one_per_cpu_dealt_across_nodes():
    nodes = [
        {"NodeID": "head", "Alive": True, "Resources": {"CPU": 8}},
        {"NodeID": "c1", "Alive": True, "Resources": {"CPU": 2, "client": 1}},
        {"NodeID": "c2", "Alive": True, "Resources": {"CPU": 1, "client": 1}},
        {"NodeID": "c3", "Alive": False, "Resources": {"CPU": 4, "client": 1}},
    ]
    clients = client_nodes(nodes)
    assert [n["NodeID"] for n in clients] == ["c1", "c2"]
    assert placement(clients, None) == ["c1", "c2", "c1"]
    assert placement(clients, 2) == ["c1", "c2"]
    assert placement(clients, 5) == ["c1", "c2", "c1", "c2", "c1"]


def test_no_client_nodes_names_the_resource_and_the_yaml_key():
    msg = no_client_nodes_message()
    assert "`client`" in msg and "available_node_types.client" in msg and "resources: {client: 1}" in msg
    assert "\n" not in msg


def test_a_rollout_spans_from_its_connection_to_its_last_answer_and_counts_once_it_ended():
    def turn(loop: int, kind: str, sent: float, connect_ms: float | None = None) -> TurnRecord:
        return TurnRecord(loop, kind, sent, 100.0, 50.0, True, connect_ms=connect_ms)

    records = [
        turn(0, "first", 1.0, connect_ms=500.0),
        turn(0, "steady", 2.0),
        turn(1, "first", 1.0),
        turn(0, "rollout_first", 3.0, connect_ms=200.0),
        turn(0, "steady", 4.0),  # the rollout still running: not counted
    ]
    spans = rollout_spans(records)
    assert [(a, b, len(t)) for a, b, t in spans] == [(0.5, 2.1, 2)]


def test_a_lagging_client_that_waited_for_a_core_says_the_node_was_busy():
    cpu = [(float(t), 0.1 * t) for t in range(5)]
    ticks = [(1.0 + i / 100, 30.0) for i in range(100)]
    waits = [(float(t), 0.5 * t) for t in range(5)]
    stats = client_stats(None, None, 1, cpu, ticks, (0.0, 4.0), waits=waits)
    assert stats.saturated and stats.runqueue_wait_fraction == 0.5
    assert "waited for a core 50 %" in (stats.reason or "")
    calm = client_stats(None, None, 1, cpu, ticks, (0.0, 4.0), waits=[(0.0, 0.0), (4.0, 0.0)])
    assert calm.saturated and "waited" not in (calm.reason or "")


class AnsweringChannel(Channel):
    """Answers every create at once with a completed response calling a tool."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, body: str) -> Reply:
        self.sent.append(body)
        call = {"type": "function_call", "call_id": f"c{len(self.sent)}", "name": "shell", "arguments": "{}"}
        raw = json.dumps(
            {"type": "response.completed", "response": {"id": f"r{len(self.sent)}", "output": [call]}}
        )
        return Reply(raw, 0.0, 0.001, 0.0005)


def test_a_loop_whose_tool_would_outlast_the_window_stops_instead_of_sleeping_through_it():
    import asyncio
    import time

    w = wl.Workload(resume_tokens=0, system_tokens=100, tool_def_tokens=200, tool_time_ms=600_000.0)
    pace = Pace(1)

    class WindowEndingChannel(AnsweringChannel):  # the window ends 0.1 s into the first turn
        async def send(self, body: str) -> Reply:
            pace.end_at = time.time() + 0.1  # (not before it: a stalled test process would send none)
            return await super().send(body)

    channel = WindowEndingChannel()
    sink: list[TurnRecord] = []

    async def run() -> None:
        loop = Loop(0, "http://t", Encoder(w, "ws", False, [json.dumps("out")]), pace, sink, lambda: channel)
        await asyncio.wait_for(loop.run(release_at=0.0), timeout=60.0)  # not the tool's 5-15 minutes
        assert pace.storm_over.is_set()

    asyncio.run(run())
    assert len(channel.sent) == 1 and [r.kind for r in sink] == ["first"] and sink[0].ok


class RefusingChannel(AnsweringChannel):
    async def send(self, body: str) -> Reply:
        self.sent.append(body)
        return Reply('{"type":"error","error":{"code":"rate_limit_exceeded"}}', 0.0, 0.001, None)


def test_a_loop_stops_after_its_rollouts_when_told_how_many():
    import asyncio
    import time

    sink: list[TurnRecord] = []
    done = '{"type":"response.completed","response":{"id":"r1","output":[],"status":"completed"}}'

    class TextChannel(AnsweringChannel):  # every answer a text: each rollout is one turn
        async def send(self, body: str) -> Reply:
            self.sent.append(body)
            return Reply(done, time.time(), 0.001, None)

    channels: list[TextChannel] = []

    def new_channel() -> TextChannel:
        channels.append(TextChannel())
        return channels[-1]

    async def run() -> None:
        pace = Pace(1, end_at=time.time() + 60.0, rollouts=2)
        enc = Encoder(small_workload(), "ws", False, [json.dumps("out")])
        loop = Loop(0, "http://t", enc, pace, sink, new_channel, fresh_connection=True)
        await asyncio.wait_for(loop.run(release_at=0.0), timeout=30.0)

    asyncio.run(run())
    assert [r.kind for r in sink] == ["first", "rollout_first"] and len(channels) == 2


def test_a_loop_with_a_connection_per_rollout_pauses_after_a_failed_turn_before_the_next():
    import asyncio
    import time

    pace = Pace(1)

    class WindowEndingChannel(RefusingChannel):  # the window ends 0.1 s after the first create
        async def send(self, body: str) -> Reply:
            if pace.end_at == float("inf"):
                pace.end_at = time.time() + 0.1  # (not before it: a stalled test process would send none)
            return await super().send(body)

    channels: list[RefusingChannel] = []

    def new_channel() -> RefusingChannel:
        channels.append(WindowEndingChannel())
        return channels[-1]

    sink: list[TurnRecord] = []

    async def run() -> None:
        enc = Encoder(small_workload(), "ws", False, [json.dumps("out")])
        loop = Loop(0, "http://t", enc, pace, sink, new_channel, fresh_connection=True)
        await asyncio.wait_for(loop.run(release_at=0.0), timeout=60.0)

    asyncio.run(run())
    assert [r.error_code for r in sink] == ["rate_limit_exceeded"]  # one, not a storm of them
    assert sum(len(c.sent) for c in channels) == 1
