"""The balancer follows the session tier: HAProxy's server list kept equal to the nodes that run
a gateway replica, through HAProxy's runtime API (docs/deploy.md, "The balancer follows the
session tier").

    python -m serve.balancer_sync --address http://HEAD:8265 --socket /run/haproxy-responses-ws.sock

The shipped configs/haproxy-sessions*.cfg declare empty slots
(``server-template s 1-16 0.0.0.0:8765 check disabled``); every ``--interval`` seconds this
reads the gateway's replicas from Serve (the dashboard's REST API, as ``serve status`` does)
and:

| a node's gateway replica       | its slot                                        |
|--------------------------------|-------------------------------------------------|
| RUNNING                        | ``addr`` set, out of maintenance DOWN: UP once its /readyz passes ``rise`` checks |
| STOPPING / PENDING_MIGRATION   | ``state drain``: no new connection, open ones go on |
| gone (or never there)          | ``state maint``: the slot is free again          |

A node gets connections once HAProxy's check sees its ``/readyz`` answer 200; a draining node
answers 503 (the gateway's drain), so it gets none even before Serve marks its replica
stopping.  The decisions are :func:`plan` (pure); the rest reads Serve and talks to HAProxy.
"""

from __future__ import annotations

import argparse
import enum
import logging
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("responses_ws.balancer_sync")

FREE_ADDRESS = "0.0.0.0"
# HAProxy's server admin-state flags (``show servers state``'s srv_admin_state): its
# SRV_ADMF_MAINT mask (forced, inherited, resolution) and SRV_ADMF_DRAIN (forced, inherited).
# A template's ``disabled`` leaves 0x04 (CMAINT) set after ``state ready``: not maintenance.
MAINT_FLAGS = 0x01 | 0x02 | 0x20
DRAIN_FLAGS = 0x08 | 0x10


class Want(enum.Enum):
    READY = "ready"
    DRAIN = "drain"


# Serve's replica states → what the node's slot should be; any other state: not yet.
REPLICA_STATES: dict[str, Want] = {
    "RUNNING": Want.READY,
    "STOPPING": Want.DRAIN,
    "PENDING_MIGRATION": Want.DRAIN,
}


@dataclass(frozen=True, slots=True)
class Slot:
    """One ``server`` of the backend as HAProxy reports it."""

    name: str
    address: str
    port: int
    admin: str  # "ready" | "drain" | "maint"


class SyncError(RuntimeError):
    pass


def wanted_nodes(replicas: Iterable[Mapping[str, Any]]) -> dict[str, Want]:
    """Node address → what its slot should be, from the gateway's replicas (Serve's
    ``node_ip`` and ``state``): ready if any replica there runs, else drain if one stops."""
    out: dict[str, Want] = {}
    for r in replicas:
        want = REPLICA_STATES.get(str(r.get("state")))
        ip = r.get("node_ip")
        if want is None or not ip:
            continue
        if out.get(ip) is not Want.READY:
            out[ip] = want
    return out


def plan(
    backend: str, slots: list[Slot], wanted: Mapping[str, Want], port: int
) -> tuple[list[str], list[str]]:
    """The runtime-API commands that make ``slots`` match ``wanted``, and the nodes left
    without a slot (more session nodes than the template declares)."""
    commands: list[str] = []
    placed = {s.address: s for s in slots if s.admin != "maint" and s.address != FREE_ADDRESS}
    for s in placed.values():
        want = wanted.get(s.address)
        if want is None:
            commands.append(f"set server {backend}/{s.name} state maint")
        elif want.value != s.admin:
            commands.append(f"set server {backend}/{s.name} state {want.value}")
    free = [s for s in slots if s.admin == "maint" or s.address == FREE_ADDRESS]
    free += [s for s in placed.values() if s.address not in wanted]  # freed just above
    unplaced = []
    for address, want in sorted(wanted.items()):
        if address in placed or want is not Want.READY:
            continue  # a node drained before it had a slot gets none
        if not free:
            unplaced.append(address)
            continue
        s = free.pop(0)
        # Out of maintenance HAProxy 2.6 starts a server UP until `fall` checks fail, and a
        # `health down` in maintenance does not stick: out through `drain` (no new
        # connections), then DOWN, then ready — UP only after `rise` checks of its /readyz pass.
        for step in (f"addr {address} port {port}", "state drain", "health down", "state ready"):
            commands.append(f"set server {backend}/{s.name} {step}")
    return commands, unplaced


