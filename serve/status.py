"""``responses-ws status``: is the cluster healthy, and if not, why (docs/operations.md,
"Is the cluster healthy?").  This module is the pure part: what was seen
(:class:`Snapshot`, gathered by serve/status_probe.py from Ray's dashboard, each session
node and the store), what it means (:func:`findings`, each rule a row of a table) and how it
is shown (:func:`render`, :func:`as_json`, :func:`one_line`).  No I/O here.

A finding is an ``error`` (the cluster is unhealthy: exit status 1), a ``warning`` (it
serves, but something is passing through a state an operator may want to know of: a node
draining, a deployment updating, a store shard without its replica) or ``info``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Level = Literal["error", "warning", "info"]
ROLES = ("head", "session", "accelerator", "client")  # the cluster YAMLs' custom resources
GATEWAY = "Gateway"  # the deployment that marks a responses-ws application and its session nodes
HEALTHY, UNHEALTHY = 0, 1  # exit statuses (2: the cluster could not be asked at all)

# Serve's application, deployment and replica states → the level of a finding (None: fine).
APPLICATION_STATUS: dict[str, Level | None] = {
    "RUNNING": None,
    "DEPLOYING": "warning",
    "DELETING": "warning",
    "NOT_STARTED": "error",
    "DEPLOY_FAILED": "error",
    "UNHEALTHY": "error",
}
DEPLOYMENT_STATUS: dict[str, Level | None] = {
    "HEALTHY": None,
    "UPSCALING": "info",  # a replica added: on a cluster, perhaps waiting for a node to launch
    "DOWNSCALING": "info",
    "UPDATING": "warning",
    "UNHEALTHY": "error",
    "DEPLOY_FAILED": "error",
}
REPLICA_STATE: dict[str, Level | None] = {
    "RUNNING": None,
    "STARTING": "info",
    "PENDING_MIGRATION": "info",
    "STOPPING": "info",  # a gateway draining its node, a scale-down
    "RECOVERING": "warning",
}
UNKNOWN_STATE: Level = "warning"  # a state this table does not name


@dataclass(frozen=True)
class Node:
    node_id: str
    ip: str
    alive: bool
    roles: tuple[str, ...]  # of ROLES, by the node's custom resources; () on an untyped node


@dataclass(frozen=True)
class Replica:
    deployment: str
    state: str
    node_id: str | None
    node_ip: str | None


@dataclass(frozen=True)
class Application:
    name: str
    status: str
    message: str
    deployments: dict[str, str]  # name → Serve's status
    replicas: tuple[Replica, ...]

    @property
    def serves_responses(self) -> bool:
        return GATEWAY in self.deployments


@dataclass(frozen=True)
class Readiness:
    """One session node's ``GET /readyz``: its status code and checks, or why it did not answer."""

    node_ip: str
    url: str
    code: int | None
    checks: dict[str, str] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class StoreCheck:
    """The store as this command reached it, with the application's credential."""

    target: str  # its URL (no credential) or where it lives
    checked: bool  # False: not reached from here (why: ``detail``)
    ok: bool
    detail: str
    refused: bool = False  # it answered and refused the credential
    replication: dict[str, Any] | None = None  # store.replication_status(...).as_dict(), where there is one


@dataclass(frozen=True)
class Snapshot:
    address: str
    nodes: tuple[Node, ...]
    applications: tuple[Application, ...]
    readiness: tuple[Readiness, ...]
    store: StoreCheck
    connections: dict[str, int | None]  # session node ip → open WebSockets (None: not exported)


@dataclass(frozen=True)
class Finding:
    level: Level
    subject: str
    reason: str

    def line(self) -> str:
        return f"{self.subject}: {self.reason}"


def _level(table: dict[str, Level | None], state: str) -> Level | None:
    return table.get(state, UNKNOWN_STATE)


def _readiness(r: Readiness) -> Finding | None:
    if r.code is None:
        return Finding("error", f"session node {r.node_ip}", f"/readyz did not answer: {r.error}")
    if r.code == 200:
        return None
    failed = {name: why for name, why in r.checks.items() if why != "ok"}
    if set(failed) == {"draining"}:  # a drain (scale-down, maintenance): the balancer takes it out
        return Finding("warning", f"session node {r.node_ip}", failed["draining"])
    reasons = "; ".join(f"{name}: {why}" for name, why in failed.items()) or r.error or "no checks reported"
    return Finding("error", f"session node {r.node_ip}", f"/readyz {r.code}: {reasons}")


def _store(s: StoreCheck) -> list[Finding]:
    subject = f"store {s.target}"
    if not s.checked:
        return [Finding("info", subject, s.detail)]
    if s.refused:
        return [Finding("error", subject, f"refused the application's credential: {s.detail}")]
    if not s.ok:
        return [Finding("error", subject, f"unreachable: {s.detail}")]
    out = []
    strict = (s.replication or {}).get("policy") == "strict"
    for shard in (s.replication or {}).get("shards", []):
        level, reason = _shard(shard, strict)
        if level:
            out.append(Finding(level, subject, f"shard {shard.get('primary')} {reason}"))
    return out


