"""What the harness builds, as names and addresses (pure): the bridge, one namespace and veth
pair per node, all named with one prefix, on one private /24 that no route leaves."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "rwsmn"  # every interface, namespace and temp dir the harness makes starts with it
SUBNET = "10.213.37.0/24"
IFNAMSIZ = 15  # the kernel's limit on an interface name


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One Ray node: its role (``head``, ``session`` or ``accelerator``) and the custom
    resources ``ray start --resources`` gives it; the head may carry other roles too."""

    role: str
    resources: dict[str, float] = field(default_factory=dict)
    num_cpus: int = 0


@dataclass(frozen=True, slots=True)
class Node:
    """A node as laid out: its name, namespace, address and the veth pair's two ends."""

    name: str
    spec: NodeSpec
    namespace: str
    address: str
    host_veth: str  # on the bridge, in the root namespace
    peer_veth: str  # moved into the namespace and renamed ``eth0`` there


@dataclass(frozen=True, slots=True)
class Topology:
    """The nodes (the first is the head) on ``subnet``: the bridge holds ``.1`` (the
    balancer listens there), node ``i`` holds ``.10+i``."""

    specs: tuple[NodeSpec, ...]
    prefix: str = PREFIX
    subnet: str = SUBNET

    def __post_init__(self) -> None:
        if not self.specs or self.specs[0].role != "head":
            raise ValueError("the first node must be the head")
        if len(self.specs) > 200:
            raise ValueError("at most 200 nodes")
        if len(self.bridge) > IFNAMSIZ or len(f"{self.prefix}-v{len(self.specs)}") > IFNAMSIZ:
            raise ValueError(f"prefix {self.prefix!r} is too long for interface names")
        net = ipaddress.ip_network(self.subnet)
        if net.prefixlen != 24 or not net.is_private:
            raise ValueError(f"subnet {self.subnet} must be a private /24")

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def bridge_address(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def nodes(self) -> list[Node]:
        base = self.network.network_address
        counts: dict[str, int] = {}
        out = []
        for i, spec in enumerate(self.specs):
            counts[spec.role] = counts.get(spec.role, 0) + 1
            name = spec.role if spec.role == "head" else f"{spec.role}{counts[spec.role]}"
            out.append(
                Node(
                    name=name,
                    spec=spec,
                    namespace=f"{self.prefix}-{name}",
                    address=str(base + 10 + i),
                    host_veth=f"{self.prefix}-v{i}",
                    peer_veth=f"{self.prefix}-p{i}",
                )
            )
        return out

    @property
    def head(self) -> Node:
        return self.nodes[0]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r}: {[n.name for n in self.nodes]}")

    def with_role(self, role: str) -> list[Node]:
        """Nodes whose role, or one of whose resources, is ``role``."""
        return [n for n in self.nodes if n.spec.role == role or role in n.spec.resources]


def ours(name: str, prefix: str = PREFIX) -> bool:
    """Whether an interface, namespace or temp dir name was made by a harness of ``prefix``."""
    return name.startswith(f"{prefix}-")


def leftovers(
    links: list[str], namespaces: list[str], temp_dirs: list[Path], prefix: str = PREFIX
) -> list[str]:
    """What a harness of ``prefix`` left behind: its interfaces, namespaces and temp dirs."""
    return (
        [f"interface {n}" for n in links if ours(n, prefix)]
        + [f"namespace {n}" for n in namespaces if ours(n, prefix)]
        + [f"directory {p}" for p in temp_dirs if ours(p.name, prefix)]
    )


def foreign_routes(routes: list[dict], subnet: str) -> list[dict]:
    """The routes of a namespace's tables (``ip -j route show table all``) that lead
    anywhere but ``subnet`` or the namespace itself: a default route, a gateway, another
    network.  Loopback and local/broadcast entries of the namespace's own addresses pass."""
    net = ipaddress.ip_network(subnet)
    bad = []
    for r in routes:
        dst = r.get("dst", "")
        if r.get("type") in ("local", "broadcast") or r.get("dev") == "lo":
            continue
        if dst == "default" or "gateway" in r or "via" in r:
            bad.append(r)
            continue
        if r.get("type") in ("blackhole", "unreachable", "prohibit"):
            continue  # a route that drops: a partition
        try:
            target = ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
        except ValueError:
            bad.append(r)
            continue
        if target.version != 4 or not target.subnet_of(net):
            bad.append(r)
    return bad
