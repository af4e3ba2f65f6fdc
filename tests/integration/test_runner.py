"""The load runner against the embedded server: in a client process of this machine, and in
a load actor on the embedded Ray's node (it carries the `client` resource, tests/conftest.py)."""

from __future__ import annotations

import os
import time

import pytest

from bench import workload as wl
from bench.runner import LoadSpec, NoClientNodes, run_local, run_on_cluster, start_local

# small resumed histories: the test is about the runner, not the server's prefill
SPEC = {"loops": 2, "duration_s": 3.0, "warmup_s": 1.0, "resume_tokens": 1500}


def check(result, spec: LoadSpec) -> None:
    s = result.summary()
    assert result.connected == spec.loops and not result.errors, result.errors
    assert s["turns"] >= 2 and s["failures"] == {}, s
    window = result.in_window()
    assert {r.loop for r in result.records} == set(range(spec.loops))
    assert all(r.ok and r.model_ms is not None and r.ttft_ms is not None for r in window)
    assert all(r.target == spec.targets[0] for r in result.records)
    (client,) = result.clients
    assert client.pid != os.getpid() and client.loops == spec.loops and client.wall_s > 0
    assert client.saturated == (client.reason is not None) and s["valid"] == (not client.saturated)


def test_run_local_loads_the_server_from_a_client_process(server_url):
    spec = LoadSpec(targets=(server_url,), **SPEC)
    result = run_local(spec, processes=1)
    check(result, spec)
    assert result.clients[0].node_id is None


def test_start_local_runs_until_stopped_with_connections_arriving_and_held(server_url):
    """Connections arriving over a ramp, each with one bare create as it opens, held; one more
    turn on each held connection; stopped long before the deadline."""
    bare = wl.Workload(tool_rounds=0, system_tokens=0, tool_def_tokens=0, task_tokens=1, text_tokens=8)
    spec = LoadSpec(
        targets=(server_url,), loops=3, custom_workload=bare, arrivals=True, ramp_s=0.3, rollouts_per_loop=1,
        duration_s=120.0, warmup_s=0.0, connect_attempts=1,
    )  # fmt: skip
    with start_local(spec) as run:
        deadline = time.monotonic() + 60
        while run.running():  # every connection arrived and sent its create
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert run.opened() == 3
        assert run.held_turns(1) == 3
        result = run.stop()
    assert result.window[1] < run.deadline and result.connected == 3 and not result.connect_failures
    assert len(result.connects) == 3 and all(ms > 0 for _, ms in result.connects)
    began = sorted(b for b, _ in result.connects)
    assert began[-1] - began[0] >= 0.15  # arrivals over the ramp, not at once
    kinds = sorted(r.kind for r in result.records)
    assert kinds == ["first"] * 3 + ["held"] * 3 and all(r.ok for r in result.records), result.errors


def test_run_on_cluster_loads_it_from_a_load_actor_on_a_client_node(ray_cluster, server_url):
    import ray

    spec = LoadSpec(targets=(server_url,), transport="http-chained", **SPEC)
    batches: list[int] = []
    result = run_on_cluster(spec, actors=1, on_records=lambda b: batches.append(len(b)))
    check(result, spec)
    assert result.clients[0].node_id == ray.get_runtime_context().get_node_id()
    assert result.clients[0].node_ip
    assert sum(batches) == len(result.records)
    with pytest.raises(NoClientNodes, match="no-such-resource"):
        run_on_cluster(spec, resource="no-such-resource")


def test_bench_capacity_runs_the_reference_beside_the_server_with_its_frames(tmp_path, server_url):
    """The capacity kind on the runner: the same loops against this server, then against the
    bare-protocol reference answering with the frames recorded from it, compared."""
    import json

    from bench.commands import main

    out = tmp_path / "capacity.json"
    argv = ["--url", server_url, "--clients", "1", "--loops", "4", "--duration", "2", "--preset", "uniform"]
    main(
        ["bench", "capacity", *argv, "--out", str(out)]
    )  # exit 1 when a loop's tool time outlasts the window
    doc = json.loads(out.read_text())
    assert doc["server"] == server_url and doc["run"]["command"].startswith("responses-ws bench capacity")
    assert (
        doc["reference_answers"]["steady"]["frames"] > 3 and doc["reference_answers"]["final"]["frames"] > 3
    )
    (level,) = doc["levels"]
    ref = level["reference"]
    for side in (level, ref):
        assert side["connected"] == 4 and side["first_turns_ms"]["completed"] == 4
        assert side["steady_ms"]["turns"] > 0 and side["loops_with_errors"] == 0
    # the reference's model time is zero, and its figures are read as the server's are
    assert ref["steady_tail"]["prefill"] == 0.0 and ref["steady_tail"]["decode"] == 0.0
    assert (
        ref["reference_cpu_ms_per_turn"] > 0 and "cpu_ms_per_turn" not in level
    )  # --url: no server processes
    vs = level["vs_reference"]["steady_p99"]
    assert vs["server"] == level["steady_ms"]["p99"] and vs["reference"] == ref["steady_ms"]["p99"]
    assert vs["target"] == 2.0 and vs["ratio"] == round(vs["server"] / vs["reference"], 2)
