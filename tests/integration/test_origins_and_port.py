"""Against the suite's server, with real sockets: a web page outside ``server.allowed_origins``
is refused on the WebSocket upgrade and on HTTP (403, a typed body), a page of this machine
and a client without ``Origin`` are served; and a second application deployed on the same
port fails to start, naming the port, while the first serves on (docs/reliability.md)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
import websockets
from websockets.exceptions import InvalidStatus

from bench.client import ws_url
from serve.embedded import DeployFailed, deploy, local_config
from tests.support.wire import raw_collect

CREATE = {
    "model": "emu-fast",
    "input": "Hi",
    "store": False,
    "metadata": {"emulator.tool_rounds": "0", "emulator.text_tokens": "3"},
}


async def one_turn(url: str, origin: str | None) -> str:
    async with websockets.connect(ws_url(url), origin=origin) as ws:
        await ws.send(json.dumps({"type": "response.create", **CREATE}))
        return (await raw_collect(ws))[-1]["type"]


def post(url: str, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{url}/v1/responses",
        data=json.dumps(CREATE).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_an_upgrade_from_a_foreign_page_is_refused_with_403(server_url):
    async def refused():
        with pytest.raises(InvalidStatus) as exc:
            await one_turn(server_url, "https://evil.example")
        return exc.value.response

    response = asyncio.run(refused())
    assert response.status_code == 403
    assert response.headers["Content-Type"] == "application/json"
    error = json.loads(response.body)["error"]
    assert error["code"] == "origin_not_allowed" and error["type"] == "invalid_request_error"
    assert "https://evil.example" in error["message"]


@pytest.mark.parametrize("origin", [None, "http://localhost:5173", "http://127.0.0.1:8080"])
def test_clients_without_origin_and_pages_of_this_machine_are_served(server_url, origin):
    assert asyncio.run(one_turn(server_url, origin)) == "response.completed"


def test_http_from_a_foreign_page_is_refused_and_without_origin_served(server_url):
    status, body = post(server_url, {"Origin": "https://evil.example"})
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"
    status, body = post(server_url, {"Origin": "null"})
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"
    status, body = post(server_url, {})
    assert status == 200 and body["status"] == "completed"
    status, body = post(server_url, {"Origin": "http://localhost:3000"})
    assert status == 200 and body["status"] == "completed"


def test_another_application_on_the_port_fails_to_deploy_and_the_first_serves_on(server_url):
    from ray import serve

    port = int(server_url.rsplit(":", 1)[1])
    try:
        with pytest.raises(DeployFailed) as failed:
            # No warm session hosts: each of Serve's three gateway attempts would start one
            # before it reaches the port (~2 s each), and none would serve.
            deploy(local_config(**{"server.port": port, "session.warm_actors": 0}), name="rws-intruder")
    finally:
        serve.delete("rws-intruder")
    assert f"port {port} is already in use by another responses-ws server (pid " in str(failed.value)
    assert "ServeReplica:responses-ws:Gateway" in str(failed.value)
    assert all(post(server_url, {})[0] == 200 for _ in range(10))
