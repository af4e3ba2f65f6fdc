"""A small soak against a real server: every response of every connection satisfies the
stream invariants and nothing is lost (the full-size run is ``responses-ws bench soak``); the
soak's own arithmetic (flatness, CPU of changing processes, chain lengths)."""

from __future__ import annotations

import asyncio

from bench.chains import SoakPlan, chain_turns
from bench.kinds.soak import soak
from bench.processes import CpuMeter, flatness
from tests.support.server import start_app

SOAK_APP = "rws-soak"


def test_a_series_is_flat_within_its_noise_and_growth_is_not():
    steady = [500.0 + (i % 3) for i in range(30)]
    assert flatness(steady)["flat"] is True
    growing = [500.0 + 4 * i for i in range(30)]
    verdict = flatness(growing)
    assert verdict["flat"] is False and verdict["change_mb"] > 0 and verdict["slope_mb_per_sample"] > 3.9
    assert flatness([1.0, 2.0])["flat"] is None  # too few samples to say


def test_cpu_of_processes_that_come_and_go_is_counted_once():
    meter = CpuMeter()
    meter.add({1: 10.0})
    meter.add({1: 12.0, 2: 1.5})  # pid 2 started meanwhile: all its CPU counts
    meter.add({2: 2.0})  # pid 1 ended: counted up to its last sample
    assert meter.used_s() == 2.0 + 2.0


def test_with_a_duration_first_chains_spread_connection_ages_then_run_full_length():
    plan = SoakPlan(connections=4, turns=8, duration_s=60)
    assert [chain_turns(plan, slot, 0) for slot in range(4)] == [1, 3, 5, 7]
    assert {chain_turns(plan, slot, 1) for slot in range(4)} == {8}
    assert chain_turns(SoakPlan(connections=4, turns=8), 0, 0) == 8  # no duration: full chains


def test_twenty_connections_by_five_turns_twice_keep_every_invariant(ray_cluster):
    from ray import serve

    # one actor holds all twenty (no actor starts mid-test: they take seconds on a loaded machine)
    url = start_app(SOAK_APP, **{"session.connections_per_actor": 32, "session.warm_actors": 1})
    try:
        plan = SoakPlan(connections=20, turns=5, ramp_s=1.0, think_ms=50, sample_s=1.0)
        result = asyncio.run(soak(url, plan, app=SOAK_APP, runs=2))  # ids must stay unique across runs
    finally:
        # The gateway drains before it stops (docs/reliability.md): let that happen in the background.
        serve.delete(SOAK_APP, _blocking=False)
    inv = result["invariants"]
    assert inv["ok"], inv["examples"]
    assert inv["counts"]["creates"] == inv["counts"]["created"] == inv["counts"]["completed"] == 200
    assert result["connections"]["opened"] == 40 and result["turns"]["completed"] == 200
    assert result["model_ttft_source"] == {"timings": 200}, "the server reports queue/prefill per response"
    assert result["ttft_overhead_ms"]["n"] == 200 and result["memory"]["baseline_mb"]["gateway"] > 0
    assert len(result["idle_memory"]["session_and_gateway_mb"]) == 2
