"""``responses-ws serve --address`` on a shared cluster: a real ``ray start --head`` cluster
(token authentication) where Serve already runs, with its HTTP proxy and another
application.  Starting joins that Serve instance without changing its settings; stopping
deletes only this application: the cluster, Serve, its proxy and the other application
stay.  The cluster's processes are ended by pid at the end (tests/support/ray_cluster.py)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
import websockets

from bench.client import ws_url
from serve.embedded import free_port
from tests.support.ray_cluster import LocalCluster
from tests.support.serve_process import get_json, serve_process
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

STATE = """
import json
import ray
from ray import serve

ray.init(address=ADDRESS)
status = serve.status()
print(json.dumps({"apps": {name: app.status for name, app in status.applications.items()},
                  "proxies": len(status.proxies)}))
"""


@pytest.fixture
def cluster():
    cluster = LocalCluster()
    try:
        cluster.wait_up()
        yield cluster
    finally:
        cluster.stop()


def state(cluster: LocalCluster) -> dict:
    return json.loads(cluster.run(STATE).strip().splitlines()[-1])


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


async def one_turn(url: str) -> str:
    async with websockets.connect(ws_url(url)) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": "emu-fast", "store": False, "input": "Hi",
                                  "metadata": {"emulator.tool_rounds": "0", "emulator.text_tokens": "5"}}))
        return (await raw_collect(ws))[-1]["type"]


def test_joining_a_shared_cluster_leaves_it_as_it_was(cluster, tmp_path):
    proxy_port = free_port()
    cluster.run(SETUP.format(proxy_port=proxy_port))
    other = f"http://127.0.0.1:{proxy_port}/other"
    assert get_text(other) == "hello from another app"
    before = state(cluster)
    assert before["apps"] == {"other": "RUNNING"} and before["proxies"] == 1

    with serve_process(["--address", cluster.address], cwd=tmp_path, env=cluster.env) as server:
        server.wait_ready()
        assert get_json(f"{server.url}/readyz")[0] == 200
        assert asyncio.run(one_turn(server.url)) == "response.completed"
        during = state(cluster)
        assert during["apps"] == {"other": "RUNNING", "responses-ws": "RUNNING"}
        assert during["proxies"] == 1  # its HTTP proxy kept (we would have started Serve without one)
        assert get_text(other) == "hello from another app"
        assert server.stop() == 0

    after = state(cluster)  # the cluster is up: a new driver joins it
    assert after == before  # only our app is gone; Serve and the other app are untouched
    assert get_text(other) == "hello from another app"
