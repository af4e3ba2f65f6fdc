"""The cluster's nodes and their roles, and where the load goes (pure, from ``ray.nodes()``).

A node's roles are the project's custom resources it carries (``ray start --resources``,
the cluster YAMLs' node types): ``session`` (a gateway and its connections),
``accelerator`` (inference replicas), ``client`` (the experiment's load actors), and
``head`` (Ray's head node, whichever resources it has)."""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .deployment import InService
from .errors import SetupError

ROLES = ("head", "session", "accelerator", "client")
HEAD_MARK = "node:__internal_head__"  # the resource Ray gives its head node
CLIENT_RESOURCE = "client"


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    node_ip: str
    roles: tuple[str, ...]
    resources: dict[str, float]
    cpus: float
    metrics_port: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "roles": list(self.roles),
            "resources": self.resources,
            "cpus": self.cpus,
        }


def roles_of(resources: dict[str, float]) -> tuple[str, ...]:
    marks = {"head": HEAD_MARK in resources or "head" in resources}
    marks.update({r: r in resources for r in ROLES[1:]})
    return tuple(r for r in ROLES if marks[r])


def alive_nodes(ray_nodes: Sequence[dict[str, Any]]) -> list[Node]:
    """The live nodes of a ``ray.nodes()`` answer, in address order."""
    out = []
    for n in ray_nodes:
        if not n.get("Alive"):
            continue
        resources = {k: float(v) for k, v in (n.get("Resources") or {}).items() if not k.startswith("node:")}
        full = n.get("Resources") or {}
        out.append(
            Node(
                node_id=n["NodeID"],
                node_ip=n["NodeManagerAddress"],
                roles=roles_of(full),
                resources=resources,
                cpus=float(full.get("CPU", 0.0)),
                metrics_port=n.get("MetricsExportPort") or None,
            )
        )
    return sorted(out, key=lambda x: (x.node_ip, x.node_id))


def with_role(nodes: Sequence[Node], role: str) -> list[Node]:
    return [n for n in nodes if role in n.roles]


def require_client_nodes(nodes: Sequence[Node]) -> list[Node]:
    """The client nodes; SetupError with the load runner's one line when there is none."""
    from ..runner.cluster import no_client_nodes_message

    clients = with_role(nodes, CLIENT_RESOURCE)
    if not clients:
        raise SetupError(no_client_nodes_message(CLIENT_RESOURCE))
    return clients


def url_of(node_ip: str, port: int) -> str:
    return f"http://{node_ip}:{port}"


def host_port(url: str) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if not parsed.hostname:
        raise SetupError(f"--url {url!r} names no host")
    port = parsed.port or (443 if parsed.scheme in ("https", "wss") else 80)
    try:
        ip = socket.gethostbyname(parsed.hostname)
    except OSError:
        raise SetupError(f"--url {url!r}: cannot resolve {parsed.hostname!r}") from None
    return ip, port


def targets(
    in_service: Sequence[InService],
    session_nodes: Sequence[Node],
    port: int,
    url: str | None,
    url_is_balancer: bool,
) -> tuple[str, ...]:
    """Where the load of a step goes: the in-service session nodes' own addresses (each
    given an even share of the loops; one address once when they share it), or the
    balancer the user named.  A ``url`` that is
    neither a session node of this deployment nor declared a balancer is refused."""
    if url is not None and url_is_balancer:
        return (url.rstrip("/"),)
    if url is not None:
        ip, p = host_port(url)
        known = {(n.node_ip, port) for n in session_nodes}
        if (ip, p) not in known:
            names = ", ".join(f"{a}:{b}" for a, b in sorted(known)) or "none"
            raise SetupError(
                f"--url {url} is not one of the cluster's session nodes ({names}); "
                "pass --url-is-balancer if it is a balancer in front of them"
            )
    return tuple(dict.fromkeys(url_of(n.node_ip, port) for n in in_service))


def addresses_distinct(session_nodes: Sequence[Node]) -> bool:
    """Each session node has an address of its own (not raylets on one machine, where the
    gateways share one listening socket and the records' target names no node)."""
    return len({n.node_ip for n in session_nodes}) == len(session_nodes)
