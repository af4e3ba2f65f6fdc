"""``responses-ws bench``'s runner against the suite's embedded server: every transport
completes short agent loops, and a WebSocket rollout sends only new items."""

from __future__ import annotations

import asyncio

import pytest

from bench.agentloop_report import summarise
from bench.rollouts import run_bench
from bench.workload import Workload


def test_every_transport_completes_the_same_agent_loop(server_url):
    w = Workload(
        tool_rounds=3,
        system_tokens=600,
        tool_def_tokens=400,
        tool_output_tokens=150,
        text_tokens=12,
        tool_time_ms=1,
    )
    records = asyncio.run(
        run_bench(
            server_url,
            w,
            ["ws", "append", "http-chained", "http-full"],
            rollouts=1,
            concurrency=4,
            warmup=False,
        )
    )
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


def test_a_codex_rollout_is_the_same_on_every_transport_and_its_time_splits_into_parts(server_url):
    """The codex preset, shrunk (a 3k-token resumed session, 2 tool rounds): the same
    output on every transport — hidden reasoning included — and parts that add up."""
    from dataclasses import replace

    from bench import breakdown
    from bench.workload import PRESETS, Lognormal

    codex = PRESETS["codex"]
    shape = replace(codex.shape, tool_rounds=Lognormal(2, 2, 2), tool_time_ms=Lognormal(2, 2, 2))
    w = replace(codex, shape=shape, resume_tokens=3000, system_tokens=600, tool_def_tokens=400)
    transports = ["ws", "append", "http-full"]
    records = asyncio.run(run_bench(server_url, w, transports, rollouts=1, warmup=False))
    by = {r.transport: r for r in records}
    for r in records:
        assert r.error is None, r.error
        assert [t.calls for t in r.turns] == [1, 1, 0]
    assert [t.output_tokens for t in by["ws"].turns] == [t.output_tokens for t in by["http-full"].turns]
    assert sum(t.output_tokens for t in by["ws"].turns) > 3 * 40  # reasoning is decoded and counted
    # the resumed session's prefix was cached before either transport ran it
    assert by["ws"].turns[0].cached_tokens > 2000
    assert [t.cached_tokens for t in by["ws"].turns] == [t.cached_tokens for t in by["http-full"].turns]
    cmp = breakdown.compare(records, transports)
    assert cmp["rollouts"] == 1 and list(cmp["transports"]) == ["ws", "http-full"]
    for name, s in cmp["transports"].items():
        assert sum(s["total_ms"].values()) == pytest.approx(by[name].e2e_s * 1000)
        assert s["total_ms"]["decode"] > 0 and s["total_ms"]["tool"] > 0
