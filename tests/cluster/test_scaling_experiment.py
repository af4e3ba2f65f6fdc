"""``responses-ws bench scaling --cluster ADDRESS`` on raylets on one machine (loopback, no
root): the orchestration of the scaling experiment: its sweep in the default tier (``make
test``), its refused URL and interrupted run in the operations tier (``make
test-operations``); ``.ci/run`` runs both.

Four ``ray start`` nodes on 127.0.0.1 as an operator starts them, each with the custom
resources of its node type: the head (Serve's controller, the dashboard whose REST API the
experiment uses, the inference replica: ``head``, ``accelerator``), two session nodes
(``session``) and a client node (``client``).  configs/serve-cluster.yaml is deployed with
``serve deploy``'s REST call (one gateway to begin with, the suite's redis-server as the
store) while the nodes after the head join; the experiment then runs as a driver of the
cluster (tests/support/loopback.py).  The nodes share one address here, so the experiment
counts each node's turns on the server's side (its Ray metrics, reported every 500 ms on
this cluster).  One cluster serves the module's cases.

A sweep of two session-node steps at one load level, short windows, started with the cluster
on a thread at the session's first test (``loopback_sweep``, tests/conftest.py: it runs
beside the tests before it) and checked here.  Checks: every load actor ran on the client
node; each session node served turns in every step that had it in service and none in a step
that did not; the steps are the sweep's; ``scaling.json`` validates against its schema; the
gateway count is back to the deployed one at the end; no load actor or sampler is left.  Past
two metrics export intervals after the run, the idle cluster's gauges set on change alone (each
session host's connections, each store writer's degraded shards) are still exported.

Then a ``--url`` outside the cluster is refused with one line; ``--transports ws,http-full``
interleaves the transports over two load levels, and Ctrl-C during the third step ends the
run with the partial report (``complete: false``) and no load actor or sampler left."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.report import validate
from tests.support.loopback import LoopbackCluster, LoopbackSweep, command, experiment


@pytest.fixture(scope="module")
def loopback(loopback_sweep: LoopbackSweep) -> Iterator[LoopbackCluster]:
    """One cluster for the module's cases (each ends with the deployment as it found it),
    started by ``loopback_sweep`` (tests/conftest.py) and stopped at the module's end."""
    try:
        yield loopback_sweep.ready()
    finally:
        loopback_sweep.stop()


def nothing_left_behind(cluster: LoopbackCluster) -> None:
    """No load actor or node sampler of the run lives on (they end with it, bounded wait)."""
    deadline = time.monotonic() + 60
    while {"LoadActor", "NodeSampler"} & set(alive := cluster.alive_actors()):
        assert time.monotonic() < deadline, alive
        time.sleep(0.5)


def gateways_back_to_one(cluster: LoopbackCluster) -> None:
    """The deployment is back as it was: one gateway."""
    gateway = cluster.rest("GET")["applications"]["responses-ws"]["deployments"]["Gateway"]
    deadline = time.monotonic() + 60
    while gateway["target_num_replicas"] != 1 and time.monotonic() < deadline:
        time.sleep(0.5)
        gateway = cluster.rest("GET")["applications"]["responses-ws"]["deployments"]["Gateway"]
    assert gateway["target_num_replicas"] == 1


@pytest.mark.loopback_sweep
@pytest.mark.default_tier
def test_scaling_experiment_sweeps_the_session_nodes_of_a_loopback_cluster(loopback, loopback_sweep):
    """One sweep of two session-node steps at one load level, short windows (the checks need
    turns, not figures), run on its thread since the session's first test (``loopback_sweep``)."""
    cluster = loopback
    run, out = loopback_sweep.run(), loopback_sweep.out
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    doc = json.loads((out / "scaling.json").read_text())
    validate(doc)
    assert doc["complete"] is True
    assert (out / "report.html").is_file()

    nodes = {n["node_id"]: n for n in doc["provenance"]["nodes"]}
    clients = {i for i, n in nodes.items() if "client" in n["roles"]}
    sessions = {i for i, n in nodes.items() if "session" in n["roles"]}
    assert len(clients) == 1 and len(sessions) == 2
    assert {n["node_id"] for n in doc["load_nodes"]} == clients
    for step in doc["steps"]:
        assert {c["node_id"] for c in step["clients"]} <= clients

    planned = [(s["session_nodes"], s["loops_per_node"], s["transport"]) for s in doc["steps"]]
    assert planned == [(1, 2, "ws"), (2, 2, "ws")]
    assert [s["loops"] for s in doc["steps"]] == [2, 4]
    for step in doc["steps"]:
        assert step["turns"] > 0 and not step["failures"], step  # valid or not: this machine's load
        assert step["turns_counted_by"] == "server"  # the nodes share one address here
        in_service = {n["node_id"] for n in step["nodes"]}
        assert len(in_service) == step["session_nodes"] and in_service <= sessions
        # One machine: the gateways share one listening socket (serve/port_claim.py), so the
        # kernel picks the node of each connection; the nodes in service served the turns.
        assert sum(n["turns"] for n in step["nodes"]) > 0, step["nodes"]
        out_of_service = {n["node_id"]: n["turns"] for n in step["out_of_service"]}
        assert set(out_of_service) == sessions - in_service and not any(out_of_service.values()), step

    gateways_back_to_one(cluster)
    nothing_left_behind(cluster)


