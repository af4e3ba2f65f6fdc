"""The deployment under test, through Serve's REST API on the head's dashboard (what
``serve deploy`` and ``serve status`` use): the config in force, the session nodes in
service (those with a RUNNING gateway replica) and the change of their number.

The number of session nodes in service is the gateway's replica count: one gateway per
session node (``gateway_resources: {session: 1}``, ``gateway_max_replicas_per_node: 1``,
configs/serve-cluster.yaml) and a session node takes connections only while its gateway
runs.  The experiment pins that count for a step by deploying the config in force again
with an override for the ``Gateway`` deployment — ``num_replicas: k``, or, when the gateway
autoscales, ``autoscaling_config`` with ``min_replicas = max_replicas = k`` — a lightweight
update that starts or stops gateways without restarting the others.  :meth:`Deployment.restore`
deploys the config found at the start again, unchanged."""

from __future__ import annotations

import copy
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import SetupError

PATH = "/api/serve/applications/"
GATEWAY = "Gateway"
DEFAULT_PORT = 8765  # serve/config.py ServerConfig.port


@dataclass(frozen=True, slots=True)
class InService:
    node_id: str
    node_ip: str


def gateway_app(details: dict[str, Any]) -> str:
    """The application that has a ``Gateway`` deployment (the project's app)."""
    for name, app in (details.get("applications") or {}).items():
        if GATEWAY in (app.get("deployments") or {}):
            return name
    raise SetupError(
        "no responses-ws application runs on the cluster (no Serve app with a Gateway deployment)"
    )


def app_config(details: dict[str, Any], app: str) -> dict[str, Any]:
    config = details["applications"][app].get("deployed_app_config")
    if not config:
        raise SetupError(
            f"the Serve app {app!r} was not deployed from a config file (serve deploy); "
            "deploy configs/serve-cluster.yaml so that the experiment can change its gateways"
        )
    return dict(config)


def deploy_body(details: dict[str, Any]) -> dict[str, Any]:
    """The ``PUT`` body that deploys the applications in force as they are."""
    body: dict[str, Any] = {
        "applications": [
            app["deployed_app_config"]
            for app in details.get("applications", {}).values()
            if app.get("deployed_app_config")
        ]
    }
    for key in ("proxy_location", "http_options", "grpc_options", "target_capacity"):
        if details.get(key) is not None:
            body[key] = details[key]
    return body


def gateway_autoscaling(details: dict[str, Any], app: str) -> dict[str, Any] | None:
    """The gateway's autoscaling config in force (None: a fixed replica count)."""
    dep = details["applications"][app]["deployments"][GATEWAY]
    auto = (dep.get("deployment_config") or {}).get("autoscaling_config")
    return {k: v for k, v in auto.items() if not k.startswith("_")} if auto else None


def pinned(body: dict[str, Any], app: str, k: int, autoscaling: dict[str, Any] | None) -> dict[str, Any]:
    """``body`` with the gateway of ``app`` pinned to ``k`` replicas: ``num_replicas``, or
    the autoscaling config in force with ``min = max = initial = k``."""
    out = copy.deepcopy(body)
    for config in out["applications"]:
        if config.get("name", "default") != app:
            continue
        overrides = config.setdefault("deployments", [])
        entry = next((d for d in overrides if d.get("name") == GATEWAY), None)
        if entry is None:
            entry = {"name": GATEWAY}
            overrides.append(entry)
        if autoscaling is not None:
            entry.pop("num_replicas", None)
            auto = dict(autoscaling)
            auto.update({"min_replicas": k, "max_replicas": k, "initial_replicas": k})
            entry["autoscaling_config"] = auto
        else:
            entry.pop("autoscaling_config", None)
            entry["num_replicas"] = k
    return out


def server_port(config: dict[str, Any]) -> int:
    return int(((config.get("args") or {}).get("server") or {}).get("port") or DEFAULT_PORT)


def store_settings(config: dict[str, Any]) -> dict[str, Any]:
    return dict((config.get("args") or {}).get("store") or {})


