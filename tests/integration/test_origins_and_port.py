"""Against the suite's server, with real sockets: a web page outside ``server.allowed_origins``
is refused on the WebSocket upgrade and on HTTP (403, a typed body), a page of this machine
and a client without ``Origin`` are served; and a second application deployed on the same
port fails to start, naming the port, while the first serves on (docs/reliability.md)."""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request

import pytest
import websockets
from websockets.exceptions import InvalidStatus

from bench.client import ws_url
from serve.embedded import DeployFailed, deploy, local_config
from tests.support.server import stop_app
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
    port = int(server_url.rsplit(":", 1)[1])
    try:
        with pytest.raises(DeployFailed) as failed:
            # No warm session hosts: each of Serve's three gateway attempts would start one
            # before it reaches the port (~2 s each), and none would serve.
            deploy(local_config(**{"server.port": port, "session.warm_actors": 0}), name="rws-intruder")
    finally:
        stop_app("rws-intruder")  # what the failed deploy started goes without a wait for it
    assert f"port {port} is already in use by another responses-ws server (pid " in str(failed.value)
    assert "ServeReplica:responses-ws:Gateway" in str(failed.value)
    assert all(post(server_url, {})[0] == 200 for _ in range(10))


def test_every_request_of_a_keep_alive_connection_is_checked_and_allowed_pages_get_cors(server_url):
    """One keep-alive HTTP connection (handed to a session host after its first request's
    check at the gateway): a later request from a foreign page is refused too, and an
    allowed page's preflight and requests get the CORS headers a browser needs."""
    host, port = server_url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps(CREATE)
    page = "http://localhost:3000"
    answers = []
    try:
        for origin in (None, "https://evil.example", page):
            headers = {"Content-Type": "application/json", **({"Origin": origin} if origin else {})}
            conn.request("POST", "/v1/responses", body=body, headers=headers)
            resp = conn.getresponse()
            answers.append((resp.status, dict(resp.getheaders()), json.loads(resp.read())))
        conn.request(
            "OPTIONS",
            "/v1/responses",
            headers={
                "Origin": page,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        preflight = conn.getresponse()
        preflight.read()
    finally:
        conn.close()
    (first, h1, _), (evil, _, refused), (allowed, h3, served) = answers
    assert first == 200 and "access-control-allow-origin" not in {k.lower() for k in h1}
    assert evil == 403 and refused["error"]["code"] == "origin_not_allowed"
    assert allowed == 200 and served["status"] == "completed"
    assert {k.lower(): v for k, v in h3.items()}["access-control-allow-origin"] == page
    assert preflight.status == 204
    assert preflight.getheader("Access-Control-Allow-Origin") == page
    assert "POST" in preflight.getheader("Access-Control-Allow-Methods")
    assert preflight.getheader("Access-Control-Allow-Headers") == "authorization, content-type"
    assert int(preflight.getheader("Access-Control-Max-Age")) > 0
