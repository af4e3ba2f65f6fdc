"""``responses-ws serve --dashboard``: Ray's dashboard runs, and its actor list shows each
session host by name (its repr names it too).  The server runs in a child process with a
token of the test's own (Ray's token authentication guards the dashboard)."""

from __future__ import annotations

import json
import secrets
import urllib.request

from serve.embedded import free_port
from tests.support.serve_process import serve_process


def session_hosts(port: int, token: str) -> list[dict]:
    query = "filter_keys=class_name&filter_predicates=%3D&filter_values=SessionHost&detail=true"
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v0/actors?{query}",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())["data"]["result"]["result"]


def test_the_dashboard_lists_the_session_hosts(tmp_path):
    token = secrets.token_hex(32)
    port = free_port()
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    with serve_process(["--dashboard", "--dashboard-port", str(port)], cwd=tmp_path, env=env) as server:
        server.wait_ready()
        server.wait_for_line(f"Ray dashboard: http://127.0.0.1:{port}")
        hosts = session_hosts(port, token)
        assert server.stop() == 0
    assert hosts and all(h["state"] == "ALIVE" and h["name"].startswith("rws-") for h in hosts)
    assert all(h["repr_name"] == f"SessionHost({h['name']})" for h in hosts)
