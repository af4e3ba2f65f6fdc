"""A small soak against a real server: every response of every connection satisfies the
stream invariants and nothing is lost (the full-size run is ``responses-ws bench soak``); the
soak's own arithmetic (flatness, CPU of changing processes, a turn's place in its chain)."""

from __future__ import annotations

from bench.kinds.soak import soak
from bench.processes import CpuMeter, flatness
from bench.runner import TurnRecord
from bench.soak_report import SoakPlan, turn_of_chain
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


def test_a_turns_place_in_its_chain_restarts_with_each_chain_of_its_loop():
    def rec(loop: int, kind: str, sent: float) -> TurnRecord:
        return TurnRecord(loop, kind, sent, 1.0, 0.5, True)

    records = [rec(0, "first", 0), rec(1, "first", 0.1), rec(0, "steady", 1), rec(0, "rollout_first", 2),
               rec(1, "steady", 2.5), rec(0, "steady", 3)]  # fmt: skip
    assert [(p, r.loop) for p, r in turn_of_chain(records)] == [
        (1, 0),
        (1, 1),
        (2, 0),
        (1, 0),
        (2, 1),
        (2, 0),
    ]


def test_the_plan_runs_on_the_load_runner_with_every_event_checked():
    spec = SoakPlan(connections=20, turns=5, ramp_s=2.0, duration_s=8.0).spec("http://a", run=1)
    assert spec.loops == 20 and spec.check_events and spec.workload == "codex"
    assert spec.ramp_s == spec.warmup_s == 2.0 and spec.duration_s == 8.0
    assert spec.custom_workload is not None and spec.custom_workload.tool_rounds == 4
    assert spec.rollouts_per_loop is None
    # with a number of chains every turn counts (no warm-up) and the loops stop after them
    chains = SoakPlan(connections=20, turns=5, ramp_s=2.0, chains=1).spec("http://a")
    assert chains.rollouts_per_loop == 1 and chains.warmup_s == 0.0 and chains.ramp_s == 2.0


def test_twenty_connections_by_five_turns_twice_keep_every_invariant(ray_cluster):
    from ray import serve

    # one actor holds all twenty (no actor starts mid-test: they take seconds on a loaded machine)
    url = start_app(SOAK_APP, **{"session.connections_per_actor": 32, "session.warm_actors": 1})
    try:
        plan = SoakPlan(
            connections=20,
            turns=5,
            chains=1,
            ramp_s=0.5,
            duration_s=60.0,
            think_ms=50,
            sample_s=1.0,
            settle_s=0.5,  # before each idle sample: its figures are not checked here, only that it was taken
        )
        result = soak(url, plan, app=SOAK_APP, runs=2)  # ids must stay unique across runs
    finally:
        # The gateway drains before it stops (docs/reliability.md): let that happen in the background.
        serve.delete(SOAK_APP, _blocking=False)
    inv = result["invariants"]
    assert inv["ok"], inv["examples"]
    # one 5-turn chain on each of the 20 loops, twice: every create answered, checked and counted
    assert inv["counts"]["creates"] == inv["counts"]["created"] == inv["counts"]["completed"] == 200
    assert result["connections"]["opened"] == 40 and len(result["clients"]["processes"]) == 2
    assert result["turns"]["completed"] == 200
    assert result["ttft_overhead_ms"]["n"] == 200, "the server reports queue/prefill per response"
    assert result["memory"]["baseline_mb"]["gateway"] > 0
    assert len(result["idle_memory"]["session_and_gateway_mb"]) == 2
