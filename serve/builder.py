"""The composition root: the only place that binds deployments together.

Serve config files point at ``serve.builder:app_builder`` with the YAML sections of
:class:`serve.config.AppConfig` as ``args``.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from inference.deployment import InferenceDeployment, deployment_options

from .config import AppConfig, ServerConfig, app_config_from_dict
from .gateway import Gateway

APP_NAME = "responses-ws"


def build_application(config: AppConfig) -> Application:
    inference = InferenceDeployment.options(**deployment_options(config.inference)).bind(
        config.inference.model_dump())
    return Gateway.options(**gateway_options(config.server)).bind(config.model_dump(), inference)


def gateway_options(server: ServerConfig) -> dict[str, Any]:
    """Replicas and placement of the gateway.  Session actors follow their gateway's node
    (a socket cannot cross nodes), so ``gateway_resources`` decides where connections live."""
    actor: dict[str, Any] = {"num_cpus": 0}
    if server.gateway_resources:
        actor["resources"] = dict(server.gateway_resources)
    options: dict[str, Any] = {"num_replicas": server.gateway_replicas, "ray_actor_options": actor,
                               # Serve kills a replica this long after asking it to stop.
                               "graceful_shutdown_timeout_s": server.drain_timeout_s + 10}
    if server.gateway_max_replicas_per_node is not None:
        options["max_replicas_per_node"] = server.gateway_max_replicas_per_node
    return options


def app_builder(args: dict[str, Any]) -> Application:
    """Entry point for ``serve run``/``serve deploy`` config files: ``args`` holds the
    sections of :class:`AppConfig` (a partial ``inference`` section refines
    configs/models.yaml, as in a ``--config`` file)."""
    return build_application(app_config_from_dict(args))


# Serve's throughput mode (no per-request logging, user code on the replica's own loop,
# gRPC between handles and replicas) cuts a turn's Serve hop roughly in half on this
# machine (docs/architecture.md).  It must be in the environment of every Ray process, so
# it is set before an embedded Ray starts; a cluster you join must be started with it.
# That mode also turns on Serve's direct ingress, which keeps a stopping ingress replica
# "reachable" for 30 s before its destructor runs; the gateway runs its own listener, so
# the wait only delays the drain (docs/reliability.md): 1 s.
RAY_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1"}


def init_ray(address: str | None = None, *, object_store_mb: int = 256, num_cpus: int | None = None) -> None:
    """Join ``address``, or start an embedded single-node Ray sized for a small machine."""
    import os

    import ray

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address:
        kwargs["address"] = address
    else:
        for key, value in RAY_ENV.items():
            os.environ.setdefault(key, value)
        kwargs["object_store_memory"] = object_store_mb * 1024 * 1024
        kwargs["num_cpus"] = num_cpus
    ray.init(**kwargs)


def start(config: AppConfig, *, address: str | None = None, name: str = APP_NAME) -> str:
    """Start (or join, with ``address``) Ray, deploy the app, wait until ``/healthz`` answers.

    Returns the server's base URL.
    """
    from ray import serve

    init_ray(address)
    serve.start(proxy_location="Disabled")
    if config.session.inference_app != name:
        config = config.model_copy(update={"session": config.session.model_copy(update={"inference_app": name})})
    serve.run(build_application(config), name=name, route_prefix=None, blocking=False)
    host = "127.0.0.1" if config.server.host in ("0.0.0.0", "::") else config.server.host
    url = f"http://{host}:{config.server.port}"
    wait_ready(url)
    return url


def wait_ready(url: str, timeout_s: float = 120.0) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"server at {url} not ready after {timeout_s:.0f}s")
        time.sleep(0.2)


def stop(name: str = APP_NAME, *, shutdown_ray: bool = True) -> None:
    import ray
    from ray import serve

    serve.delete(name)
    if shutdown_ray:
        serve.shutdown()
        ray.shutdown()
