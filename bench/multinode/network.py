"""The harness's network, made and unmade with ``ip``: the bridge (its address ``.1`` in the
root namespace), a namespace per node joined to it by a veth pair, loopback up, IPv6 off, and
no route but the bridge's /24 (no default route, no NAT: nothing leaves the bridge).

The faults that act on the network live here too: a link down (the node's veth goes down on
the bridge side: packets are dropped, nobody sends a reset) and a partition (blackhole routes
between a node and the others, in both directions)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from .topology import Node, Topology, foreign_routes, ours

NETNS_DIR = Path("/run/netns")
IP_TIMEOUT_S = 10.0


class NetworkError(RuntimeError):
    pass


def ip(*args: str, namespace: str | None = None, check: bool = True) -> str:
    """Run ``ip ARGS`` (inside ``namespace`` if given); its stdout."""
    cmd = ["ip", *(["-n", namespace] if namespace else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)
    if check and res.returncode != 0:
        raise NetworkError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res.stdout


def in_namespace(namespace: str, *cmd: str) -> list[str]:
    """``cmd`` run inside ``namespace`` (``ip netns exec``)."""
    return ["ip", "netns", "exec", namespace, *cmd]


def links() -> list[str]:
    """Names of the root namespace's interfaces."""
    return [entry["ifname"] for entry in json.loads(ip("-j", "link", "show") or "[]")]


def namespaces() -> list[str]:
    """Names of the named network namespaces (``ip netns list``)."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def sysctl(path: str, value: str, namespace: str | None = None) -> None:
    full = f"/proc/sys/{path}"
    if namespace is None:
        Path(full).write_text(value)
    else:
        subprocess.run(
            in_namespace(namespace, "sh", "-c", f"echo {value} > {full}"),
            check=True,
            timeout=IP_TIMEOUT_S,
            capture_output=True,
        )


def create(topology: Topology) -> None:
    """The bridge, then each node's namespace and veth pair.  The caller removes what was
    made (:func:`destroy`) if this raises half-way."""
    t = topology
    ip("link", "add", t.bridge, "type", "bridge")
    sysctl(f"net/ipv6/conf/{t.bridge}/disable_ipv6", "1")
    ip("addr", "add", f"{t.bridge_address}/{t.network.prefixlen}", "dev", t.bridge)
    ip("link", "set", t.bridge, "up")
    for node in t.nodes:
        ip("netns", "add", node.namespace)
        sysctl("net/ipv6/conf/all/disable_ipv6", "1", node.namespace)
        ip("link", "set", "lo", "up", namespace=node.namespace)
        ip("link", "add", node.host_veth, "type", "veth", "peer", "name", node.peer_veth)
        sysctl(f"net/ipv6/conf/{node.host_veth}/disable_ipv6", "1")
        ip("link", "set", node.host_veth, "master", t.bridge)
        ip("link", "set", node.host_veth, "up")
        ip("link", "set", node.peer_veth, "netns", node.namespace)
        ip("link", "set", node.peer_veth, "name", "eth0", namespace=node.namespace)
        ip("addr", "add", f"{node.address}/{t.network.prefixlen}", "dev", "eth0", namespace=node.namespace)
        ip("link", "set", "eth0", "up", namespace=node.namespace)


def destroy(prefix: str) -> list[str]:
    """Remove every namespace and interface named with ``prefix`` (deleting a namespace
    deletes the veth end inside it, and so its peer); what was removed.  Processes still
    inside a namespace must be ended first (:func:`namespace_pids`)."""
    removed = []
    for ns in namespaces():
        if ours(ns, prefix):
            ip("netns", "delete", ns, check=False)
            removed.append(f"namespace {ns}")
    for link in links():
        if ours(link, prefix):
            ip("link", "delete", link, check=False)
            removed.append(f"interface {link}")
    return removed


def namespace_pids(namespace: str) -> list[int]:
    """Pids of the processes inside ``namespace`` (their ``/proc/PID/ns/net`` is it)."""
    try:
        st = os.stat(NETNS_DIR / namespace)
    except FileNotFoundError:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(entry / "ns" / "net")
        except OSError:
            continue
        if (ns.st_ino, ns.st_dev) == (st.st_ino, st.st_dev):
            pids.append(int(entry.name))
    return pids


def routes(namespace: str) -> list[dict]:
    """Every IPv4 route of every table inside ``namespace``."""
    return json.loads(ip("-j", "-4", "route", "show", "table", "all", namespace=namespace) or "[]")


def check_isolated(topology: Topology) -> None:
    """Raise unless every namespace routes only to the bridge's /24."""
    for node in topology.nodes:
        bad = foreign_routes(routes(node.namespace), topology.subnet)
        if bad:
            raise NetworkError(f"{node.namespace} has routes off the bridge: {bad}")


# ------------------------------------------------------------------ faults


def set_link(node: Node, up: bool) -> None:
    """The node's veth on the bridge side up or down: down drops every packet silently."""
    ip("link", "set", node.host_veth, "up" if up else "down")


def partition(node: Node, others: list[Node]) -> None:
    """Drop traffic between ``node`` and ``others``: blackhole routes on both sides."""
    for other in others:
        ip("route", "add", "blackhole", f"{other.address}/32", namespace=node.namespace)
        ip("route", "add", "blackhole", f"{node.address}/32", namespace=other.namespace)


def heal(node: Node, others: list[Node]) -> None:
    """Undo :func:`partition`."""
    for other in others:
        ip("route", "delete", "blackhole", f"{other.address}/32", namespace=node.namespace, check=False)
        ip("route", "delete", "blackhole", f"{node.address}/32", namespace=other.namespace, check=False)