def _shard(shard: dict[str, Any], strict: bool) -> tuple[Level | None, str]:
    """A store shard's replication (store.replication_status): unreachable, degraded (fewer
    online replicas than wanted: its writes go on unreplicated, or are refused under the
    strict policy, as Redis's min-replicas-to-write would) or fine."""
    if shard.get("reachable") is False:
        return "error", "did not answer (no primary: its writes fail until a replica is promoted)"
    if not shard.get("degraded"):
        return None, ""
    have = f"{shard.get('replicas')} of {shard.get('wanted')} replicas online"
    if strict:
        return "error", f"degraded: {have}; its writes are refused (wait_replicas_policy strict)"
    return "warning", f"degraded: {have}; its writes are not replicated"


def findings(snap: Snapshot) -> list[Finding]:
    """Everything worth saying about ``snap``, errors first."""
    out: list[Finding] = []
    apps = [a for a in snap.applications if a.serves_responses]
    if not apps:
        out.append(Finding("error", "serve", "no application with a Gateway deployment (serve deploy it)"))
    for app in snap.applications:
        level = _level(APPLICATION_STATUS, app.status)
        if level:
            out.append(Finding(level, f"application {app.name}", f"{app.status} {app.message}".strip()))
        for name, status in app.deployments.items():
            level = _level(DEPLOYMENT_STATUS, status)
            if level:
                out.append(Finding(level, f"deployment {app.name}/{name}", status))
        for rep in app.replicas:
            level = _level(REPLICA_STATE, rep.state)
            if level:
                where = rep.node_ip or "no node yet"
                out.append(Finding(level, f"replica {app.name}/{rep.deployment} on {where}", rep.state))
        if app.serves_responses and not any(
            r.deployment == GATEWAY and r.state == "RUNNING" for r in app.replicas
        ):
            out.append(Finding("error", f"application {app.name}", "no gateway replica is running"))
    for node in snap.nodes:
        if not node.alive and node.roles:  # Ray lists a removed node as dead for a while
            out.append(Finding("info", f"{'/'.join(node.roles)} node {node.ip}", "dead"))
    out += [f for f in map(_readiness, snap.readiness) if f is not None]
    out += _store(snap.store)
    for ip, count in snap.connections.items():
        if count is None:
            out.append(Finding("info", f"session node {ip}", "open connections not exported (metrics port)"))
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(out, key=lambda f: order[f.level])


def exit_status(found: list[Finding]) -> int:
    return UNHEALTHY if any(f.level == "error" for f in found) else HEALTHY


def one_line(found: list[Finding]) -> str:
    """The verdict and its reasons, on one line (stderr of an unhealthy run)."""
    errors = [f.line() for f in found if f.level == "error"]
    return "unhealthy: " + "; ".join(errors) if errors else "healthy"


def replicas_by_node(app: Application) -> dict[str, dict[str, int]]:
    """Deployment → node ip → its running replicas there."""
    out: dict[str, Counter[str]] = {}
    for rep in app.replicas:
        if rep.state == "RUNNING":
            out.setdefault(rep.deployment, Counter())[rep.node_ip or "?"] += 1
    return {name: dict(sorted(c.items())) for name, c in sorted(out.items())}


def as_json(snap: Snapshot, found: list[Finding]) -> dict[str, Any]:
    doc = asdict(snap)
    doc["replicas_by_node"] = {a.name: replicas_by_node(a) for a in snap.applications}
    doc["findings"] = [asdict(f) for f in found]
    doc["healthy"] = exit_status(found) == HEALTHY
    doc["verdict"] = one_line(found)
    return doc


def render(snap: Snapshot, found: list[Finding]) -> str:
    ready = {r.node_ip: r for r in snap.readiness}
    lines = [f"cluster {snap.address}: {one_line(found)}", "nodes:"]
    for node in sorted(snap.nodes, key=lambda n: (not n.alive, n.roles, n.ip)):
        role = "/".join(node.roles) or "-"
        extra = ""
        if node.ip in ready:
            r = ready[node.ip]
            extra += f"  /readyz {r.code if r.code is not None else 'no answer'}"
        if node.ip in snap.connections:
            count = snap.connections[node.ip]
            extra += f"  connections {count if count is not None else '?'}"
        state = "ALIVE" if node.alive else "DEAD"
        lines.append(f"  {role:<12} {node.ip:<15} {state:<5} {node.node_id[:12]}{extra}")
    lines.append("applications:")
    for app in snap.applications:
        lines.append(f"  {app.name}  {app.status}")
        placed = replicas_by_node(app)
        for name, status in sorted(app.deployments.items()):
            where = ", ".join(f"{ip} x{n}" if n > 1 else ip for ip, n in placed.get(name, {}).items())
            lines.append(f"    {name} ({status}): {where or 'no running replica'}")
    store = snap.store
    verdict = (
        "not checked from here"
        if not store.checked
        else "refused"
        if store.refused
        else "reachable with its credential"
        if store.ok
        else "unreachable"
    )
    lines.append(f"store: {store.target}: {verdict} ({store.detail})")
    if found:
        lines.append("findings:")
        lines += [f"  {f.level:<8} {f.line()}" for f in found]
    return "\n".join(lines)