def parse_servers_state(text: str, backend: str) -> list[Slot]:
    """``show servers state <backend>`` → its slots."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and lines[0].strip().isdigit():  # the format's version line
        lines = lines[1:]
    header = next((ln for ln in lines if ln.startswith("#")), None)
    if header is None:
        raise SyncError(f"HAProxy: no servers state for backend {backend!r}: {text.strip()[:200]}")
    cols = header.lstrip("# ").split()
    slots = []
    for ln in lines:
        if ln.startswith("#"):
            continue
        row = dict(zip(cols, ln.split(), strict=False))
        if row.get("be_name") != backend:
            continue
        flags = int(row["srv_admin_state"])
        admin = "maint" if flags & MAINT_FLAGS else "drain" if flags & DRAIN_FLAGS else "ready"
        slots.append(Slot(row["srv_name"], row["srv_addr"], int(row["srv_port"]), admin))
    if not slots:
        raise SyncError(f"HAProxy: backend {backend!r} has no servers (a server-template line)")
    return slots


def command(socket_path: str, line: str, timeout_s: float = 5.0) -> str:
    """One command on HAProxy's runtime API (a Unix socket, ``level admin``); its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(socket_path)
        s.sendall(line.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def serve_client(address: str) -> Any:
    """Serve's REST client (``serve status``'s; a token-auth cluster's token is read as the
    Ray CLI reads it: RAY_AUTH_TOKEN_PATH)."""
    from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

    return ServeSubmissionClient(address)


def gateway_replicas(client: Any, app: str, deployment: str) -> list[dict[str, Any]]:
    """The gateway deployment's replicas (each with its ``node_ip`` and ``state``)."""
    details = client.get_serve_details()
    application = (details.get("applications") or {}).get(app)
    if application is None:
        return []
    return list((application.get("deployments") or {}).get(deployment, {}).get("replicas") or [])


@dataclass
class BalancerSync:
    address: str
    socket_path: str
    backend: str = "sessions"
    app: str = "responses-ws"
    deployment: str = "Gateway"
    port: int = 8765
    client: Any = None  # Serve's REST client (what answers ``get_serve_details``); None: one for ``address``

    def once(self) -> list[str]:
        """One round: read, plan, apply; the commands sent."""
        if self.client is None:
            self.client = serve_client(self.address)
        wanted = wanted_nodes(gateway_replicas(self.client, self.app, self.deployment))
        slots = parse_servers_state(
            command(self.socket_path, f"show servers state {self.backend}"), self.backend
        )
        commands, unplaced = plan(self.backend, slots, wanted, self.port)
        for line in commands:
            answer = command(self.socket_path, line).strip()
            if answer and not answer.startswith(("IP changed", "no need to change")):
                raise SyncError(f"HAProxy refused {line!r}: {answer}")
            log.info("%s", line)
        if unplaced:
            log.error(
                "%d session node(s) have no balancer slot (%s): raise the server-template count in the HAProxy config",
                len(unplaced),
                ", ".join(unplaced),
            )
        return commands

    def run(self, interval_s: float) -> None:
        failing = False
        while True:
            try:
                self.once()
                failing = False
            except Exception as exc:  # noqa: BLE001 - a round that fails is retried; said once
                if not failing:
                    log.warning("balancer sync: %s", exc)
                failing = True
            time.sleep(interval_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m serve.balancer_sync", description=__doc__.split("\n\n")[0])
    p.add_argument("--address", required=True, help="the dashboard, as for `serve status`: http://HEAD:8265")
    p.add_argument(
        "--socket", required=True, help="HAProxy's runtime API socket (stats socket … level admin)"
    )
    p.add_argument("--backend", default="sessions")
    p.add_argument("--app", default="responses-ws", help="the Serve application")
    p.add_argument("--port", type=int, default=8765, help="the session nodes' port (server.port)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between rounds")
    p.add_argument("--once", action="store_true", help="one round, then exit (non-zero on failure)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sync = BalancerSync(args.address, args.socket, args.backend, args.app, port=args.port)
    if args.once:
        try:
            sync.once()
        except Exception as exc:  # noqa: BLE001 - one clear line
            print(f"balancer sync: {exc}", file=sys.stderr)
            return 1
        return 0
    sync.run(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
