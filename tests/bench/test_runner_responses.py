"""The runner's per-response records (each turn's response id, ``store`` flag, terminal event
and usage, as the usage ledger is reconciled against) and the chains of a client that follows
docs/reliability.md across a drain (``Chains.continue_stored``: a stored response continued
on the next connection, a create that got no ``response.created`` sent again), on a scripted
channel; a refused upgrade typed or not."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pytest

from bench.runner import Chains, TurnRecord
from bench.runner.chains import ChainLoop, HttpChainLoop
from bench.runner.channels import SHUTTING_DOWN, Connections, HttpChannel, Reply
from bench.runner.connecting import ConnectLog, typed_refusal
from bench.runner.loop import Pace

from .scripted import CLOSED, SHUTTING, Scripted, Step, frame

pytestmark = pytest.mark.unit


def created(rid: str, store: bool) -> str:
    return frame({"type": "response.created", "response": {"id": rid, "store": store}})


def completed(rid: str, store: bool) -> str:
    usage = {"input_tokens": 10, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 2}}
    return frame({"type": "response.completed", "response": {"id": rid, "store": store, "usage": usage}})


LAST = (created("last", False), completed("last", False))  # the answer to the run's last create


def run_chains(chains: Chains, script: list[Step]) -> tuple[ChainLoop, list[dict]]:
    pace, sent, conns, sink = Pace(1), [], Connections(), []  # type: ignore[var-annotated]
    loop = ChainLoop(
        0,
        "http://unused",
        chains,
        pace,
        sink,
        lambda: Scripted(script, sent, pace, conns, LAST),
        ConnectLog(),
    )
    asyncio.run(loop.run(time.time()))
    return loop, [json.loads(b) for b in sent]


def test_a_drained_client_continues_its_stored_response_and_resends_only_what_never_started():
    script: list[Step] = [
        (created("a", True), completed("a", True)),
        (None, SHUTTING),  # refused before it started: sent again on the next connection
        (created("b", False), completed("b", False)),
        (created("c", False), CLOSED),  # started, then its connection ended: lost, not sent again
        (None, CLOSED),  # never started: sent again
        None,
    ]
    chains = Chains(
        turns_per_chain=10,
        think_s=0.0,
        store_share=0.5,
        text_tokens=(5, 9),
        continue_stored=True,
        resend_unstarted=True,
    )
    loop, sent = run_chains(chains, script)
    texts = [b["input"][-1]["content"] for b in sent]
    assert texts == ["client 0 turn 0", "client 0 turn 1", "client 0 turn 1", "client 0 turn 1",
                     "client 0 turn 0", "client 0 turn 0"]  # fmt: skip
    # a stored response is continued on the next connection; after the store:false b, nothing
    assert [b.get("previous_response_id") for b in sent] == [None, "a", "a", "b", None, None]
    assert sent[1]["store"] == sent[2]["store"] and sent[4]["store"] == sent[5]["store"]
    assert all(5 <= int(b["metadata"]["emulator.text_tokens"]) <= 9 for b in sent)
    assert all(b["metadata"]["emulator.tool_rounds"] == "0" for b in sent)
    rows = [(r.response_id, r.store, r.terminal, r.error_code, r.resent) for r in loop.sink]
    assert rows == [
        ("a", True, "response.completed", None, False),
        (None, None, None, SHUTTING_DOWN, False),
        ("b", False, "response.completed", None, True),
        ("c", False, None, "closed_1012", False),
        (None, None, None, "closed_1012", False),
        ("last", False, "response.completed", None, True),
    ]
    assert loop.sink[0].usage == (10, 2, 3) and loop.sink[3].usage is None


def test_a_store_share_of_nothing_or_everything_is_kept():
    for share in (0.0, 1.0):
        script: list[Step] = [(created("a", share > 0), completed("a", share > 0))] * 3 + [None]
        _, sent = run_chains(Chains(turns_per_chain=2, think_s=0.0, store_share=share), list(script))
        assert {b["store"] for b in sent} == {share > 0} and all("metadata" not in b for b in sent)


def test_a_connection_left_open_after_server_shutting_down_is_said_so():
    class Stays(Scripted):
        async def wait_closed(self) -> int:
            await asyncio.sleep(10)
            return 1012

    pace, sent, conns, sink = Pace(1), [], Connections(), []  # type: ignore[var-annotated]
    script: list[Step] = [(None, SHUTTING), None]
    chains = Chains(think_s=0.0, continue_stored=True, resend_unstarted=True, close_wait_s=0.01)
    loop = ChainLoop(
        0, "http://unused", chains, pace, sink, lambda: Stays(script, sent, pace, conns, LAST), ConnectLog()
    )
    asyncio.run(loop.run(time.time()))
    assert [r.left_open for r in conns.records] == [True, False] and loop.sink[-1].resent


def test_the_new_chains_options_are_checked():
    for bad in ({"store_share": 1.5}, {"text_tokens": (0, 3)}, {"text_tokens": (5, 3)},
                {"think_spread": 1.0}, {"continue_stored": True, "resend_history": True},
                {"reasoning_tokens": 40}):  # fmt: skip
        with pytest.raises(ValueError, match="Chains"):
            Chains(**bad)  # type: ignore[arg-type]


def test_a_records_usage_is_the_ledgers_triple():
    turn = TurnRecord(0, "first", 1.0, 1.0, None, True, output_tokens=7, cached_tokens=None, input_tokens=30)
    assert turn.usage == (30, 0, 7)
    assert TurnRecord(0, "first", 1.0, 1.0, None, True, output_tokens=7).usage is None


def refusal(status: int, headers: dict[str, str], body: bytes) -> Exception:
    exc = Exception("refused")
    exc.response = SimpleNamespace(status_code=status, headers=headers, body=body)  # type: ignore[attr-defined]
    return exc


def test_a_refused_upgrade_is_typed_only_with_503_retry_after_and_a_retry_code():
    typed = json.dumps({"error": {"code": "server_shutting_down"}}).encode()
    assert typed_refusal(refusal(503, {"Retry-After": "1"}, typed)) is True
    assert typed_refusal(refusal(503, {}, typed)) is False
    assert typed_refusal(refusal(503, {"Retry-After": "1"}, b"busy")) is False
    assert typed_refusal(refusal(500, {"Retry-After": "1"}, typed)) is False
    assert typed_refusal(ConnectionRefusedError()) is None
    log = ConnectLog()
    for exc in (refusal(503, {}, b""), refusal(503, {"Retry-After": "1"}, typed), TimeoutError()):
        log.refused(exc)
    assert log.untyped == {"connect:http_503": 1}


def test_a_connection_runs_its_chains_one_after_another_and_a_failed_turn_starts_a_new_one():
    script: list[Step] = [
        (created("a", False), completed("a", False)),
        (created("b", False), completed("b", False)),
        (created("c", False), completed("c", False)),
        (None, frame({"type": "error", "error": {"code": "invalid_request"}})),
        None,
    ]
    chains = Chains(turns_per_chain=2, chains_per_connection=1000, think_s=0.0, continue_stored=True)
    loop, sent = run_chains(chains, script)
    assert [b.get("previous_response_id") for b in sent] == [None, "a", None, "c", None]
    assert {r.connection for r in loop.sink} == {0} and loop.sink[3].error_code == "invalid_request"
    assert all(r.final_gap_ms is None for r in loop.sink)  # the scripted channel times no frames


class ScriptedHttp(HttpChannel):
    """Answers each POST with the script's events (raw), or raises the script's error."""

    def __init__(self, script: list[list[str] | Exception | None], sent: list[str], pace: Pace) -> None:
        super().__init__(None)
        self.script, self.sent, self.pace = script, sent, pace

    async def send(self, body: str) -> Reply:
        self.sent.append(body)
        step = self.script.pop(0)
        if step is None:
            self.pace.end_at = 0.0
            step = [created("last", False), completed("last", False)]
        if isinstance(step, Exception):
            self.created = created("cut", True)
            raise step
        self.created = step[0]
        return Reply(step[-1], time.time(), 0.001, None)


def test_http_chains_post_each_turn_on_its_own_and_record_a_failed_request_by_type():
    pace, sent, sink = Pace(1), [], []  # type: ignore[var-annotated]
    script: list[list[str] | Exception | None] = [
        [created("a", True), completed("a", True)],
        ConnectionResetError("reset"),
        None,
    ]
    chains = Chains(think_s=0.0, reconnect_s=0.0, store_share=1.0, text_tokens=(1, 4), max_tokens=8)
    loop = HttpChainLoop(0, "http://unused", chains, pace, sink, lambda: ScriptedHttp(script, sent, pace))
    asyncio.run(loop.run(time.time()))
    bodies = [json.loads(b) for b in sent]
    assert all(
        b["stream"] and b["store"] and "type" not in b and "previous_response_id" not in b for b in bodies
    )
    assert all(
        b["max_output_tokens"] == 8 and 1 <= int(b["metadata"]["emulator.text_tokens"]) <= 4 for b in bodies
    )
    rows = [(r.response_id, r.store, r.terminal, r.error_code, r.connection) for r in sink]
    assert rows == [
        ("a", True, "response.completed", None, None),
        ("cut", True, None, "http_error:ConnectionResetError", None),
        ("last", False, "response.completed", None, None),
    ]
    assert sink[0].usage == (10, 2, 3)


def test_http_chains_ask_for_hidden_reasoning_when_told():
    pace, sent, sink = Pace(1), [], []  # type: ignore[var-annotated]
    script: list[list[str] | Exception | None] = [[created("a", False), completed("a", False)], None]
    chains = Chains(think_s=0.0, text_tokens=(1, 1), reasoning_tokens=4000)
    loop = HttpChainLoop(0, "http://unused", chains, pace, sink, lambda: ScriptedHttp(script, sent, pace))
    asyncio.run(loop.run(time.time()))
    metas = [json.loads(b)["metadata"] for b in sent]
    assert len(metas) == 2 and all(
        m == {"emulator.tool_rounds": "0", "emulator.text_tokens": "1", "emulator.reasoning_tokens": "4000"}
        for m in metas
    )
