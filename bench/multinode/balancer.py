"""HAProxy in TCP mode (L4) in front of the session nodes, health-checking each one's
``/readyz``, and its runtime API (a Unix socket in the harness's temp dir): which servers
are up, and which server each client connection went to."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class BalancerSettings:
    """The health check (every ``inter_ms``; ``fall`` failures mark a server down, ``rise``
    successes up again) and the timeouts.  ``tunnel_s`` bounds an idle WebSocket (no frame
    either way, pings included), not a connection's lifetime."""

    port: int = 8765
    inter_ms: int = 1000
    fall: int = 2
    rise: int = 2
    balance: str = "leastconn"  # long-lived connections: the fewest open wins
    connect_timeout_ms: int = 2000
    tunnel_s: int = 3600
    client_fin_s: int = 5
    maxconn: int = 8000  # HAProxy needs ~2 descriptors per connection, within the open-file limit


def config(settings: BalancerSettings, listen: str, servers: dict[str, str], socket_path: Path) -> str:
    """haproxy.cfg: listen on ``listen``, balance over ``servers`` (name → address)."""
    s = settings
    lines = [
        "global",
        f"    maxconn {s.maxconn}",
        f"    stats socket {socket_path} mode 600 level admin",
        "    log stdout format raw local0 notice",
        "defaults",
        "    mode tcp",
        "    log global",
        "    option redispatch",  # a connection refused by a dead server is retried on another
        "    retries 3",
        f"    timeout connect {s.connect_timeout_ms}ms",
        f"    timeout client {s.tunnel_s}s",
        f"    timeout server {s.tunnel_s}s",
        f"    timeout tunnel {s.tunnel_s}s",
        f"    timeout client-fin {s.client_fin_s}s",
        f"    timeout check {s.connect_timeout_ms}ms",
        "frontend responses",
        f"    bind {listen}:{s.port}",
        "    default_backend sessions",
        "backend sessions",
        f"    balance {s.balance}",
        "    option httpchk GET /readyz",
        "    http-check expect status 200",
        f"    default-server inter {s.inter_ms}ms fall {s.fall} rise {s.rise}",
    ]
    lines += [f"    server {name} {addr}:{s.port} check" for name, addr in servers.items()]
    return "\n".join(lines) + "\n"


def command(socket_path: Path, line: str, timeout_s: float = 5.0) -> str:
    """One command on HAProxy's runtime API; its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(str(socket_path))
        s.sendall(line.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def server_rows(stat_csv: str) -> list[dict[str, str]]:
    """The rows of the ``sessions`` backend's servers in ``show stat`` (CSV)."""
    lines = [ln for ln in stat_csv.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("# "):
        return []
    header = lines[0][2:].split(",")
    rows = [dict(zip(header, ln.split(","), strict=False)) for ln in lines[1:]]
    return [
        r for r in rows if r.get("pxname") == "sessions" and r.get("svname") not in ("BACKEND", "FRONTEND")
    ]


def server_states(stat_csv: str) -> dict[str, str]:
    """Server name → ``UP``/``DOWN``/… from ``show stat`` (CSV) of the ``sessions`` backend."""
    return {r["svname"]: r.get("status", "") for r in server_rows(stat_csv)}


def session_counts(stat_csv: str) -> dict[str, int]:
    """Server name → connections it has been sent so far (``stot``), from ``show stat``."""
    return {r["svname"]: int(r.get("stot") or 0) for r in server_rows(stat_csv)}


def session_servers(show_sess: str) -> dict[int, str]:
    """Client source port → server name, from ``show sess`` (one line per stream:
    ``0x…: proto=tcpv4 src=A:PORT fe=responses be=sessions srv=NAME …``)."""
    out = {}
    for ln in show_sess.splitlines():
        fields = dict(f.split("=", 1) for f in ln.split() if "=" in f)
        if fields.get("fe") == "responses" and fields.get("srv") not in (None, "<none>") and "src" in fields:
            port = fields["src"].rsplit(":", 1)[-1]
            if port.isdigit():
                out[int(port)] = fields["srv"]
    return out


def sessions_at(socket_path: Path) -> dict[int, str]:
    """:func:`session_servers` of the balancer whose runtime API listens at ``socket_path``
    (a lookup a load's client processes call: bench/runner's ``locate``)."""
    return session_servers(command(socket_path, "show sess"))