def running_gateways(details: dict[str, Any], app: str) -> tuple[list[InService], int, str]:
    """The gateway replicas RUNNING (their nodes), how many replicas are live in all, and
    the deployment's status."""
    dep = details["applications"][app]["deployments"][GATEWAY]
    replicas = dep.get("replicas") or []
    running = [
        InService(r["node_id"], r["node_ip"])
        for r in replicas
        if r.get("state") == "RUNNING" and r.get("node_id") and r.get("node_ip")
    ]
    return sorted(running, key=lambda n: n.node_ip), len(replicas), str(dep.get("status"))


class ServeRest:
    """``GET``/``PUT`` of Serve's config on the dashboard at ``base`` (``http://HOST:PORT``)."""

    def __init__(self, base: str, timeout_s: float = 30.0) -> None:
        self.base = base.rstrip("/")
        self.timeout_s = timeout_s
        token = os.environ.get("RAY_AUTH_TOKEN")
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def _request(self, method: str, body: dict[str, Any] | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + PATH, data=data, method=method, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return bytes(resp.read())
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")[:300]
            raise RuntimeError(f"Serve REST API {method} {self.base}{PATH}: {exc.code} {text}") from None
        except OSError as exc:
            raise SetupError(f"no Ray dashboard (Serve's REST API) answers at {self.base}: {exc}") from None

    def details(self) -> dict[str, Any]:
        return dict(json.loads(self._request("GET")))

    def deploy(self, body: dict[str, Any]) -> None:
        self._request("PUT", body)


class Deployment:
    """The deployment as found at the start, and the pinning of its gateway count."""

    def __init__(
        self,
        rest: ServeRest,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rest = rest
        self.clock = clock
        self.sleep = sleep
        details = rest.details()
        self.app = gateway_app(details)
        self.config = app_config(details, self.app)
        self.original = deploy_body(details)
        self.autoscaling = gateway_autoscaling(details, self.app)
        self.port = server_port(self.config)
        self.changed = False

    def in_service(self) -> list[InService]:
        return running_gateways(self.rest.details(), self.app)[0]

    def settled(self, timeout_s: float) -> list[InService]:
        """The session nodes in service once no gateway is starting or stopping (every live
        replica RUNNING, the deployment HEALTHY).  A gateway that Serve is stopping (a
        redeploy's, a previous run's restore) refuses new connections with 503 while it
        drains, and on a machine whose nodes share one address it still takes its share of
        them: a sweep begun before that is over measures the change, not the step.
        :class:`SetupError` when it does not settle within ``timeout_s``."""
        try:
            return self.wait_for(None, timeout_s)
        except RuntimeError as exc:
            raise SetupError(f"the deployment is changing: {exc}; run again once it has settled") from None

    def pin(self, k: int, timeout_s: float = 180.0) -> list[InService]:
        """Deploy with ``k`` gateways and wait until exactly ``k`` run and no other is live."""
        self.changed = True
        self.rest.deploy(pinned(self.original, self.app, k, self.autoscaling))
        return self.wait_for(k, timeout_s)

    def wait_for(self, k: int | None, timeout_s: float) -> list[InService]:
        """Until exactly ``k`` gateways run (``None``: any number, at least one) and no other
        replica is live, the deployment HEALTHY."""
        deadline = self.clock() + timeout_s
        while True:
            running, live, status = running_gateways(self.rest.details(), self.app)
            if (
                len(running) == live
                and (len(running) == k if k is not None else live > 0)
                and status == "HEALTHY"
            ):
                return running
            if self.clock() > deadline:
                wanted = "" if k is None else f" at {k} replicas"
                raise RuntimeError(
                    f"the gateway did not settle{wanted} in {timeout_s:.0f}s "
                    f"({len(running)} running, {live} live, {status})"
                )
            self.sleep(0.5)

    def restore(self) -> None:
        """Deploy the config found at the start again (no wait: Serve applies it)."""
        if self.changed:
            self.rest.deploy(self.original)
            self.changed = False
