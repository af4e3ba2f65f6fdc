"""``responses-ws serve`` on one machine, as a user runs it: the embedded Ray listens on
loopback only (its dashboard too: the ``operator_server`` fixture, tests/conftest.py, runs
``--dashboard``), and a second server started on the same port fails at once, naming the
port and the process that holds it, while the first goes on serving every request itself
(docs/reliability.md, "One server per port" and "A local server is local")."""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.request

import psutil

from tests.support.serve_process import ServeProcess, get_json, serve_process


def listening_sockets(pid: int) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket of ``pid`` and its
    descendants (Ray's processes and workers are all started below it)."""
    found = []
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = proc.name() if not proc.cmdline() else proc.cmdline()[0]
            found += [
                (name, c.laddr.ip, c.laddr.port)
                for c in proc.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            ]
        except psutil.Error:  # a worker that has just exited
            pass
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


def test_the_embedded_ray_listens_on_loopback_only(operator_server: ServeProcess):
    server = operator_server
    sockets = listening_sockets(server.proc.pid)
    assert len(sockets) > 10  # the GCS, raylet, agents, workers, the gateway: all were seen
    elsewhere = [s for s in sockets if not is_loopback(s[1])]
    # The one exception: Ray Serve 2.60 binds each replica's inter-deployment gRPC server to
    # [::]:0, with no setting for it (docs/reliability.md); one such socket per replica.
    serve_grpc = [s for s in elsewhere if s[0].startswith("ray::ServeReplica:") and s[1] == "::"]
    assert elsewhere == serve_grpc, elsewhere
    assert len({name for name, _, _ in serve_grpc}) == len(serve_grpc)  # at most one per replica


def create_stored(url: str, i: int) -> str:
    body = json.dumps(
        {
            "model": "emu-fast",
            "input": f"note {i}",
            "store": True,
            "metadata": {"emulator.tool_rounds": "0", "emulator.text_tokens": "3"},
        }
    ).encode()
    request = urllib.request.Request(
        f"{url}/v1/responses", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())["id"]


def test_a_second_server_on_the_port_fails_at_once_and_the_first_serves_on(
    operator_server: ServeProcess, tmp_path
):
    server = operator_server
    port = int(server.url.rsplit(":", 1)[1])
    started = time.monotonic()
    with serve_process([], cwd=tmp_path, port=port) as second:
        code = second.proc.wait(timeout=60)
        took = time.monotonic() - started
        output = second.output()
    assert code == 1, output
    assert took < 30, output  # before starting a Ray of its own
    assert f"port {port} is already in use by another responses-ws server (pid " in output, output
    holder = int(output.split("(pid ", 1)[1].split(":", 1)[0])
    assert holder in {p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)}
    assert "serving on" not in output

    # Every stored response is found on a new connection: no other server took a share.
    ids = [create_stored(server.url, i) for i in range(30)]
    assert [get_json(f"{server.url}/v1/responses/{rid}")[0] for rid in ids] == [200] * 30
    assert get_json(f"{server.url}/readyz")[0] == 200
