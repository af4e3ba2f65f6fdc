"""The runner's per-connection records and its ``chains`` workload (the multi-node fault
load's clients): what each connection sent and got and how it ended, the lookup of where it
went, and the chains' and the Codex-like resend's creates, on a scripted channel."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from bench.runner import Chains, ConnectionRecord, LoadResult, LoadSpec, TurnRecord
from bench.runner.chains import ChainLoop
from bench.runner.channels import Connections, note_frame
from bench.runner.connecting import ConnectLog
from bench.runner.locate import Locator
from bench.runner.loop import Pace

from .scripted import SHUTTING, Scripted, Step, frame

pytestmark = pytest.mark.unit


def completed(rid: str, cached: int = 0) -> str:
    usage = {"output_tokens": 3, "input_tokens_details": {"cached_tokens": cached}}
    out = [{"type": "message", "content": [{"type": "output_text", "text": f"answer {rid}"}]}]
    return frame({"type": "response.completed", "response": {"id": rid, "output": out, "usage": usage}})


FAILED = frame({"type": "response.failed", "response": {"id": "r", "error": {"code": "server_error"}}})


def test_a_connection_counts_its_creates_answers_and_how_they_ended():
    record = ConnectionRecord(loop=0, index=0, opened=1.0, local_port=5)
    record.creates, record.in_flight = 1, True
    assert not note_frame(record, '{"type":"response.created","response":{}}')
    assert not note_frame(record, '{"type":"response.output_text.delta","delta":"x"}')
    assert note_frame(record, completed("a")) and not record.in_flight
    assert note_frame(record, FAILED)
    assert note_frame(record, SHUTTING)
    assert note_frame(record, frame({"type": "error", "error": {"code": "other"}}))
    assert (record.created, record.terminals, record.completed, record.shutting_down) == (1, 2, 1, 1)


def test_connections_are_numbered_per_loop():
    conns = Connections()
    a, b, c = conns.opened(0, 10), conns.opened(1, 11), conns.opened(0, 12)
    assert [(r.loop, r.index, r.local_port) for r in (a, b, c)] == [(0, 0, 10), (1, 0, 11), (0, 1, 12)]
    assert conns.records == [a, b, c]


def test_a_connection_is_located_only_in_a_reading_begun_after_it_opened():
    gate, calls = threading.Event(), []

    def servers() -> dict[int, str]:
        calls.append(len(calls))
        if len(calls) == 1:
            gate.wait(5.0)  # a slow reading, begun before the connection opened
            return {7: "old-node"}  # a connection that had the port before
        return {7: "new-node"}

    async def main() -> tuple[str | None, str | None]:
        locator = Locator(servers, every_s=0.01, timeout_s=5.0)
        early = asyncio.create_task(locator.find(99))  # starts the slow reading
        while not calls:
            await asyncio.sleep(0.001)
        found = asyncio.create_task(locator.find(7))
        await asyncio.sleep(0)  # one turn of the loop: `found` notes its opening and waits on that reading
        gate.set()
        early.cancel()
        unknown = await Locator(lambda: {}, every_s=0.01, timeout_s=0.05).find(7)
        return await found, unknown

    found, unknown = asyncio.run(main())
    assert found == "new-node" and unknown is None


def run_chains(chains: Chains, script: list[Step]) -> tuple[ChainLoop, list[dict], list[ConnectionRecord]]:
    pace, sent, conns, sink = Pace(1), [], Connections(), []  # type: ignore[var-annotated]
    loop = ChainLoop(
        0,
        "http://unused",
        chains,
        pace,
        sink,
        lambda: Scripted(script, sent, pace, conns, completed("last")),
        ConnectLog(),
    )
    asyncio.run(loop.run(time.time()))
    return loop, [json.loads(b) for b in sent], conns.records


def test_chains_send_only_the_new_input_and_open_a_connection_each():
    script = [completed("a"), completed("b"), completed("c"), None]
    loop, sent, records = run_chains(Chains(turns_per_chain=2, think_s=0.0, max_tokens=16), script)
    assert [b.get("previous_response_id") for b in sent] == [None, "a", None, "c"]
    assert [b["input"] for b in sent][:2] == [
        [{"role": "user", "content": "client 0 turn 0"}],
        [{"role": "user", "content": "client 0 turn 1"}],
    ]
    assert all(
        b["store"] is False and b["max_output_tokens"] == 16 and "prompt_cache_key" not in b for b in sent
    )
    assert [(r.index, r.creates, r.completed, r.close_code) for r in records] == [
        (0, 2, 2, None),
        (1, 2, 2, None),
    ]
    assert [r.kind for r in loop.sink] == ["first", "steady", "rollout_first", "steady"]
    assert [r.connection for r in loop.sink] == [0, 0, 1, 1] and loop.errors == []


def test_a_failed_turn_ends_its_chain_as_an_error():
    loop, _, records = run_chains(Chains(turns_per_chain=3, think_s=0.0), [FAILED, None])
    assert loop.errors and loop.errors[0].startswith("turn: ") and "server_error" in loop.errors[0]
    assert [(r.creates, r.terminals, r.completed) for r in records] == [(1, 1, 0), (1, 1, 1)]
    assert loop.sink[0].error_code == "server_error" and not loop.sink[0].ok


def test_codex_resends_its_conversation_and_after_a_drain_the_turn_it_lost_on_a_new_connection():
    script = [completed("a", 0), completed("b", 1024), SHUTTING, None]
    loop, sent, records = run_chains(Chains(turns_per_chain=10_000, think_s=0.0, resend_history=True), script)
    texts = [b["input"][-1]["content"] for b in sent]
    assert texts == ["client 0 turn 0", "client 0 turn 1", "client 0 turn 2", "client 0 turn 2"]
    assert [len(b["input"]) for b in sent] == [2, 4, 6, 6]  # the prefix, each completed turn, the new one
    assert sent[0]["input"][0]["role"] == "developer" and len(sent[0]["input"][0]["content"]) > 4000
    assert sent[1]["input"][2] == {"role": "assistant", "content": "answer a"}
    assert all(b["prompt_cache_key"] == "client-0" and "previous_response_id" not in b for b in sent)
    first, second = records
    assert (first.creates, first.completed, first.shutting_down, first.close_code) == (3, 2, 1, 1012)
    assert second.index == 1 and second.creates == 1 and loop.errors == []
    assert [r.cached_tokens for r in loop.sink if r.ok] == [0, 1024, 0]


class LocatedNever(Scripted):
    """A connection whose open (the lookup of where it went) never ends."""

    async def open(self) -> None:
        await super().open()
        await asyncio.Event().wait()


def test_a_connection_the_run_ends_in_its_open_is_marked_stopped_and_closed():
    pace, conns = Pace(1), Connections()

    async def main() -> ChainLoop:
        loop = ChainLoop(
            0,
            "http://unused",
            Chains(),
            pace,
            [],
            lambda: LocatedNever([], [], pace, conns, completed("last")),
            ConnectLog(),
        )
        task = asyncio.create_task(loop.run(time.time()))
        while not conns.records:
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await loop.channel.close()
        return loop

    loop = asyncio.run(main())
    [record] = conns.records
    assert loop.channel.record is record and record.stopped and record.creates == 0
    assert record.closed is not None and record.close_code is None  # the client ended it


def test_the_chains_workload_runs_on_websockets_or_plain_http():
    with pytest.raises(ValueError, match="'ws' or 'http-full'"):
        LoadSpec(targets=("http://a",), loops=1, workload="chains", transport="http-chained")
    LoadSpec(targets=("http://a",), loops=1, workload="chains", transport="http-full")
    with pytest.raises(ValueError, match="transport 'ws' only"):
        LoadSpec(targets=("http://a",), loops=1, transport="http-full", locate=dict)
    with pytest.raises(ValueError, match="capacity or codex loop"):
        LoadSpec(targets=("http://a",), loops=1, workload="chains", arrivals=True)


def test_the_summary_counts_the_servers_closes_by_code():
    conns = [ConnectionRecord(0, 0, 1.0, 1, close_code=1012), ConnectionRecord(1, 0, 1.0, 2, close_code=1006),
             ConnectionRecord(2, 0, 1.0, 3, close_code=1012), ConnectionRecord(3, 0, 1.0, 4)]  # fmt: skip
    result = LoadResult(
        [TurnRecord(0, "first", 1.0, 1.0, None, True)], [], window=(0.0, 2.0), connections=conns
    )
    assert result.summary()["closes"] == {1012: 2, 1006: 1}
