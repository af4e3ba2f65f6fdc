"""The app on a Ray this process starts (or joins): ``responses-ws serve``, the benchmarks
and the test suite start and stop servers only through here.

- :func:`embedded_server` — ``with embedded_server(config) as url:`` starts Ray (unless this
  process is already connected) and the app, yields the base URL, and stops what it
  started: the app always, Ray if it was started here.  A cluster it joined
  (``address``) keeps running, and so does its Serve instance: only the app is deleted.
- :func:`embedded_ray` — Ray alone, for a caller that deploys several apps in turn
  (:func:`deploy` them, or nest :func:`embedded_server`).
- :func:`local_config` — the app's config on a free local port (:func:`free_port`).

Ray is imported inside the functions only: :data:`RAY_ENV` has to be in the environment
before ``ray.serve`` is first imported and before Ray starts (:func:`apply_ray_env`), and
:data:`LOOPBACK_ENV` before ``ray`` is (a Ray started here listens on loopback only).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.logs import LogSettings

from . import ray_options
from .config import AppConfig, load_app_config
from .log_settings import ray_logging_config, serve_logging_config

log = logging.getLogger(__name__)

APP_NAME = "responses-ws"

# Ray's settings from the environment (Serve's throughput mode, a development node's idle
# settings, loopback only) live in serve/ray_options.py, pinned to the Ray they were read against.
RAY_ENV = ray_options.RAY_ENV
DEV_NODE_ENV = ray_options.DEV_NODE_ENV
LOOPBACK_ENV = ray_options.LOOPBACK_ENV


def apply_ray_env(dev_node: bool = False) -> None:
    """Put :data:`RAY_ENV` (and :data:`DEV_NODE_ENV` for a ``dev_node``) in this process's
    environment (values already set win); Ray processes started afterwards inherit it."""
    ray_options.apply(dev_node=dev_node)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_config(path: Path | None = None, **overrides: Any) -> AppConfig:
    """:func:`serve.config.load_app_config` with ``server.port`` set to a free port."""
    return load_app_config(path, **{"server.port": free_port(), **overrides})


@dataclass(frozen=True, slots=True)
class Dashboard:
    """Ray's dashboard for a Ray started here (``include_dashboard``)."""

    port: int = 8265
    host: str = "127.0.0.1"


@contextmanager
def embedded_ray(
    address: str | None = None,
    *,
    object_store_mb: int = 256,
    num_cpus: int | None = None,
    logs: LogSettings | None = None,
    dashboard: Dashboard | None = None,
    metrics_port: int | None = None,
    network: bool = False,
    dev_node: bool = False,
    resources: dict[str, float] | None = None,
) -> Iterator[None]:
    """Join ``address``, or start a single-node Ray sized for a small machine, unless this
    process is already connected to a Ray (then nothing is started, nor stopped).

    A Ray started here listens on loopback only (:data:`LOOPBACK_ENV`), unless ``network``:
    then on the machine's address and all interfaces, as Ray does by default.  (Only if this
    process had not imported ``ray`` yet; otherwise a warning says where it listens.)

    ``logs``: forward the logs of the job's workers (Serve's controller and replicas
    started from here, the session hosts) to this process's terminal, filtered and encoded
    as it says (Ray's job ``LoggingConfig``); without it workers log only to Ray's files.
    ``dashboard`` and ``metrics_port`` (Ray's metrics export port, Prometheus format) apply
    to a Ray started here; a cluster you join has its own.  ``dev_node``: a Ray started here
    runs with :data:`DEV_NODE_ENV` (a small idle cost; :func:`embedded_server` sets it).
    ``resources``: custom resources of a Ray started here (``{"client": 1}``: the node may run
    the lab's load actors, bench/runner).

    On exit, a Ray started here is shut down with Serve and every actor; from a joined
    cluster this process only disconnects (``ray.shutdown()`` of a driver that joined stops
    nothing of the cluster)."""
    local = address is None and not network
    added = {k: v for k, v in LOOPBACK_ENV.items() if k not in os.environ} if local else {}
    os.environ.update(added)
    import ray

    if ray.is_initialized():
        _restore(added)
        yield
        return
    kwargs: dict[str, Any] = {"log_to_driver": logs is not None}
    if logs is not None:
        kwargs["logging_config"] = ray_logging_config(logs)
    if address:
        kwargs["address"] = address
    else:
        apply_ray_env(dev_node)
        kwargs["object_store_memory"] = object_store_mb * 1024 * 1024
        kwargs["num_cpus"] = num_cpus
        if resources:
            kwargs["resources"] = resources
        kwargs["include_dashboard"] = dashboard is not None
        if dashboard is not None:
            kwargs.update(dashboard_host=dashboard.host, dashboard_port=dashboard.port)
        if metrics_port is not None:
            kwargs["_metrics_export_port"] = metrics_port
        node_ip = ray.util.get_node_ip_address()  # the address ray.init is about to use
        if local and not ipaddress.ip_address(node_ip).is_loopback:
            log.warning(
                "ray was imported before embedded_ray: the Ray started here listens on %s and all "
                "interfaces, not on loopback only",
                node_ip,
            )
    try:
        ray.init(**kwargs)
    finally:
        _restore(added)  # Ray's processes have it; programs this process starts later do not
    try:
        yield
    finally:
        ray.shutdown()


