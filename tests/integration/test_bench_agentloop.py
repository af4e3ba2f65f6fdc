"""``responses-ws bench``'s runner against the suite's embedded server: every transport
completes short agent loops, and a WebSocket rollout sends only new items."""

from __future__ import annotations

import asyncio

from bench.agentloop import run_bench
from bench.report import summarise
from bench.workload import Workload


def test_every_transport_completes_the_same_agent_loop(server_url):
    w = Workload(tool_rounds=3, system_tokens=600, tool_def_tokens=400, tool_output_tokens=150,
                 text_tokens=12, tool_time_ms=1)
    records = asyncio.run(run_bench(server_url, w, ["ws", "append", "http-chained", "http-full"], rollouts=1,
                                    concurrency=4, warmup=False))
    assert sorted(r.transport for r in records) == ["append", "http-chained", "http-full", "ws"]
    for r in records:
        assert r.error is None, r.error
        assert [t.calls for t in r.turns] == [1, 1, 1, 0]  # three tool rounds, then text
        assert r.turns[-1].output_tokens > 0
    by = {r.transport: r for r in records}
    # ws and http-chained send only new items; http-full resends the growing history
    assert by["ws"].turns[-1].request_bytes < by["http-full"].turns[-1].request_bytes
    assert by["http-chained"].turns[-1].request_bytes < by["http-full"].turns[-1].request_bytes
    # append sends only the tool results, without even the tool definitions
    assert by["append"].turns[-1].request_bytes < by["ws"].turns[-1].request_bytes
    summary = summarise(records)
    assert set(summary["http-full"]["ws_gain"]) >= {"e2e_median", "e2e_p90"}
