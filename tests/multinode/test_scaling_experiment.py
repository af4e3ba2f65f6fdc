"""The scaling experiment on real nodes, as a user runs it: ``responses-ws bench scaling
--cluster auto`` submitted with ``ray job submit`` from the root namespace to the job server of
the tier harness's head, two steps of session nodes in service (1, then 2) at two load levels
each, short windows.  The load comes from Ray actors on the harness's client node; the
driver (the job, on the head) serves the live page on the head's bridge address and writes
its report into the harness's temp dir (one file system for every namespace).

Checks: every load actor ran on the client node (the report's ``load_nodes`` and clients, and
Ray's own record of the job's actors); every session node served turns in each step that had
it in service and none in a step that did not; the steps of ``scaling.json`` are the sweep's
and the document validates against its schema; the live page (while the run goes on) and
``report.html`` load in headless Chromium with no console error, one point a step, and the
live page gains points as steps finish; at the end nothing of the run is left: no actor of
the job alive, the deployment's config in force as before with a gateway on every session
node and the balancer sending to both, the live page's server gone, no driver process, no
browser."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.multinode import Harness, network
from bench.report import validate
from bench.report.browser import STEP_POINTS, Chromium, check_page

SESSION_NODES = (1, 2)
LOOPS_PER_NODE = (2, 4)
DURATION_S = 6
WARMUP_S = 2
FIRST_POINT_TIMEOUT_S = 300.0  # the job's start, the samplers, a redeploy to one gateway, a step
JOB_TIMEOUT_S = 600.0
SETTLE_TIMEOUT_S = 180.0  # the driver's restore is not waited for: a gateway starts again after it
LOAD_ACTOR = "LoadActor"  # bench/runner/cluster.py


def points(n: int | None = None) -> str:
    """A JavaScript expression: the page's step points (or whether there are ``n``)."""
    count = f"document.querySelectorAll({json.dumps(STEP_POINTS)}).length"
    return count if n is None else f"{count} > {n} && {count}"


def gateways(h: Harness) -> dict[str, str]:
    """Node id → state of each replica of the gateway, from Serve's REST API."""
    _, details = h.job_client.request("GET", "/api/serve/applications/")
    dep = details["applications"]["responses-ws"]["deployments"]["Gateway"]
    return {r["node_id"]: r["state"] for r in dep.get("replicas") or []}


def config_in_force(h: Harness) -> dict:
    _, details = h.job_client.request("GET", "/api/serve/applications/")
    return {name: app.get("deployed_app_config") for name, app in details["applications"].items()}


def settled(h: Harness, session_ids: set[str]) -> None:
    """Until a gateway runs on every session node, each answers ``/readyz`` and the balancer
    sends to all of them (a bounded wait)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        running = {i for i, state in gateways(h).items() if state == "RUNNING"}
        states = h.server_states()
        if running == session_ids and all(s.startswith("UP") for s in states.values()):
            break
        assert time.monotonic() < deadline, f"not settled: gateways {gateways(h)}, balancer {states}"
        time.sleep(1.0)
    for node in h.session_nodes:
        h.wait_ready(node.name, timeout_s=max(1.0, deadline - time.monotonic()))


def drivers_on_head(h: Harness) -> list[str]:
    """Command lines of the head's processes that run the experiment."""
    out = []
    for pid in network.namespace_pids(h.topology.head.namespace):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "bench scaling" in cmd:
            out.append(cmd)
    return out