# Ray's metrics agent drops a gauge series not set again within two export intervals: on this
# cluster (RAY_metrics_report_interval_ms=500) 2 × max(0.5 s, 1 s)
GAUGE_TTL_S = 2.0


def gauges(urls: list[str], name: str, label: str) -> dict[str, float]:
    """The value of each ``name`` series exported by the nodes, by its ``label``."""
    found = {}
    for url in urls:
        for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
            found |= {s.labels[label]: s.value for s in family.samples if s.name == name}
    return found


@pytest.mark.loopback_sweep
@pytest.mark.default_tier
def test_the_idle_clusters_gauges_stay_exported_while_their_values_hold(loopback, loopback_sweep):
    """After the sweep, its hosts idle: gauges set when their value changes stay exported past
    Ray's time to drop them (each process sets them again twice an export interval)."""
    assert loopback_sweep.run().returncode == 0 and loopback_sweep.ended is not None
    while (idle_s := time.monotonic() - loopback_sweep.ended) < 2 * GAUGE_TTL_S:
        time.sleep(2 * GAUGE_TTL_S - idle_s)
    urls = loopback.metrics_urls
    hosts = gauges(urls, "ray_responses_ws_host_connections", "host")
    writers = gauges(urls, "ray_responses_ws_store_degraded_shards", "process")
    tokens = gauges(urls, "ray_responses_ws_inference_tokens_per_second", "replica")
    assert hosts and set(hosts.values()) == {0.0}, hosts  # the pool's warm host at least: no socket
    assert set(hosts) <= set(writers) and any(w.startswith("gateway-") for w in writers), writers
    assert set(writers.values()) == {0.0}, writers  # the suite's redis-server: one shard, no replica asked
    assert len(tokens) == 1 and set(tokens.values()) == {0.0}, tokens  # the idle replica


def test_a_url_outside_the_cluster_is_refused_and_ctrl_c_writes_the_partial_report(loopback, tmp_path):
    """The operations tier's case: a ``--url`` outside the cluster is refused in one line;
    the transports interleaved and Ctrl-C during the third step: the load actors end, the
    partial report is written."""
    cluster = loopback
    bad = experiment(cluster, tmp_path / "bad", "--url", "http://192.0.2.1:8765")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "is not one of the cluster's session nodes" in bad.stderr

    out = tmp_path / "interrupted"
    cmd, env = command(cluster, out, "--session-nodes", "1", "--loops-per-node", "1,2", "--duration", "6",
                       "--warmup", "1", "--transports", "ws,http-full")  # fmt: skip
    # Ctrl-C at a terminal: SIGINT at its default in the run (a suite started in the background
    # of a shell, as `cmd &`, ignores SIGINT, and the run would inherit that)
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the second step's progress line
            if line.startswith("[2/4]"):
                break
        deadline = time.monotonic() + 60
        polls: list[float] = []  # how long each look took (the state API on a loaded machine)
        while True:  # until the third step's load runs
            t0 = time.monotonic()
            running = cluster.alive_actors("LoadActor")
            polls.append(round(time.monotonic() - t0, 2))
            assert proc.poll() is None, (
                f"the run ended before its third step was seen; state API polls (s): {polls}"
            )
            if running:
                break
            assert time.monotonic() < deadline, "the third step did not start"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, f"state API polls (s): {polls}\n{err[-3000:]}"
    partial = json.loads((out / "scaling.json").read_text())
    validate(partial)
    assert partial["complete"] is False and partial["error"] == "interrupted"
    assert [(s["transport"], s["loops"]) for s in partial["steps"]] == [("ws", 1), ("http-full", 1)]
    nothing_left_behind(cluster)
    for step in partial["steps"]:  # every loop connected at its first attempt, and served turns
        assert step["turns"] > 0 and not step["failures"], step
