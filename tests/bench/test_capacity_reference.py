"""bench capacity beside the bare-protocol reference: the ratios and their report
(bench/capacity_report.py), the recorded frames' templates and the choice of answer
(bench/reference.py).  Pure: no server, no timing."""

from __future__ import annotations

import json

from bench import capacity_report as report
from bench import reference
from bench.kinds import capacity


def level(p50, p99, storm_p99, tps, cpu=None, ref_cpu=None):
    out = {
        "steady_ms": {"turns": 100, "p50": p50, "p99": p99},
        "first_turns_ms": {"turns": 256, "p50": storm_p99 / 2, "p99": storm_p99},
        "turns_per_s": tps,
    }
    if cpu is not None:
        out["cpu_ms_per_turn"] = cpu
    if ref_cpu is not None:
        out["reference_cpu_ms_per_turn"] = ref_cpu
    return out


def test_a_ratio_is_the_server_over_the_reference_and_none_against_nothing():
    assert report.ratio(19.8, 5.0) == 3.96
    assert (
        report.ratio(1.0, 0.0) is None and report.ratio(None, 2.0) is None and report.ratio(2.0, None) is None
    )


def test_each_figure_is_compared_and_judged_against_its_target():
    vs = report.compare(level(4.3, 19.8, 1000.0, 94.5), level(1.7, 5.0, 138.0, 100.6))
    assert vs["steady_p99"] == {"server": 19.8, "reference": 5.0, "ratio": 3.96, "target": 2.0, "met": False}
    assert vs["storm_p99"]["ratio"] == 7.25 and vs["storm_p99"]["met"] is False
    assert vs["steady_p50"]["target"] is None and vs["steady_p50"]["met"] is None
    assert vs["turns_per_s"]["ratio"] == 0.94
    within = report.compare(level(3.0, 9.0, 400.0, 99.0), level(1.5, 5.0, 138.0, 100.0))
    assert within["steady_p99"]["met"] is True and within["storm_p99"]["met"] is True


def test_a_figure_missing_on_one_side_has_no_ratio_and_no_verdict():
    ref = level(1.7, 5.0, 138.0, 100.6)
    del ref["steady_ms"]["p99"]
    vs = report.compare(level(4.3, 19.8, 1000.0, 94.5), ref)
    assert vs["steady_p99"]["ratio"] is None and vs["steady_p99"]["met"] is None
    assert "no ratio" in report.verdict(vs["steady_p99"])


def test_the_cpu_per_turn_stands_beside_the_references_own():
    cpu = {"gateway": 0.5, "session_host": 6.0, "inference": 3.0, "ray": 1.0, "api_tier": 6.5, "all": 10.5}
    beside = report.cpu_beside(level(4, 19, 900, 95, cpu=cpu), level(2, 5, 138, 100, ref_cpu=2.6))
    assert beside["server"]["session_host"] == 6.0 and beside["reference"] == 2.6
    assert beside["api_tier_ratio"] == 2.5


def test_the_report_names_one_loop_alone_and_each_verdict():
    vs = report.compare(level(4.3, 19.8, 1000.0, 1.3), level(1.7, 5.0, 138.0, 1.3))
    text = "\n".join(
        report.lines(1, vs, report.cpu_beside(level(1, 1, 1, 1), level(1, 1, 1, 1, ref_cpu=2.0)))
    )
    assert report.ALONE in text and "4.3 / 1.7 = 2.53×" in text
    assert "target ≤ 2×: OVER" in text and "the reference 2.0" in text
    assert report.ALONE not in "\n".join(report.lines(256, vs, report.cpu_beside({}, {})))


def test_turns_answered_in_a_window_leave_the_storms_first_turns_out():
    records = [
        {"ok": True, "kind": "first", "sent": 1.0, "total_ms": 500.0},
        {"ok": True, "kind": "steady", "sent": 2.0, "total_ms": 100.0},
        {"ok": True, "kind": "rollout_first", "sent": 3.0, "total_ms": 100.0},
        {"ok": False, "kind": "steady", "sent": 3.0, "total_ms": 100.0},
        {"ok": True, "kind": "steady", "sent": 9.0, "total_ms": 100.0},
    ]
    assert capacity.answered_between(records, 1.0, 5.0) == 2


# ----------------------------------------------------------------------------- the reference's frames


