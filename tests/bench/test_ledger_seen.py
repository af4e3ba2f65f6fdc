"""bench ledger's clients on the load runner: what they saw, from the runner's records (each
response's store flag, terminal event and usage for the reconciliation), their turns and
drops, and the two client processes' specs."""

from __future__ import annotations

import pytest

from bench.kinds.ledger import MAX_CHAIN, Plan, load_specs, seen_by
from bench.runner import ConnectionRecord, LoadResult, TurnRecord

pytestmark = pytest.mark.unit


def turn(rid: str | None, terminal: str | None, code: str | None = None, **kw: object) -> TurnRecord:
    return TurnRecord(0, "steady", 1.0, 1.0, None, terminal == "response.completed", error_code=code,
                      response_id=rid, store=True, terminal=terminal, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_the_clients_sight_is_taken_from_the_records():
    ws = LoadResult(
        records=[
            turn("w1", "response.completed", connection=0, input_tokens=5, output_tokens=2, final_gap_ms=3.0),
            turn("w2", None, "closed_1006", connection=0),  # cut by a kill: seen start, not end
            turn(None, None, "closed_1006", connection=1),
        ],
        clients=[],
        connections=[ConnectionRecord(0, 0, 1.0, 1, close_code=1006), ConnectionRecord(0, 1, 2.0, 2)],
        connect_failures={"connect:ConnectionRefusedError": 2},
    )
    http = LoadResult(
        records=[
            turn("h1", "response.completed", input_tokens=4, output_tokens=1),
            turn(None, None, "http_error:ReadError"),
        ],
        clients=[],
    )
    seen, stats, gaps = seen_by([ws, http])
    assert stats == {"turns": 2, "ws_dropped": 3, "http_dropped": 1} and gaps == [3.0]
    assert {rid: (r.transport, r.terminal, r.usage) for rid, r in seen.responses.items()} == {
        "w1": ("websocket", "response.completed", (5, 0, 2)),
        "w2": ("websocket", None, None),
        "h1": ("http", "response.completed", (4, 0, 1)),
    }


def test_the_ws_and_http_clients_run_as_two_specs_of_the_chains_workload():
    ws, http = load_specs("http://s", Plan(ws=3, http=2, store_share=0.25, max_text_tokens=9), "sk-x")
    assert (ws.loops, ws.transport, http.loops, http.transport) == (3, "ws", 2, "http-full")
    assert ws.api_key == http.api_key == "sk-x" and ws.chains.turns_per_chain == MAX_CHAIN
    assert ws.chains.continue_stored and not ws.chains.resend_unstarted
    assert ws.chains.text_tokens == (1, 9) and ws.chains.store_share == 0.25
    assert [s.transport for s in load_specs("http://s", Plan(ws=1, http=0))] == ["ws"]
