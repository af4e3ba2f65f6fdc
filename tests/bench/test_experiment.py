"""The scaling experiment's pure parts (bench/experiment): the sweep's order, a step's
figures, the samplers' windows, the deployment's pinned config, the targets and the bad
setups' one-line refusals, the capacity model's re-fit.  The run itself on a cluster:
tests/cluster/test_scaling_experiment.py."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from bench.experiment import capacity, figures, window
from bench.experiment.deployment import (
    GATEWAY,
    deploy_body,
    gateway_app,
    pinned,
    running_gateways,
    server_port,
)
from bench.experiment.errors import SetupError
from bench.experiment.nodes import Node, addresses_distinct, alive_nodes, require_client_nodes, targets
from bench.experiment.options import add_arguments, from_args
from bench.experiment.plan import PlannedStep, Sweep, parse_counts, redeploys, steps
from bench.experiment.sampler import metrics_values
from bench.report import validate


def sweep(**kw) -> Sweep:
    base = {
        "session_nodes": (1, 2, 3),
        "loops_per_node": (4, 8),
        "transports": ("ws", "http-full"),
        "repeats": 2,
        "duration_s": 20.0,
        "warmup_s": 5.0,
    }
    return Sweep(**{**base, **kw})


def test_the_repeats_interleave_and_the_node_count_changes_as_seldom_as_it_can():
    planned = steps(sweep())
    assert len(planned) == 3 * 2 * 2 * 2
    assert [p.index for p in planned] == list(range(len(planned)))
    counts = [p.session_nodes for p in planned if p.loops_per_node == 4 and p.transport == "ws"]
    assert counts == [1, 2, 3, 3, 2, 1]  # up, then down: each repeat covers every count
    # the transports alternate inside a load level, on the same deployment
    assert [(p.transport, p.loops_per_node) for p in planned[:4]] == [
        ("ws", 4),
        ("http-full", 4),
        ("ws", 8),
        ("http-full", 8),
    ]
    assert redeploys(planned, in_service=1) == 4  # 1→2→3 | 3→2→1
    assert PlannedStep(0, 0, "ws", 3, 8).loops == 24


@pytest.mark.parametrize("text", ["", "0,1", "2,1", "1,1", "a"])
def test_counts_are_positive_distinct_and_rising(text):
    with pytest.raises(ValueError, match="--session-nodes"):
        parse_counts(text, "--session-nodes")


@dataclass
class T:
    loop: int
    target: str
    ok: bool = True
    error_code: str | None = None
    total_ms: float | None = 50.0
    model_ms: float | None = 40.0
    ttft_ms: float | None = 20.0


A, B = "http://10.0.0.11:8765", "http://10.0.0.12:8765"
NODES = [figures.SessionNode("a", "10.0.0.11", A), figures.SessionNode("b", "10.0.0.12", B)]


def measured(turns, **kw) -> figures.Measured:
    base = {
        "turns": turns,
        "duration_s": 10.0,
        "clients": [
            {
                "node_id": "c",
                "node_ip": "10.0.0.20",
                "cpu_fraction": 0.2,
                "lag_p99_ms": 1.0,
                "saturated": False,
            }
        ],
        "saturated": False,
        "saturated_reason": None,
        "nodes": NODES,
        "cpu_ms": {"a": {"gateway": 30.0, "session_host": 60.0, "ray": 10.0}, "b": {"gateway": 10.0}},
        "accelerators": [figures.Accelerator("x", "10.0.0.30", 200.0, 3.5)],
        "prefix_blocks": (90.0, 10.0),
        "store": (40.0, 4000.0, 0.002),
        "shared_ms_per_s": {"gcs": 12.0},
    }
    return figures.Measured(**{**base, **kw})


HEAD = {"index": 0, "repeat": 0, "transport": "ws", "session_nodes": 2, "loops_per_node": 2, "loops": 4}


def test_a_steps_figures_per_node_come_from_the_records_targets():
    turns = [T(0, A), T(0, A), T(2, A), T(1, B), T(3, B, ok=False, error_code="server_error")]
    step = figures.step_figures(HEAD, measured(turns))
    assert step["turns"] == 4 and step["turns_per_s"] == 0.4 and step["valid"]
    assert step["failures"] == {"server_error": 1}
    assert step["nonmodel_ms"] == {"p50": 10.0, "p99": 10.0}
    a, b = step["nodes"]
    assert (a["turns"], a["connections_share"]) == (3, 0.5)  # loops 0 and 2 of 4
    assert (b["turns"], b["connections_share"]) == (1, 0.5)
    assert a["cpu_ms_per_turn"] == {
        "gateway": 10.0,
        "session_host": 20.0,
        "ray": 10 / 3,
        "total": 100 / 3,
    } or (a["cpu_ms_per_turn"]["total"] == pytest.approx(33.333, abs=0.01))
    assert step["accelerators"][0]["replica_cpu_ms_per_turn"] == 50.0
    assert step["prefix_cache_hit_rate"] == 0.9
    assert step["store"] == {"commands_per_turn": 10.0, "bytes_per_turn": 1000.0, "cpu_us_per_turn": 500.0}
    validate({"provenance": PROVENANCE, "load_nodes": [], "steps": [step]})


def test_counted_on_the_server_when_the_records_cannot_tell_the_nodes_apart():
    turns = [T(0, A), T(1, A), T(2, A)]
    step = figures.step_figures(HEAD, measured(turns, counted={"a": (2.0, 3.0), "b": (1.0, 1.0)}))
    a, b = step["nodes"]
    assert (a["turns"], a["connections_share"], b["turns"], b["connections_share"]) == (2, 0.75, 1, 0.25)
    assert step["turns_counted_by"] == "server"


def test_a_saturated_client_makes_the_step_invalid():
    step = figures.step_figures(HEAD, measured([T(0, A)], saturated=True, saturated_reason="lag p99 25 ms"))
    assert not step["valid"] and "lag p99 25 ms" in step["invalid_reason"]
    assert not figures.step_figures(HEAD, measured([T(0, A, ok=False)]))["valid"]


def test_connect_failures_are_counted_by_type_and_a_loop_left_unconnected_invalidates_the_step():
    retried = figures.step_figures(HEAD, measured([T(0, A)], connect_failures={"connect:http_503": 1}))
    assert retried["valid"] and retried["failures"] == {"connect:http_503": 1}  # a retry succeeded: shown
    step = figures.step_figures(
        HEAD, measured([T(0, A)], connect_failures={"connect:http_503": 5}, unconnected=1)
    )
    assert not step["valid"] and step["invalid_reason"] == "1 loop could not connect"


def test_a_window_counts_from_the_samples_inside_it_scaled_to_its_length():
    samples = [
        (0.0, {"cpu/gateway/1": 1.0}),
        (1.0, {"cpu/gateway/1": 1.5, "metrics/running": 2.0, "metrics/replicas": 1.0}),
        (
            2.0,
            {
                "cpu/gateway/1": 2.0,
                "cpu/session_host/7": 0.4,
                "metrics/running": 4.0,
                "metrics/replicas": 2.0,
            },
        ),
        (3.0, {"cpu/gateway/1": 2.5, "cpu/session_host/7": 0.6, "thread/gcs/5": 9.0}),
    ]
    d, factor = window.scaled(samples, 0.5, 3.0)
    assert factor == 2.5 / 2.0
    roles = window.cpu_ms_by_role(d)
    assert roles["gateway"] == pytest.approx(1000 * 1.0 * factor)
    assert roles["session_host"] == pytest.approx(1000 * 0.6 * factor)  # appeared inside: from zero
    assert window.running_per_replica(window.inside(samples, 0.5, 3.0)) == pytest.approx(3.0 / 1.5)
    assert window.scaled(samples[:1], 0, 3) == ({}, 0.0)


def test_the_metrics_scrape_reads_batches_prefix_cache_sockets_and_served_responses():
    text = "\n".join(
        [
            "# TYPE ray_responses_ws_inference_running_seqs gauge",
            'ray_responses_ws_inference_running_seqs{model="emu-fast",replica="r1"} 3.0',
            'ray_responses_ws_inference_running_seqs{model="emu-slow",replica="r1"} 1.0',
            'ray_responses_ws_inference_running_seqs{model="emu-fast",replica="r2"} 2.0',
            'ray_responses_ws_inference_prefix_hit_blocks_total{replica="r1"} 90.0',
            'ray_responses_ws_inference_prefix_miss_blocks_total{replica="r1"} 10.0',
            'ray_responses_ws_open_sockets{Component="x"} 4.0',
            'ray_responses_ws_phase_seconds_count{phase="api_overhead",transport="ws"} 12.0',
            'ray_responses_ws_phase_seconds_count{phase="decode",transport="ws"} 12.0',
        ]
    )
    assert metrics_values(text) == {
        "hit": 90.0, "miss": 10.0, "running": 6.0, "replicas": 2.0, "sockets": 4.0, "served": 12.0,
    }  # fmt: skip
    assert metrics_values("") == {}


DETAILS = {
    "proxy_location": "Disabled",
    "http_options": {"host": "0.0.0.0", "port": 8000},
    "applications": {
        "responses-ws": {
            "deployed_app_config": {
                "name": "responses-ws",
                "import_path": "serve.builder:app_builder",
                "args": {"server": {"port": 9000}},
            },
            "deployments": {
                GATEWAY: {
                    "status": "HEALTHY",
                    "deployment_config": {"name": GATEWAY, "autoscaling_config": None},
                    "replicas": [
                        {"state": "RUNNING", "node_id": "b", "node_ip": "10.0.0.12"},
                        {"state": "STOPPING", "node_id": "a", "node_ip": "10.0.0.11"},
                    ],
                },
            },
        }
    },
}


def test_the_deployment_in_force_and_its_gateway_pinned():
    assert gateway_app(DETAILS) == "responses-ws"
    body = deploy_body(DETAILS)
    assert body["proxy_location"] == "Disabled" and len(body["applications"]) == 1
    assert server_port(body["applications"][0]) == 9000
    fixed = pinned(body, "responses-ws", 3, autoscaling=None)
    assert fixed["applications"][0]["deployments"] == [{"name": GATEWAY, "num_replicas": 3}]
    auto = pinned(
        fixed, "responses-ws", 2, autoscaling={"min_replicas": 1, "max_replicas": 10, "policy": "p"}
    )
    assert auto["applications"][0]["deployments"] == [
        {
            "name": GATEWAY,
            "autoscaling_config": {
                "min_replicas": 2,
                "max_replicas": 2,
                "initial_replicas": 2,
                "policy": "p",
            },
        }
    ]
    assert "deployments" not in body["applications"][0]  # the original is kept as it was
    running, live, status = running_gateways(DETAILS, "responses-ws")
    assert [n.node_id for n in running] == ["b"] and live == 2 and status == "HEALTHY"
    with pytest.raises(SetupError, match="no responses-ws application"):
        gateway_app({"applications": {}})


RAY_NODES = [
    {"NodeID": "h", "NodeManagerAddress": "10.0.0.10", "Alive": True,
     "Resources": {"CPU": 2.0, "head": 1.0, "node:__internal_head__": 1.0, "node:10.0.0.10": 1.0}},
    {"NodeID": "a", "NodeManagerAddress": "10.0.0.11", "Alive": True, "Resources": {"CPU": 8.0, "session": 1.0}},
    {"NodeID": "b", "NodeManagerAddress": "10.0.0.12", "Alive": True, "Resources": {"CPU": 8.0, "session": 1.0}},
    {"NodeID": "c", "NodeManagerAddress": "10.0.0.20", "Alive": True, "Resources": {"CPU": 4.0, "client": 1.0}},
    {"NodeID": "d", "NodeManagerAddress": "10.0.0.21", "Alive": False, "Resources": {"client": 1.0}},
]  # fmt: skip


def test_the_nodes_roles_and_where_the_load_goes():
    nodes = alive_nodes(RAY_NODES)
    assert [(n.node_id, n.roles) for n in nodes] == [
        ("h", ("head",)), ("a", ("session",)), ("b", ("session",)), ("c", ("client",)),
    ]  # fmt: skip
    assert "node:10.0.0.10" not in nodes[0].resources
    sessions = [n for n in nodes if "session" in n.roles]
    assert addresses_distinct(sessions)
    from bench.experiment.deployment import InService

    one = [InService("a", "10.0.0.11")]
    assert targets(one, sessions, 8765, None, False) == ("http://10.0.0.11:8765",)
    assert targets(one, sessions, 8765, "http://10.0.0.12:8765", False) == ("http://10.0.0.11:8765",)
    assert targets(one, sessions, 8765, "https://lb.example:443", True) == ("https://lb.example:443",)
    with pytest.raises(SetupError, match="is not one of the cluster's session nodes"):
        targets(one, sessions, 8765, "http://127.0.0.1:8765", False)
    with pytest.raises(SetupError, match=r"`client` resource.*available_node_types.client"):
        require_client_nodes(nodes[:3])


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    p.add_argument("--duration", type=float, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--loops-per-node", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/scaling")
    return p.parse_args(argv)


def test_the_contracts_flags():
    opts = from_args(
        parse(
            "--cluster",
            "auto",
            "--session-nodes",
            "1,2",
            "--loops-per-node",
            "8",
            "--duration",
            "20",
            "--out",
            "d",
            "--transports",
            "ws,http-full",
        )
    )
    assert opts.address == "auto" and opts.session_nodes == (1, 2) and str(opts.out) == "d"
    assert opts.sweep.loops_per_node == (8,) and opts.sweep.duration_s == 20.0
    assert opts.sweep.transports == ("ws", "http-full") and opts.sweep.repeats == 1
    with pytest.raises(ValueError, match="--transports"):
        from_args(parse("--cluster", "auto", "--transports", "ws,carrier-pigeon"))
    with pytest.raises(ValueError, match="--url-is-balancer needs --url"):
        from_args(parse("--cluster", "auto", "--url-is-balancer"))


def model_step(k: int, gcs: float, valid: bool = True) -> dict:
    return {
        "session_nodes": k,
        "valid": valid,
        "turns_per_s": 100.0 * k,
        "loops": 8 * k,
        "nodes": [{"cpu_ms_per_turn": {"total": 4.0}}] * k,
        "shared_cpu_ms_per_s": {"gcs": gcs, "serve_controller": 5.0 * k, "head_raylet": 2.0},
        "store": {"commands_per_turn": 3.0, "bytes_per_turn": 500.0, "cpu_us_per_turn": 20.0},
        "actors_per_session_node": 3.0,
    }


def test_the_capacity_model_is_refitted_from_the_valid_steps():
    steps_ = [model_step(1, 10.0), model_step(2, 12.0), model_step(2, 13.0), model_step(3, 14.0),
              model_step(3, 900.0, valid=False)]  # fmt: skip
    model = capacity.refit(steps_, node_cores=8)
    assert model is not None and model["fit"]["steps_used"] == 4
    gcs = model["fit"]["lines"]["gcs"]
    assert gcs["per_node_ms_per_s"] == pytest.approx(2.0, abs=0.001) and gcs["slope_standard_error"] > 0
    assert model["error"]["gcs"] == gcs["slope_standard_error"]
    assert model["fit"]["turns_per_node_s"] == pytest.approx(8 * 1000 * 0.5 / 4.0)
    assert {e["session_nodes"] for e in model["extrapolation"]} == {10, 100, 1000}
    assert {e["slopes"] for e in model["extrapolation"]} == {"fitted", "slopes + 2 s.e."}
    assert any("1000 session nodes" in line for line in capacity.lines_text(model))
    assert capacity.refit([model_step(1, 1.0, valid=False)], 8) is None


def test_the_model_plans_a_session_node_of_its_machines_cores_not_rays_cpu_resource():
    """A node started with ``num_cpus=0`` (the multi-node harness's) has no CPU resource: the
    model takes the cores its sampler counted on the node's machine, and says so."""
    session = [
        Node("a", "10.0.0.2", ("session",), {"session": 1.0}, 0.0, None),
        Node("b", "10.0.0.3", ("session",), {"session": 1.0}, 0.0, None),
    ]
    assert capacity.node_cores(session, {"a": 2, "b": 4, "head": 16}) == (4.0, "the node's machine")
    assert capacity.node_cores(session, {}) == (0.0, "Ray's CPU resource")
    model = capacity.refit(
        [model_step(1, 10.0), model_step(2, 12.0)], *capacity.node_cores(session, {"a": 2})
    )
    assert model is not None and model["fit"]["node_cores"] == 2.0
    assert "2 cores (the node's machine)" in capacity.lines_text(model)[0]


PROVENANCE = {
    "command": "responses-ws bench scaling --cluster auto",
    "project_version": "0",
    "git_commit": None,
    "ray_version": "2.60.0",
    "started_at": "2026-01-01T00:00:00+00:00",
    "nodes": [],
}


def test_a_session_node_not_ready_is_refused_in_one_line():
    import http.server
    import threading

    from bench.experiment.deployment import InService
    from bench.experiment.experiment import wait_ready

    class NotReady(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"ready": false, "store": "unreachable"}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotReady)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(SetupError) as err:
            wait_ready([InService("a", "127.0.0.1")], server.server_address[1], timeout_s=0.0)
    finally:
        server.shutdown()
        server.server_close()
    assert "session node 127.0.0.1 is not ready" in err.value.message and "503" in err.value.message
    assert "\n" not in err.value.message
