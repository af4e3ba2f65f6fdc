"""The harness itself: its namespaces route nowhere but the bridge, its head takes jobs (`ray
job submit`) and its client node runs what asks for the `client` resource, it refuses to start
beside a leftover (and `cleanup` removes one), and it removes what it made when its set-up
fails."""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bench.multinode import Harness, NodeSpec, network, processes
from bench.multinode.cleanup import cleanup
from bench.multinode.harness import LeftoverError
from bench.multinode.topology import foreign_routes


def test_no_namespace_routes_off_the_bridge(harness: Harness):
    for node in harness.topology.nodes:
        routes = network.routes(node.namespace)
        print(
            f"\n{node.namespace}: "
            + "; ".join(f"{r.get('type', 'unicast')} {r['dst']} dev {r.get('dev', '-')}" for r in routes)
        )
        assert foreign_routes(routes, harness.topology.subnet) == []
        assert not any(r["dst"] == "default" for r in routes)
        links = [ln.split()[0] for ln in network.ip("-br", "link", namespace=node.namespace).splitlines()]
        assert links == ["lo", "eth0@if" + links[1].split("@if")[-1]], links  # loopback and the veth end
        # a route lookup only (nothing is sent): an address outside the bridge has no route
        lookup = subprocess.run(
            ["ip", "-n", node.namespace, "route", "get", "198.51.100.1"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert lookup.returncode != 0 and "unreachable" in lookup.stderr.lower(), lookup


def test_a_second_harness_refuses_to_start_beside_the_first(harness: Harness):
    with pytest.raises(LeftoverError) as exc:
        Harness().start()
    print(f"\n{exc.value}")
    assert f"namespace {harness.topology.head.namespace}" in str(exc.value)
    assert "bench.multinode.cleanup" in str(exc.value)
    assert harness.ready(harness.session_nodes[0].name) == 200  # the running one is untouched


def test_a_failed_set_up_removes_everything_it_made(harness: Harness):
    """A head whose ``ray start`` fails (a negative resource quantity): after the error no
    namespace, interface or temp dir of the prefix is left and Redis, started before, is
    gone.  Another prefix and subnet, so it runs beside the tier's harness."""
    h = Harness(
        (NodeSpec("head", {"head": -1}),),
        prefix="rwsmx",
        subnet="10.213.38.0/24",
        serve_config=None,
        start_timeout_s=90,
    )
    with pytest.raises(RuntimeError, match="ray start on head exited"):
        h.start()
    left = [n for n in network.namespaces() + network.links() if n.startswith("rwsmx-")]
    assert left == []
    assert h.temp_dir is not None and not h.temp_dir.exists()
    started = [p for ps in h.procs.values() for p in ps]
    print(
        f"\nstarted {len(started)} processes ({', '.join(h.procs)}), all ended: "
        f"{[p.returncode for p in started]}"
    )
    assert len(started) == 2 and all(p.returncode is not None for p in started)
    assert not list(Path("/tmp").glob("rwsmx-*"))


def test_cleanup_removes_a_leftover_and_only_names_of_its_prefix(harness: Harness, tmp_path: Path):
    """A leftover made by hand (a namespace with a process in it, a bridge, a temp dir) blocks
    a harness of its prefix until ``cleanup`` removes it; the tier's harness is untouched."""
    network.ip("netns", "add", "rwsmx-left")
    network.ip("link", "add", "rwsmx-br", "type", "bridge")
    left_dir = Path(tempfile.mkdtemp(prefix="rwsmx-", dir="/tmp"))
    sleeper = processes.launch(
        ["sleep", "300"], tmp_path / "sleep.log", {"PATH": "/usr/bin:/bin"}, "rwsmx-left"
    )
    try:
        deadline = time.monotonic() + 10
        while not network.namespace_pids("rwsmx-left") and time.monotonic() < deadline:
            time.sleep(0.05)  # `ip netns exec` enters the namespace, then becomes `sleep`
        assert network.namespace_pids("rwsmx-left") == [sleeper.pid]
        with pytest.raises(LeftoverError, match="rwsmx-left"):
            Harness(prefix="rwsmx", subnet="10.213.38.0/24").start()
        removed = cleanup(prefix="rwsmx")
        print("\n" + "\n".join(removed))
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert [n for n in network.namespaces() + network.links() if n.startswith("rwsmx-")] == []
        assert not left_dir.exists()
        assert harness.topology.head.namespace in network.namespaces()
        assert harness.ready(harness.session_nodes[0].name) == 200
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        cleanup(prefix="rwsmx")


JOB = """
import ray
ray.init(address="auto")

@ray.remote(num_cpus=0, resources={"client": 0.001})
def where():
    return ray.get_runtime_context().get_node_id()

print("driver on", ray.get_runtime_context().get_node_id(), "actor on", ray.get(where.remote()), flush=True)
"""


def test_a_job_submitted_from_the_root_namespace_runs_on_the_head(harness: Harness):
    """``ray job submit --address http://HEAD:8265`` from outside the nodes (the token in its
    environment) runs the entrypoint on the head with the nodes' virtualenv on its PATH, and a
    task asking for the ``client`` resource runs on the client node; the app's config in force
    is Serve's (`serve deploy`); without the token the job server refuses."""
    job = harness.submit_job("python", "-c", JOB, name="where")
    info = job.wait(timeout_s=120)
    out = job.output()
    print(f"\n{info['status']}: {out.splitlines()[-3:]}")
    assert info["status"] == "SUCCEEDED" and job.proc.returncode == 0, out[-3000:]
    line = next(ln for ln in out.splitlines() if ln.startswith("driver on"))
    _, _, driver, _, _, actor = line.split()
    assert driver == harness.node_ids["head"]
    assert actor == harness.node_ids[harness.client_nodes[0].name]
    status, serve = harness.job_client.request("GET", "/api/serve/applications/")
    in_force = {name: app.get("deployed_app_config") for name, app in serve["applications"].items()}
    assert status == 200 and in_force["responses-ws"]["args"]["server"]["gateway_replicas"] == 2, in_force
    anonymous = urllib.request.Request(harness.job_address + "/api/jobs/")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(anonymous, timeout=10)
    assert refused.value.code == 401
