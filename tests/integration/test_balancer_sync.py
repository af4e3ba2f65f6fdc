"""The balancer sync against a real HAProxy (the shipped configs/haproxy-sessions.cfg, its two
edits made): Serve's view of the gateway replicas comes from a stand-in of Serve's REST client
(what ``get_serve_details`` returns), the session nodes are HTTP servers answering /readyz on
loopback addresses.  A node's slot is filled when its replica runs and UP only once its
/readyz answers 200; a stopping replica's slot drains; a gone one's is freed and reused."""

from __future__ import annotations

import http.server
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from bench.multinode import balancer
from bench.multinode.edits import haproxy_config
from serve.balancer_sync import BalancerSync, parse_servers_state
from serve.embedded import free_port

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
NODES = ("127.0.0.2", "127.0.0.3")


class Readyz(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class Serve:
    """What Serve's REST client answers: the Gateway's replicas by node."""

    def __init__(self) -> None:
        self.replicas: list[dict] = []

    def get_serve_details(self) -> dict:
        return {
            "applications": {"responses-ws": {"deployments": {"Gateway": {"replicas": list(self.replicas)}}}}
        }


def wait_for(predicate, timeout_s: float, what) -> None:
    """Until ``predicate()`` holds; the failure says ``what()`` (the state at the deadline)."""
    from tests.support.waiting import TimedOut, wait_until

    try:
        wait_until(predicate, timeout_s, "the balancer's state")
    except TimedOut as exc:
        raise AssertionError(what()) from exc


@pytest.fixture
def nodes():
    """Two session nodes' /readyz on one port, each on its own loopback address."""
    port = free_port()
    handlers = {ip: type(f"Readyz_{ip}", (Readyz,), {"status": 200}) for ip in NODES}
    servers = [http.server.ThreadingHTTPServer((ip, port), handlers[ip]) for ip in NODES]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield port, handlers
    for s in servers:
        s.shutdown()
        s.server_close()


def test_the_sync_fills_drains_and_frees_haproxy_slots(nodes, tmp_path):
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.fail("haproxy is not installed: `make haproxy`", pytrace=False)
    port, handlers = nodes
    sock = tmp_path / "haproxy.sock"
    cfg = tmp_path / "haproxy.cfg"
    text = haproxy_config(
        (CONFIGS / "haproxy-sessions.cfg").read_text(), bind="127.0.0.1", stats_socket=str(sock)
    )
    cfg.write_text(text.replace("bind 127.0.0.1:8765", f"bind 127.0.0.1:{free_port()}"))
    proc = subprocess.Popen(
        [haproxy, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(sock.exists, 10, lambda: "no runtime socket")
        serve = Serve()
        sync = BalancerSync("http://unused", str(sock), port=port, client=serve)  # what Serve would answer

        def table() -> dict[str, tuple[str, str]]:
            placed = parse_servers_state(balancer.command(sock, "show servers state sessions"), "sessions")
            states = balancer.server_states(balancer.command(sock, "show stat"))
            return {s.address: (s.admin, states[s.name]) for s in placed if s.address != "0.0.0.0"}

        assert sync.once() == [] and table() == {}  # no gateway: every slot free
        handlers[NODES[1]].status = 503  # the second node starts unready
        serve.replicas = [{"node_ip": ip, "state": "RUNNING"} for ip in NODES]
        assert len(sync.once()) == 8  # an address, out through drain, DOWN until checked, ready: each
        wait_for(lambda: table().get(NODES[0], ("", ""))[1].startswith("UP"), 10, lambda: str(table()))
        assert table()[NODES[1]][1].startswith("DOWN")  # in the balancer, but no connection until 200
        handlers[NODES[1]].status = 200
        wait_for(lambda: table()[NODES[1]][1].startswith("UP"), 10, lambda: str(table()))
        assert sync.once() == []  # in step: nothing to send

        serve.replicas = [
            {"node_ip": NODES[0], "state": "RUNNING"},
            {"node_ip": NODES[1], "state": "STOPPING"},
        ]
        assert sync.once() == ["set server sessions/s2 state drain"]
        assert table()[NODES[1]] == ("drain", "DRAIN")
        serve.replicas = serve.replicas[:1]
        sync.once()
        assert table()[NODES[1]] == ("maint", "MAINT")  # its slot in maintenance: free
        serve.replicas.append({"node_ip": NODES[1], "state": "RUNNING"})
        assert sync.once()[0] == f"set server sessions/s2 addr {NODES[1]} port {port}"  # the slot reused
        wait_for(lambda: table()[NODES[1]][1].startswith("UP"), 10, lambda: str(table()))
    finally:
        proc.kill()
        proc.wait(timeout=10)
