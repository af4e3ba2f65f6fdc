"""``responses-ws serve --address`` on a shared cluster: a real ``ray start --head`` cluster
(token authentication) where Serve already runs, with its HTTP proxy and another
application.  Starting joins that Serve instance without changing its settings; stopping
deletes only this application: the cluster, Serve, its proxy and the other application
stay.  The cluster (the ``shared_ray_cluster`` fixture, tests/conftest.py) starts with the
suite's other children that run a Ray of their own; its processes are ended by pid at the
test's end (tests/support/ray_cluster.py)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

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


def test_joining_a_shared_cluster_leaves_it_as_it_was(shared_ray_cluster: LocalCluster, tmp_path):
    cluster = shared_ray_cluster
    proxy_port = free_port()
    other = f"http://127.0.0.1:{proxy_port}/other"
    with cluster.driver() as driver:  # another user's, connected throughout
        before = state(driver.run(SETUP.format(proxy_port=proxy_port) + STATE))
        assert get_text(other) == "hello from another app"
        assert before["apps"] == {"other": "RUNNING"} and before["proxies"] == 1

        with serve_process(["--address", cluster.address], cwd=tmp_path, env=cluster.env) as server:
            server.wait_ready()
            assert get_json(f"{server.url}/readyz")[0] == 200
            assert asyncio.run(one_turn(server.url)) == "response.completed"
            during = state(driver.run(STATE))
            assert during["apps"] == {"other": "RUNNING", "responses-ws": "RUNNING"}
            assert during["proxies"] == 1  # its HTTP proxy kept (we would have started Serve without one)
            assert get_text(other) == "hello from another app"
            assert server.stop() == 0

    after = state(cluster.run(STATE))  # the cluster is up: a new driver joins it
    assert after == before  # only our app is gone; Serve and the other app are untouched
    assert get_text(other) == "hello from another app"
