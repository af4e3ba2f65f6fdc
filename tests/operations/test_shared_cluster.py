"""``responses-ws serve --address`` on a shared cluster: a real ``ray start --head`` cluster
(token authentication) where Serve already runs, with its HTTP proxy and another
application.  Starting joins that Serve instance without changing its settings; stopping
deletes only this application: the cluster, Serve, its proxy and the other application
stay.  While it serves, ``responses-ws status`` of the cluster (its dashboard) says it is
healthy, and names the store when the store stops answering.  The cluster (the
``shared_ray_cluster`` fixture, tests/conftest.py) starts with the suite's other children
that run a Ray of their own; its processes are ended by pid at the test's end
(tests/support/ray_cluster.py)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import websockets
import websockets.sync.client as ws_sync
import yaml

from bench.client import ws_url
from serve.embedded import free_port
from tests.support.ray_cluster import LocalCluster
from tests.support.serve_process import get_json, serve_process
from tests.support.status_run import PrivateRedis, poll_status, private_redis, run_status
from tests.support.wire import raw_collect

SETUP = """
import ray
from ray import serve

ray.init(address=ADDRESS)
serve.start(proxy_location="HeadOnly", http_options={{"host": "127.0.0.1", "port": {proxy_port}}})

@serve.deployment(ray_actor_options={{"num_cpus": 0}})
def hello(request):
    return "hello from another app"

serve.run(hello.bind(), name="other", route_prefix="/other")
"""

# Serve's applications and proxies as one JSON line, from a driver of the cluster.
STATE = """
import json
import ray
from ray import serve

if not ray.is_initialized():
    ray.init(address=ADDRESS)
status = serve.status()
print(json.dumps({"apps": {name: app.status for name, app in status.applications.items()},
                  "proxies": len(status.proxies)}))
"""


def state(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


async def one_turn(url: str) -> str:
    async with websockets.connect(ws_url(url)) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": "emu-fast",
                    "store": False,
                    "input": "Hi",
                    "metadata": {"emulator.tool_rounds": "0", "emulator.text_tokens": "5"},
                }
            )
        )
        return (await raw_collect(ws))[-1]["type"]


def app_config(directory: Path, store: PrivateRedis) -> Path:
    path = directory / "app.yaml"
    redis = {"backend": "redis", "redis_url": store.url, "redis_password_file": str(store.password_file)}
    path.write_text(yaml.safe_dump({"store": redis}))
    return path


def status_says_healthy_then_names_the_store(
    cluster: LocalCluster, url: str, config: Path, store: PrivateRedis
) -> None:
    """``responses-ws status`` of the cluster (its dashboard, the gateway's /readyz and
    metrics, the store with the app's credential): healthy, with the one open socket counted;
    with the store paused, exit 1 and the store named on one line; healthy again after."""
    args = ["--address", cluster.dashboard_url, "--config", str(config), "--port", url.rsplit(":", 1)[1]]
    args += ["--metrics-port", str(cluster.metrics_port), "--timeout", "3"]
    start = time.monotonic()
    with ws_sync.connect(ws_url(url)):  # one open connection, for the count
        healthy = poll_status(
            args,
            cluster.env,
            until=lambda run: run.code == 0 and list(run.doc["connections"].values()) == [1],
            timeout_s=60,
            what="status healthy with one open connection exported",
        )
    took = time.monotonic() - start
    doc = healthy.doc
    assert doc["healthy"] and doc["verdict"] == "healthy" and healthy.stderr == ""
    ((node, alive),) = [(n["ip"], n["alive"]) for n in doc["nodes"]]  # the head, no role resource
    assert alive and doc["replicas_by_node"]["responses-ws"]["Gateway"] == {node: 1}
    assert doc["replicas_by_node"]["other"] == {"hello": {node: 1}}
    assert [(r["node_ip"], r["code"]) for r in doc["readiness"]] == [
        (node, 200)
    ]  # asked on 127.0.0.1: its host
    assert doc["store"]["checked"] and doc["store"]["ok"] and store.url in doc["store"]["target"]
    assert not (doc["store"]["replication"] or {}).get("degraded")  # one server: no replica wanted
    store.pause()
    try:
        broken = run_status(args, cluster.env)
    finally:
        store.pause(False)
    assert broken.code == 1 and broken.doc is not None and not broken.doc["healthy"]
    (line,) = broken.stderr.splitlines()
    assert line.startswith("unhealthy: ") and f"store {store.url}: unreachable" in line, line
    assert f"session node {node}: /readyz 503: store: no answer within" in line, line
    assert run_status(args, cluster.env).code == 0
    print(f"responses-ws status: healthy (the socket counted) after {took:.1f} s; paused store: {line}")


def test_joining_a_shared_cluster_leaves_it_as_it_was(shared_ray_cluster: LocalCluster, tmp_path):
    cluster = shared_ray_cluster
    proxy_port = free_port()
    other = f"http://127.0.0.1:{proxy_port}/other"
    with cluster.driver() as driver:  # another user's, connected throughout
        before = state(driver.run(SETUP.format(proxy_port=proxy_port) + STATE))
        assert get_text(other) == "hello from another app"
        assert before["apps"] == {"other": "RUNNING"} and before["proxies"] == 1

        with (
            private_redis(tmp_path) as store,  # the app's store: password-protected, as on a cluster
            serve_process(
                ["--address", cluster.address, "--config", str(app_config(tmp_path, store))],
                cwd=tmp_path,
                env=cluster.env,
            ) as server,
        ):
            server.wait_ready()
            assert get_json(f"{server.url}/readyz")[0] == 200
            assert asyncio.run(one_turn(server.url)) == "response.completed"
            during = state(driver.run(STATE))
            assert during["apps"] == {"other": "RUNNING", "responses-ws": "RUNNING"}
            assert during["proxies"] == 1  # its HTTP proxy kept (we would have started Serve without one)
            assert get_text(other) == "hello from another app"
            status_says_healthy_then_names_the_store(cluster, server.url, tmp_path / "app.yaml", store)
            assert server.stop() == 0

    after = state(cluster.run(STATE))  # the cluster is up: a new driver joins it
    assert after == before  # only our app is gone; Serve and the other app are untouched
    assert get_text(other) == "hello from another app"