def server_answer(
    rid="resp_9f", prev=None, timings='{"queue":1.5,"prefill":20.0,"decode":80.0,"render":2.0}'
):
    call = {"type": "function_call", "id": "fc_77", "call_id": "call_42", "name": "shell"}
    response = {
        "id": rid,
        "previous_response_id": prev,
        "status": "completed",
        "output": [{**call, "arguments": "{}", "status": "completed"}],
        "metadata": {"responses_ws.timings": timings},
    }
    events = [
        {"type": "response.created", "response": {**response, "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "item": {**call, "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_77", "delta": "{}"},
        {"type": "response.completed", "response": response},
    ]
    return [json.dumps(e, separators=(",", ":")) for e in events]  # compact, as the server writes


def test_a_recorded_answer_becomes_a_template_of_its_ids_with_model_time_zero():
    frames = reference.template(server_answer(prev="resp_1a"))
    joined = "".join(frames)
    assert (
        "resp_9f" not in joined
        and "fc_77" not in joined
        and "call_42" not in joined
        and "resp_1a" not in joined
    )
    filled = reference.fill(reference.compile_frames(frames), "c_3", "resp_c_2")
    events = [json.loads(f) for f in filled]
    done = events[-1]["response"]
    assert done["id"] == "resp_c_3" and done["previous_response_id"] == "resp_c_2"
    assert events[2]["item_id"] == done["output"][0]["id"] == events[1]["item"]["id"]
    assert done["output"][0]["call_id"].startswith("call_") and done["output"][0]["call_id"] != done["id"]
    timings = json.loads(done["metadata"]["responses_ws.timings"])
    assert set(timings) == {"queue", "prefill", "decode", "render"} and not any(timings.values())
    assert events[0]["type"] == "response.created" and len(filled) == 4


def test_two_turns_of_one_connection_get_ids_of_their_own():
    parts = reference.compile_frames(reference.template(server_answer()))
    a, b = (json.loads(reference.fill(parts, rid, "")[-1])["response"] for rid in ("c_1", "c_2"))
    assert a["id"] != b["id"] and a["output"][0]["call_id"] != b["output"][0]["call_id"]


def create(prev=None, outputs=0, tool_rounds="8"):
    body = {"type": "response.create", "metadata": {"emulator.tool_rounds": tool_rounds}, "input": []}
    body["input"] = [
        {"type": "function_call_output", "call_id": f"c{i}", "output": "ok"} for i in range(outputs)
    ]
    if prev:
        body["previous_response_id"] = prev
    return body


def test_the_reference_answers_as_the_emulated_model_decides_from_the_tool_results_in_context():
    assert reference.choose(create(), 0, 8) == ("first", 0)
    assert reference.choose(create("r1", 1), 0, 8) == ("steady", 1)
    assert reference.choose(create("r7", 1), 7, 8) == ("final", 8)
    assert reference.choose(create(None, 0), 7, 8) == ("first", 0)  # a new rollout: its chain starts over
    assert reference.choose(create("r1", 1, tool_rounds="x"), 0, 1) == ("final", 1)  # no number: ``rounds``
    assert reference.choose({"input": "hi"}, 3, 2) == ("first", 0)


def test_synthesized_answers_end_in_a_call_or_a_message():
    answers = reference.Answers(None)
    first = create()
    first.update(model="emu-fast", instructions="be brief", tools=[])
    call = [json.loads(f) for f in answers.frames("first", first, "c_1", "")]
    text = [json.loads(f) for f in answers.frames("final", first, "c_2", "c_1")]
    assert (
        call[-1]["response"]["output"][0]["type"] == "function_call" and call[-1]["response"]["id"] == "c_1"
    )
    assert text[-1]["response"]["output"][0]["type"] == "message"


def test_the_hosts_loop_lag_is_read_from_the_servers_timings_when_it_reports_it():
    def turn(kind, lag=None):
        server = {"api_overhead": 2.0} if lag is None else {"api_overhead": 2.0, "loop_lag": lag}
        return {"kind": kind, "ok": True, "sent": 0.0, "total_ms": 10.0, "model_ms": 1.0, "server": server}

    storm = [turn("first", float(ms)) for ms in range(1, 101)]
    got = capacity.host_loop_lag([*storm, turn("steady", 500.0)], "first")
    assert got is not None and got["turns"] == 100 and got["max"] == 100.0 and 50.0 <= got["p50"] <= 51.0
    assert capacity.host_loop_lag([turn("first"), turn("steady")], "first") is None
    vs = report.compare(level(4.3, 19.8, 1000.0, 94.5), level(1.7, 5.0, 138.0, 100.6))
    beside = report.cpu_beside({}, {})
    assert "p99 99.01 ms, max 100.0 ms" in "\n".join(
        report.lines(256, vs, beside, {"storm": {**got, "p99": 99.01}})
    )
    assert "not reported by this server" in "\n".join(report.lines(256, vs, beside, {"storm": None}))


def test_the_references_timings_leave_the_hosts_loop_lag_out():
    frames = reference.template(server_answer(timings='{"queue":1.0,"decode":2.0,"loop_lag":40.0}'))
    done = json.loads(reference.fill(reference.compile_frames(frames), "c_1", "")[-1])["response"]
    assert json.loads(done["metadata"]["responses_ws.timings"]) == {"queue": 0.0, "decode": 0.0}
