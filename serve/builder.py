"""The composition root: the only place that binds deployments together.

Serve config files point at ``serve.builder:app_builder`` with the YAML sections of
:class:`serve.config.AppConfig` as ``args``; :mod:`serve.embedded` deploys
:func:`build_application` on a Ray of its own.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application, Deployment

from inference.emulator.deployment import InferenceDeployment, deployment_options
from inference.emulator.whatif_deployment import WhatIfHop, WhatIfSafetyModel, whatif_options
from inference.serve_autoscaling import CONNECTIONS, autoscaling_config

from .config import AppConfig, ServerConfig, app_config_from_dict
from .gateway import Gateway


def build_application(config: AppConfig) -> Application:
    inference = (
        deployment(InferenceDeployment)
        .options(**deployment_options(config.inference))
        .bind(config.inference.model_dump())
    )
    # The opt-in what-if services (docs/whatif.md), bound only when on: session hosts call
    # them by name; the gateway takes them so that they are part of the application.
    whatif = config.session.whatif
    services = {}
    if whatif.hop.enabled:
        services["hop"] = (
            deployment(WhatIfHop).options(**whatif_options(whatif.hop)).bind(whatif.hop.model_dump())
        )
    if whatif.safety_model.enabled:
        services["safety_model"] = (
            deployment(WhatIfSafetyModel)
            .options(**whatif_options(whatif.safety_model))
            .bind(whatif.safety_model.model_dump())
        )
    # The Ray Serve LLM engines of `serve_llm` backends (docs/backends.md), reached by name too.
    for i, backend in enumerate(b for b in config.session.backends if b.kind == "serve_llm"):
        from .serve_llm import llm_deployment  # ray.serve.llm and vLLM: only for such a model

        services[f"llm_{i}"] = llm_deployment(backend)
    return (
        deployment(Gateway)
        .options(**gateway_options(config.server))
        .bind(config.model_dump(), inference, **services)
    )


def deployment(decorated: object) -> Deployment:
    """A class decorated with ``@serve.deployment``, as the ``Deployment`` it is (mypy does not
    apply class decorators)."""
    assert isinstance(decorated, Deployment), decorated
    return decorated


def gateway_options(server: ServerConfig) -> dict[str, Any]:
    """Replicas and placement of the gateway.  Session actors follow their gateway's node
    (a socket cannot cross nodes), so ``gateway_resources`` decides where connections live."""
    actor: dict[str, Any] = {"num_cpus": 0}
    if server.gateway_resources:
        actor["resources"] = dict(server.gateway_resources)
    options: dict[str, Any] = {
        "ray_actor_options": actor,
        # Serve kills a replica this long after asking it to stop (its drain's hold included).
        "graceful_shutdown_timeout_s": server.drain_timeout_s + server.drain_health_grace_s + 10,
    }
    auto = server.gateway_autoscaling
    if auto is None:
        options["num_replicas"] = server.gateway_replicas
    else:
        options["autoscaling_config"] = autoscaling_config(
            metric=CONNECTIONS,
            target_per_replica=server.target_connections_per_node,
            bounds=auto,
        )
    if server.gateway_max_replicas_per_node is not None:
        options["max_replicas_per_node"] = server.gateway_max_replicas_per_node
    elif not server.gateway_resources:
        # A redeploy starts the new replica (it shares the port's listening socket) before it
        # stops the old one, whose sockets then close with 1012: the clients reconnect to a
        # listener rather than a closed port.  (Serve's default stops first.)  Not with placement limits: a
        # replacement that cannot be placed next to the old replica would wait forever.
        options["max_surge_percent"] = 100
    return options


def app_builder(args: dict[str, Any]) -> Application:
    """Entry point for ``serve run``/``serve deploy`` config files: ``args`` holds the
    sections of :class:`AppConfig` (a partial ``inference`` section refines
    the packaged inference/emulator/models.yaml, as in a ``--config`` file; the environment applies
    on top, serve/config.py)."""
    return build_application(app_config_from_dict(args))
