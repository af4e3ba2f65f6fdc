"""What ``responses-ws status`` looks at (serve/status.py decides what it means): Ray's
dashboard HTTP APIs at ``--address`` (the state API's ``/api/v0/nodes``, Serve's
``/api/serve/applications/``, the ones ``ray list nodes`` and ``serve status`` read; with
Ray's token authentication, its ``Authorization: Bearer`` header from ``RAY_AUTH_TOKEN`` or
``RAY_AUTH_TOKEN_PATH``), each gateway's ``GET /readyz``, each session node's Ray metrics
endpoint (the gateway's ``responses_ws_open_sockets`` gauge) and the store, opened with the
application's own store settings and credential file.  No Ray driver is started: it runs
wherever the dashboard and the nodes are reachable."""

from __future__ import annotations

import asyncio
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import store as store_package
from store import StoreConfig, StoreRefused, open_store

from .config import ServerConfig
from .status import GATEWAY, ROLES, Application, Node, Readiness, Replica, Snapshot, StoreCheck

DEFAULT_PORT = 8765  # the gateway's, when the application's config does not say
DEFAULT_METRICS_PORT = 8080  # the cluster YAMLs' --metrics-export-port
RAY_TOKEN_FILE = "~/.ray/auth_token"  # where `ray get-auth-token` keeps one by default
OPEN_SOCKETS = "ray_responses_ws_open_sockets"
WILDCARDS = ("0.0.0.0", "::", "")


class Unreachable(RuntimeError):
    """The dashboard did not answer (or refused the token): nothing else can be asked."""


def ray_token(environ: Mapping[str, str] = os.environ) -> str | None:
    if environ.get("RAY_AUTH_TOKEN"):
        return environ["RAY_AUTH_TOKEN"].strip()
    path = Path(environ.get("RAY_AUTH_TOKEN_PATH") or RAY_TOKEN_FILE).expanduser()
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def get(url: str, *, timeout_s: float, token: str | None = None) -> tuple[int, bytes]:
    """``GET url``: its status and body (an HTTP error status is an answer too)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def dashboard_json(address: str, path: str, *, timeout_s: float, token: str | None) -> Any:
    url = address.rstrip("/") + path
    try:
        code, body = get(url, timeout_s=timeout_s, token=token)
    except (OSError, ValueError) as exc:
        raise Unreachable(f"Ray's dashboard at {address} did not answer: {exc}") from exc
    if code in (401, 403):
        raise Unreachable(
            f"Ray's dashboard at {address} refused this client ({code}): set RAY_AUTH_TOKEN_PATH to the cluster's token"
        )
    if code != 200:
        raise Unreachable(f"{url}: HTTP {code}: {body[:200].decode(errors='replace')}")
    return json.loads(body)


def nodes(doc: dict[str, Any]) -> tuple[Node, ...]:
    """``/api/v0/nodes`` → the nodes, each with its roles (its custom resources of ROLES)."""
    rows = doc["data"]["result"]["result"]
    return tuple(
        Node(
            node_id=row["node_id"],
            ip=row["node_ip"],
            alive=row["state"] == "ALIVE",
            roles=tuple(r for r in ROLES if (row.get("resources_total") or {}).get(r)),
        )
        for row in rows
    )


def _last_line(text: str | None) -> str:
    """A message's last line (Serve's deploy errors end with the exception)."""
    lines = (text or "").strip().splitlines()
    return lines[-1].strip() if lines else ""


def applications(doc: dict[str, Any]) -> tuple[Application, ...]:
    """``/api/serve/applications/`` → each application, its deployments and their replicas."""
    out = []
    for name, app in sorted((doc.get("applications") or {}).items()):
        deployments = app.get("deployments") or {}
        out.append(
            Application(
                name=name,
                status=app.get("status", "UNKNOWN"),
                message=_last_line(app.get("message")),
                deployments={d: info.get("status", "UNKNOWN") for d, info in deployments.items()},
                replicas=tuple(
                    Replica(d, rep.get("state", "UNKNOWN"), rep.get("node_id"), rep.get("node_ip"))
                    for d, info in deployments.items()
                    for rep in info.get("replicas") or []
                ),
            )
        )
    return tuple(out)


def deployed_args(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """The ``args`` an application was deployed with (``serve deploy``), or ``{}``."""
    app = (doc.get("applications") or {}).get(name) or {}
    return ((app.get("deployed_app_config") or {}).get("args")) or {}


def readiness(node_ip: str, port: int, timeout_s: float, listen: str = "0.0.0.0") -> Readiness:
    """``GET /readyz`` of the gateway on ``node_ip``: at that address when the gateway listens
    on every interface (``server.host`` 0.0.0.0, the cluster config), else at the address it
    listens on (a loopback one: asked from its own node)."""
    host = node_ip if listen in WILDCARDS else listen
    url = f"http://{host}:{port}/readyz"
    try:
        code, body = get(url, timeout_s=timeout_s)
    except (OSError, ValueError) as exc:
        return Readiness(node_ip, url, None, error=f"{type(exc).__name__}: {exc}")
    try:
        checks = json.loads(body).get("checks") or {}
    except (ValueError, AttributeError):
        checks = {}
    return Readiness(node_ip, url, code, {str(k): str(v) for k, v in checks.items()})


def open_sockets(metrics_text: str) -> int:
    """The gateway's open WebSockets on a node, from its Prometheus text (the sum of its series)."""
    total = 0.0
    for line in metrics_text.splitlines():
        m = re.match(rf"^{OPEN_SOCKETS}(?:\{{[^}}]*\}})?\s+(\S+)", line)
        if m:
            total += float(m.group(1))
    return int(total)


