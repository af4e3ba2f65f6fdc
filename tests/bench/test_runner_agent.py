"""The load runner's rollouts workload (bench/runner/agent.py), the agentloop kind's: jobs taken
in their interleaved order, each rollout the same conversation on every transport (tool outputs,
breakpoints), each transport continuing it its own way, every turn recorded with its bytes,
calls and tool time, and the records made into one rollout record a rollout and transport."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import pytest

from bench import workload as wl
from bench.rollouts import rollouts_of
from bench.runner import LoadSpec
from bench.runner.agent import Agent, Conversation
from bench.runner.channels import Channel, Reply
from bench.runner.replies import parse_reply
from bench.runner.worker import LoadWorker
from bench.runner.workloads import Rollouts

pytestmark = pytest.mark.unit

W = wl.Workload(
    tool_rounds=2,
    system_tokens=40,
    tool_def_tokens=120,
    task_tokens=8,
    tool_output_tokens=12,
    text_tokens=4,
    tool_time_ms=1,
)


def frame(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


class Server(Channel):
    """One rollout's connection to a scripted model: a function call while the conversation
    holds fewer tool results than the workload's rounds, then a text answer.  Append mode's
    answers pause on the call (the segment), its last one is the terminal event."""

    def __init__(self, transport: str, made: list[tuple[str, Channel]], fail_turn: int | None = None) -> None:
        self.transport, self.fail_turn = transport, fail_turn
        self.sent: list[dict[str, Any]] = []
        made.append((transport, self))

    async def send(self, body: str) -> Reply:
        event = json.loads(body)
        self.sent.append(event)
        n = len(self.sent)
        if n == self.fail_turn:
            error = {"type": "error", "error": {"code": "boom", "message": "scripted"}}
            return Reply(frame(error), time.time(), 0.002, None)
        call = {"type": "function_call", "call_id": f"call_{n}", "name": "shell", "arguments": "{}"}
        text = {"type": "message", "content": [{"type": "output_text", "text": "done"}]}
        item = call if n <= W.tool_rounds else text
        usage = {"input_tokens": 100 * n, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 50}}
        response = {"id": f"resp_{n}", "output": [item], "usage": usage, "metadata": {}}
        if self.transport == "append":
            if item is call:
                done = frame({"type": "response.output_item.done", "item": call})
                return Reply(done, time.time(), 0.002, 0.001, segment=[call], response_id="resp_append")
            final = frame({"type": "response.completed", "response": {**response, "output": []}})
            return Reply(final, time.time(), 0.002, 0.001, segment=[text], response_id="resp_append")
        return Reply(frame({"type": "response.completed", "response": response}), time.time(), 0.002, 0.001)


def run(spec: LoadSpec, monkeypatch: pytest.MonkeyPatch, fail: tuple[str, int, int] | None = None) -> tuple:
    """The worker's calls in the driver's order; the channels made in order, the warm-ups asked
    for, and what ``finish`` answered."""
    made: list[tuple[str, Channel]] = []
    warmed: list[tuple[str, int]] = []
    jobs_seen: list[tuple[str, int]] = []

    def channel(self: Agent, target: str, transport: str, loop: int) -> Channel:
        rollout = self.jobs_taken[-1] if hasattr(self, "jobs_taken") else None
        f = fail[2] if fail and (transport, rollout) == fail[:2] else None
        return Server(transport, made, fail_turn=f)

    real_take = Agent.conversation

    def conversation(self: Agent, transport: str, rollout: int) -> Conversation:
        self.jobs_taken = [*getattr(self, "jobs_taken", []), rollout]  # type: ignore[attr-defined]
        jobs_seen.append((transport, rollout))
        return real_take(self, transport, rollout)

    async def warm(self: Agent, target: str, transport: str, rollout: int) -> None:
        warmed.append((transport, rollout))

    monkeypatch.setattr(Agent, "channel", channel)
    monkeypatch.setattr(Agent, "conversation", conversation)
    monkeypatch.setattr(Agent, "warm", warm)
    worker = LoadWorker(spec, list(range(spec.loops)))

    async def main() -> dict[str, Any]:
        await worker.connect()
        await worker.start(time.time())
        await worker.set_end(time.time() + 60)
        while await worker.running():
            await asyncio.sleep(0.01)
        return await worker.finish((0.0, time.time()))

    return made, warmed, jobs_seen, asyncio.run(main())


def spec(w: wl.Workload = W, **shape: Any) -> LoadSpec:
    rollouts = Rollouts(**{"transports": ("ws", "append", "http-full"), "count": 2, **shape})
    return LoadSpec(
        targets=("http://a",),
        loops=2,
        workload="rollouts",
        custom_workload=w,
        warmup_s=0.0,
        rollouts=rollouts,
    )


def test_the_loops_take_the_jobs_in_order_and_each_rollout_is_the_same_on_every_transport(monkeypatch):
    made, warmed, jobs, out = run(spec(warmup=True, settle_s=0.0), monkeypatch)
    order = [("ws", 0), ("append", 0), ("http-full", 0), ("ws", 1), ("append", 1), ("http-full", 1)]
    assert jobs == [("ws", -1), ("append", -1), ("http-full", -1), *order]  # the warm-up first, in turn
    assert warmed == []  # no resumed history: nothing to put in the cache
    records = out["records"]
    assert {r.rollout for r in records} == {0, 1} and all(r.ok for r in records)  # the warm-up's not kept
    rollouts = {(r.transport, r.rollout): r for r in rollouts_of(records, W)}
    assert sorted(rollouts) == sorted(order)
    for r in rollouts.values():
        assert r.error is None and [t.calls for t in r.turns] == [1, 1, 0]
        assert [t.tool_ms > 0 for t in r.turns] == [True, True, False] and r.e2e_s > 0
    # the tool outputs of a rollout are the same on every transport, and differ between rollouts
    sent = {t: [c for tt, c in made[3:] if tt == t] for t in ("ws", "append", "http-full")}

    def outputs(event: dict[str, Any]) -> list[str]:
        return [i["output"] for i in event["input"] if i.get("type") == "function_call_output"]

    for k in (0, 1):
        ws, append, full = (sent[t][k].sent for t in ("ws", "append", "http-full"))  # type: ignore[attr-defined]
        assert outputs(ws[1]) == outputs(append[1]) == outputs(full[1])[-1:]
        assert outputs(ws[2]) == outputs(append[2]) == outputs(full[2])[-1:]
    assert outputs(sent["ws"][0].sent[1]) != outputs(sent["ws"][1].sent[1])  # type: ignore[attr-defined]


def test_each_transport_continues_the_conversation_its_own_way_and_its_bytes_are_counted(monkeypatch):
    made, _, _, out = run(spec(), monkeypatch)
    by = {t: c.sent for t, c in made if c.sent and t in ("ws", "append", "http-full")}  # type: ignore[attr-defined]
    ws, append, full = by["ws"], by["append"], by["http-full"]
    assert ws[0]["type"] == "response.create" and "previous_response_id" not in ws[0]
    assert ws[1]["previous_response_id"] == "resp_1" and [i["type"] for i in ws[1]["input"]] == [
        "function_call_output"
    ]
    assert append[1] == {"type": "response.append", "response_id": "resp_append", "input": append[1]["input"]}
    kinds = [i.get("type", "message") for i in full[2]["input"]]
    assert full[2]["stream"] is True and "type" not in full[2]
    assert kinds == [
        "message",
        "function_call",
        "function_call_output",
        "function_call",
        "function_call_output",
    ]
    for r in out["records"]:
        assert r.request_bytes > 0 and r.turn in (1, 2, 3)
    last_ws = max((r for r in out["records"] if r.transport == "ws"), key=lambda r: r.request_bytes)
    last_full = max((r for r in out["records"] if r.transport == "http-full"), key=lambda r: r.request_bytes)
    assert last_full.request_bytes > last_ws.request_bytes  # the full resend grows


def test_a_failed_turn_fails_its_rollout_and_the_loop_takes_the_next_job(monkeypatch):
    _, _, jobs, out = run(spec(transports=("ws",), count=3), monkeypatch, fail=("ws", 1, 2))
    assert jobs == [("ws", 0), ("ws", 1), ("ws", 2)]
    rollouts = {r.rollout: r for r in rollouts_of(out["records"], W)}
    assert rollouts[1].error == "turn 2: boom" and rollouts[1].model_s is None
    assert rollouts[0].error is None and rollouts[2].error is None


def test_a_resumed_history_is_warmed_under_each_transport_before_its_rollout(monkeypatch):
    resumed = replace(W, resume_tokens=300)
    _, warmed, jobs, _ = run(spec(resumed, transports=("ws", "http-full")), monkeypatch)
    assert warmed == jobs == [("ws", 0), ("http-full", 0), ("ws", 1), ("http-full", 1)]


def test_breakpoints_mark_the_first_input_and_each_turns_last_tool_output():
    conv = Conversation(replace(W, breakpoints=True, breakpoint_ttl="12h"), "ws", 0)
    first = json.loads(conv.first())
    assert first["input"][0]["content"][-1]["prompt_cache_breakpoint"] == {"mode": "explicit", "ttl": "12h"}
    call = {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"}
    nxt = json.loads(conv.next({"id": "r1", "output": [call, call]}) or "{}")
    marks = ["prompt_cache_breakpoint" in i["output"][-1] for i in nxt["input"]]
    assert marks == [False, True]


def test_the_tools_time_and_outputs_after_a_turn_are_that_turn_s():
    w = replace(W, tool_time_ms=300)
    conv = Conversation(w, "http-full", 3)
    call = {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"}
    conv.first()
    for turn in (1, 2):
        nxt = json.loads(conv.next({"id": f"r{turn}", "output": [call]}) or "{}")
        assert conv.tool_time_s() == wl.tool_time_s(w, 3, turn)
        assert nxt["input"][-1]["output"] == wl.tool_output(w, 3, turn, 0, "shell")
    assert len({wl.tool_time_s(w, 3, t) for t in (1, 2, 3)}) == 3  # the turns' times differ


def test_append_mode_s_pause_is_an_answer_with_its_segment():
    call = {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"}
    paused = Reply(frame({"type": "response.output_item.done", "item": call}), 0.0, 0.1, None, segment=[call])
    paused.response_id = "resp_a"
    assert parse_reply(paused) == ({"id": "resp_a", "output": [call]}, True, None)
    final = Reply(
        frame({"type": "response.completed", "response": {"id": "resp_a", "output": [call, call]}}),
        0.0,
        0.1,
        None,
        segment=[],
    )
    assert parse_reply(final) == ({"id": "resp_a", "output": []}, True, None)


def test_the_rollouts_shape_refuses_unknown_transports():
    with pytest.raises(ValueError, match="unknown transports"):
        Rollouts(("ws", "smoke"))
    assert Rollouts(("ws", "append"), count=2, first=-1).jobs() == [
        ("ws", -1),
        ("append", -1),
        ("ws", 0),
        ("append", 0),
    ]