def _restore(added: dict[str, str]) -> None:
    for key in added:
        os.environ.pop(key, None)


def metrics_urls() -> list[str]:
    """Ray's metrics endpoint (Prometheus text format) on every live node of the Ray this
    process is connected to."""
    import ray

    return [
        f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
        for n in ray.nodes()
        if n["Alive"] and n.get("MetricsExportPort")
    ]


class DeployFailed(RuntimeError):
    """The app did not start: the error of the deployment that failed (e.g. the gateway's
    :class:`serve.port_claim.PortTaken`), as Serve's status reports it."""

    def __init__(self, name: str, error: str) -> None:
        super().__init__(f"deploying {name} failed: {error}")
        self.error = error


def _failure(name: str) -> str:
    """The last line (the exception) of the message of each deployment of ``name`` that failed."""
    from ray import serve
    from ray.serve.schema import DeploymentStatus

    app = serve.status().applications.get(name)
    messages = (
        [
            d.message.strip()
            for d in app.deployments.values()
            if d.status == DeploymentStatus.DEPLOY_FAILED and d.message.strip()
        ]
        if app
        else []
    )
    return "; ".join(m.splitlines()[-1] for m in messages)


def deploy(config: AppConfig, *, name: str = APP_NAME, logs: LogSettings | None = None) -> str:
    """Deploy the app as ``name`` on the Ray this process is connected to and wait until
    ``/healthz`` answers; returns the base URL.  Deploying a name again redeploys it.

    Serve is started here only if none runs yet (without its HTTP proxy: the gateway
    listens on ``server.port`` itself); a Serve instance already running keeps its settings.
    ``logs`` becomes the app's ``config.logs`` (the gateway applies it to itself and to its
    session hosts) and Serve's ``logging_config`` of the application (and of the controller,
    if Serve starts here)."""
    from ray import serve

    from .builder import build_application

    serve_logging = None
    if logs is not None:
        serve_logging = serve_logging_config(logs)
        logging.getLogger("ray.serve").setLevel(logs.level)  # Serve's messages in this process
        config = config.model_copy(update={"logs": logs})
    # Starts Serve, or connects to the one already running (which keeps its own settings).
    serve.start(proxy_location="Disabled", logging_config=serve_logging)
    if config.session.inference_app != name:
        config = config.model_copy(
            update={"session": config.session.model_copy(update={"inference_app": name})}
        )
    try:
        serve.run(
            build_application(config),
            name=name,
            route_prefix=None,
            blocking=False,
            logging_config=serve_logging,
        )
    except RuntimeError as exc:  # Serve's "Deploying application … failed"
        raise DeployFailed(name, _failure(name) or str(exc)) from exc
    host = "127.0.0.1" if config.server.host in ("0.0.0.0", "::") else config.server.host
    url = f"http://{host}:{config.server.port}"
    wait_ready(url)
    return url


@contextmanager
def embedded_server(
    config: AppConfig,
    *,
    name: str = APP_NAME,
    address: str | None = None,
    object_store_mb: int = 256,
    num_cpus: int | None = None,
    logs: LogSettings | None = None,
    dashboard: Dashboard | None = None,
    metrics_port: int | None = None,
    network: bool = False,
    dev_node: bool = True,
) -> Iterator[str]:
    """Ray (:func:`embedded_ray`, a development node unless ``dev_node`` is off) and the
    app deployed as ``name``; yields the base URL.

    On exit the app is deleted (its gateway drains and flushes the store), then Ray is
    stopped if it was started here.  Never ``serve.shutdown()``: on a cluster it joined,
    other applications and the Serve instance stay as they were."""
    with embedded_ray(
        address,
        object_store_mb=object_store_mb,
        num_cpus=num_cpus,
        logs=logs,
        dashboard=dashboard,
        metrics_port=metrics_port,
        network=network,
        dev_node=dev_node,
    ):
        from ray import serve  # imported here: embedded_ray decides the environment Ray starts with

        url = deploy(config, name=name, logs=logs)
        try:
            yield url
        finally:
            serve.delete(name)


def wait_ready(url: str, timeout_s: float = 120.0) -> None:
    """Poll ``{url}/healthz`` until it answers 200 (the gateway is up and listening; whether
    it is ready for traffic is :func:`readiness`); ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"server at {url} not up after {timeout_s:.0f}s")
        time.sleep(0.2)


def readiness(url: str) -> tuple[int, dict[str, Any]]:
    """``GET {url}/readyz``: 200 or 503 and the report (serve/health.py); 0 and the error
    when there was no answer."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError as exc:
        return 0, {"error": repr(exc)}