def test_the_experiment_submitted_as_a_job_runs_its_load_on_the_client_node(harness: Harness):
    h = harness
    assert h.temp_dir is not None
    head, client = h.topology.head, h.client_nodes[0]
    client_id = h.node_ids[client.name]
    session_ids = {h.node_ids[n.name]: n.address for n in h.session_nodes}
    before = config_in_force(h)
    out = h.temp_dir / "scaling-run"
    t0 = time.monotonic()
    job = h.submit_job(
        "responses-ws", "bench", "scaling", "--cluster", "auto",
        "--session-nodes", ",".join(map(str, SESSION_NODES)),
        "--loops-per-node", ",".join(map(str, LOOPS_PER_NODE)),
        "--duration", str(DURATION_S), "--warmup", str(WARMUP_S),
        "--live-host", head.address, "--out", str(out),
        name="scaling",
    )  # fmt: skip
    try:
        live_url = job.wait_for_output(r"live page: (http://\S+)", FIRST_POINT_TIMEOUT_S).group(1)
        assert live_url.startswith(f"http://{head.address}:"), live_url
        with Chromium() as browser:
            profile, chromium = browser.profile, browser.process
            tab = browser.open(live_url)
            first = tab.wait_for(points(0), timeout=FIRST_POINT_TIMEOUT_S)
            first_state = tab.evaluate("document.getElementById('status').dataset.state")
            first_status = job.status()
            later = tab.wait_for(points(first), timeout=FIRST_POINT_TIMEOUT_S)
            later_status = job.status()
            tab.evaluate("1")  # every event sent before this answer is in
            live_errors = list(tab.errors)
            print(
                f"\nlive page {live_url}: {first} point(s) ({first_state}, job {first_status}), "
                f"then {later} (job {later_status}); errors {live_errors}"
            )
        info = job.wait(JOB_TIMEOUT_S)
    finally:
        job.stop()
    took = time.monotonic() - t0
    output = job.output()
    print(output[-3000:])
    assert info["status"] == "SUCCEEDED" and job.proc.returncode == 0, (info, output[-4000:])
    # the live page showed the steps as they finished, while the job ran, with no error
    assert first_status == "RUNNING" and first_state == "running", (first_status, first_state)
    assert later_status == "RUNNING" and first < later, (first, later, later_status)
    assert live_errors == []

    doc = json.loads((out / "scaling.json").read_text())
    validate(doc)
    steps = doc["steps"]
    print(f"{len(steps)} steps in {took:.0f}s (job submitted to job ended):")
    for s in steps:
        print(
            f"  {s['session_nodes']} session node(s) x {s['loops_per_node']} loops: {s['turns']} turns, "
            f"{s['turns_per_s']} turns/s, non-model p50/p99 {s['nonmodel_ms']}, valid {s['valid']} "
            f"({s['invalid_reason']}); per node {[(n['node_ip'], n['turns']) for n in s['nodes']]}"
        )
    # the steps are the sweep's, in the plan's order
    assert doc["complete"] is True
    assert doc["sweep"]["session_nodes"] == list(SESSION_NODES)
    assert doc["sweep"]["loops_per_node"] == list(LOOPS_PER_NODE)
    assert [(s["session_nodes"], s["loops_per_node"], s["loops"]) for s in steps] == [
        (k, n, k * n) for k in SESSION_NODES for n in LOOPS_PER_NODE
    ]
    assert [s["index"] for s in steps] == list(range(len(steps)))

    # every load actor ran on the client node: as the report says, and as Ray recorded it
    assert doc["load_nodes"] == [{"node_id": client_id, "node_ip": client.address}]
    for s in steps:
        assert s["clients"] and {(c["node_id"], c["node_ip"]) for c in s["clients"]} == {
            (client_id, client.address)
        }, s["clients"]
    actors = h.job_client.actors(job_id=info["job_id"], class_name=LOAD_ACTOR)
    print(f"{len(actors)} load actors, on nodes {sorted({a['node_id'] for a in actors})}")
    assert len(actors) >= len(steps) and {a["node_id"] for a in actors} == {client_id}

    # each session node served turns in each step that had it in service, none in the others
    in_steps: list[set[str]] = []
    for s in steps:
        served = {n["node_id"]: n["turns"] for n in s["nodes"]}
        assert len(served) == s["session_nodes"] and set(served) <= set(session_ids), s["nodes"]
        assert all(n["node_ip"] == session_ids[n["node_id"]] for n in s["nodes"])
        assert all(turns > 0 for turns in served.values()), s["nodes"]
        idle = {n["node_id"]: n["turns"] for n in s["out_of_service"]}
        assert set(idle) == set(session_ids) - set(served), s["out_of_service"]
        assert all(turns == 0 for turns in idle.values()), s["out_of_service"]
        in_steps.append(set(served))
    assert in_steps[-1] == set(session_ids)  # the last steps had both

    # the report loads in the browser with no error and one point a step
    report = check_page((out / "report.html").as_uri())
    assert report.errors == [] and report.points == len(steps), report
    assert {p.name for p in out.iterdir()} >= {"scaling.json", "report.html", "scaling.csv", "scaling.md"}

    # nothing of the run is left
    assert h.job_client.actors(job_id=info["job_id"], state="ALIVE") == []
    settled(h, set(session_ids))
    assert config_in_force(h) == before
    try:
        urllib.request.urlopen(live_url, timeout=5)
        raise AssertionError(f"the live page still answers at {live_url}")
    except urllib.error.URLError:
        pass
    assert drivers_on_head(h) == []
    assert profile is not None and not profile.exists()  # the browser's profile, and the browser
    assert chromium is not None and chromium.poll() is not None
