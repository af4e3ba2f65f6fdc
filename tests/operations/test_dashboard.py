"""``responses-ws serve --dashboard``: Ray's dashboard runs, and its actor list shows each
session host by name (its repr names it too).  The server (the ``operator_server``
fixture, tests/conftest.py) runs in a child process with a token of the suite's own (Ray's
token authentication guards the dashboard); its orderly stop is checked by
test_serve_logs.py, which stops it."""

from __future__ import annotations

import json
import urllib.request

from tests.support.serve_process import ServeProcess


def session_hosts(port: int, token: str) -> list[dict]:
    query = "filter_keys=class_name&filter_predicates=%3D&filter_values=SessionHost&detail=true"
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v0/actors?{query}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())["data"]["result"]["result"]


def test_the_dashboard_lists_the_session_hosts(operator_server: ServeProcess):
    server = operator_server
    port = int(server.args[server.args.index("--dashboard-port") + 1])
    server.wait_for_line(f"Ray dashboard: http://127.0.0.1:{port}")
    hosts = session_hosts(port, server.env["RAY_AUTH_TOKEN"])
    assert hosts and all(h["state"] == "ALIVE" and h["name"].startswith("rws-") for h in hosts)
    assert all(h["repr_name"] == f"SessionHost({h['name']})" for h in hosts)