def connections(node_ip: str, metrics_port: int, timeout_s: float) -> int | None:
    try:
        code, body = get(f"http://{node_ip}:{metrics_port}/metrics", timeout_s=timeout_s)
    except (OSError, ValueError):
        return None
    if code != 200 or OPEN_SOCKETS.encode() not in body:
        return None
    return open_sockets(body.decode(errors="replace"))


def _target(config: StoreConfig) -> str:
    if config.backend != "redis":
        return f"sqlite ({config.data_dir} on each node)"
    return re.sub(r"//[^@/]*@", "//", config.redis_url)  # never a password in the output


async def _check_store(config: StoreConfig, timeout_s: float) -> StoreCheck:
    target = _target(config)
    if config.backend != "redis":
        return StoreCheck(target, False, False, "each node's own file: its gateway's /readyz checks it")
    try:
        store = open_store(config)
    except StoreRefused as exc:  # the credential file is not readable here
        return StoreCheck(target, False, False, f"{exc} (give --redis-password-file)")
    try:
        async with asyncio.timeout(timeout_s):
            await store.probe()
            replication = getattr(store_package, "replication_status", None)  # where the store has one
            status = await replication(config) if replication is not None else None
    except StoreRefused as exc:
        return StoreCheck(target, True, False, str(exc), refused=True)
    except TimeoutError:
        return StoreCheck(target, True, False, f"no answer within {timeout_s:g} s")
    except Exception as exc:  # noqa: BLE001 - any failure to reach it is the finding, named
        return StoreCheck(target, True, False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    finally:
        try:
            await store.close()
        except Exception:  # noqa: BLE001, S110 - closing a client that never connected
            pass
    return StoreCheck(
        target, True, True, "a probe write succeeded", replication=status.as_dict() if status else None
    )


def check_store(config: StoreConfig, timeout_s: float) -> StoreCheck:
    return asyncio.run(_check_store(config, timeout_s))


def snapshot(
    address: str,
    *,
    port: int | None = None,
    metrics_port: int = DEFAULT_METRICS_PORT,
    store_config: dict[str, Any] | None = None,
    server_config: dict[str, Any] | None = None,
    password_file: str | None = None,
    timeout_s: float = 5.0,
    environ: Mapping[str, str] = os.environ,
) -> Snapshot:
    """Everything ``responses-ws status`` reports, read now.  ``port``, ``store_config`` and
    ``server_config`` (a ``store`` and a ``server`` section) stand in where the application's
    deployed config does not say (an application deployed from Python rather than ``serve
    deploy``)."""
    token = ray_token(environ)
    node_doc = dashboard_json(
        address, "/api/v0/nodes?limit=10000&detail=false", timeout_s=timeout_s, token=token
    )
    serve_doc = dashboard_json(address, "/api/serve/applications/", timeout_s=timeout_s, token=token)
    apps = applications(serve_doc)
    responses = [a for a in apps if a.serves_responses]
    args = deployed_args(serve_doc, responses[0].name) if responses else {}
    server = dict(server_config or args.get("server") or {})
    gateway_port = port or server.get("port") or DEFAULT_PORT
    listen = server.get("host", ServerConfig().host)
    session_ips = sorted(
        {
            r.node_ip
            for a in responses
            for r in a.replicas
            if r.deployment == GATEWAY and r.node_ip and r.state == "RUNNING"
        }
    )
    with ThreadPoolExecutor(max_workers=8) as pool:
        ready = list(pool.map(lambda ip: readiness(ip, int(gateway_port), timeout_s, listen), session_ips))
        counts = list(pool.map(lambda ip: connections(ip, metrics_port, timeout_s), session_ips))
    section = dict(store_config if store_config is not None else args.get("store") or {})
    if password_file is not None:
        section["redis_password_file"] = password_file
    try:
        config = StoreConfig.model_validate(section)
    except ValueError as exc:
        store = StoreCheck("store", False, False, f"its settings are not valid here: {exc}")
    else:
        if not section:
            store = StoreCheck(
                "store", False, False, "the application's store settings are unknown here (give --config)"
            )
        else:
            store = check_store(config, timeout_s)
    return Snapshot(
        address=address,
        nodes=nodes(node_doc),
        applications=apps,
        readiness=tuple(ready),
        store=store,
        connections=dict(zip(session_ips, counts, strict=True)),
    )
