"""Typed configuration of the whole application, composed once in :mod:`serve.builder`.

Five sections, ``server``, ``session``, ``store``, ``inference`` and ``logs``, from four sources; a
later source wins key by key (sections and nested mappings are merged at every depth; a
list or a scalar is replaced whole):

1. the defaults (the models; ``inference`` from the packaged ``inference/emulator/models.yaml``);
2. a YAML file: ``--config FILE``, or a Serve config file's ``args:``;
3. the environment: ``RESPONSES_WS_<SECTION>__<KEY>[__<KEY>…]=<YAML value>``, e.g.
   ``RESPONSES_WS_SESSION__CONNECTIONS_PER_ACTOR=64`` (:func:`environment_layer`);
4. command-line flags: ``--set section.key=<YAML value>`` (repeatable), ``--host``, ``--port``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from actors.config import SessionConfig
from actors.host.drain import DrainSettings
from actors.logs import LogSettings
from inference.emulator.profiles import InferenceConfig, load_inference_config
from store import StoreConfig

from .origins import LOOPBACK_ORIGINS, OriginPolicy

API_KEYS_ENV = "RESPONSES_WS_API_KEYS"


class GatewayAutoscaling(BaseModel):
    """The session tier grows and shrinks with its connections (docs/deploy.md, "The session
    tier autoscales"): each gateway replica reports its open connections, Serve keeps
    ``server.target_connections_per_node`` per replica, between these bounds — with one
    replica per session node (``gateway_max_replicas_per_node: 1``), a replica Serve adds
    that no node can take makes Ray's autoscaler launch a session node, and one it removes
    drains its node before Ray removes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_replicas: int = Field(
        1, ge=1, description="session nodes always up (the cluster YAML's session min_workers)"
    )
    max_replicas: int = Field(10, ge=1, description="the most session nodes (the session type's max_workers)")
    upscale_delay_s: float = Field(
        10.0, ge=0, description="load above target this long before a node is added"
    )
    downscale_delay_s: float = Field(
        300.0, ge=0, description="load below target this long before a node is drained and removed"
    )
    metrics_interval_s: float = Field(2.0, gt=0, description="how often each replica reports its connections")
    look_back_period_s: float = Field(10.0, gt=0, description="Serve averages the reports over this window")

    @model_validator(mode="after")
    def _bounds(self) -> GatewayAutoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("gateway_autoscaling.min_replicas must be <= max_replicas")
        return self


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="the address the gateway listens on (--host)")
    port: int = Field(8765, ge=0, le=65535, description="the port of HTTP and WebSocket alike (--port)")
    gateway_replicas: int = Field(1, ge=1, description="gateway replicas sharing the port's listening socket")
    gateway_autoscaling: GatewayAutoscaling | None = Field(
        None, description="scale the gateway replicas on connections (replaces gateway_replicas)"
    )
    # docs/capacity.md, "A node's capacity": on the 2-core reference node 64 Codex-like loops
    # kept the steady non-model p99 at 59-408 ms and 256 at 145 ms with 11 s first-turn storms;
    # 32 connections a core is the shipped default for an 8-vCPU session node (docs/deploy.md).
    target_connections_per_node: int = Field(
        256, ge=1, description="open connections a session node is scaled to hold (gateway_autoscaling)"
    )
    # A fleet of agents (RL rollouts, a reconnect storm) often shares one key: the per-key cap
    # is for fairness between keys, not a small number (docs/scaling.md sizes a node).
    max_connections: int = Field(16384, ge=1, description="open WebSockets per gateway replica; more → 503")
    max_connections_per_key: int = Field(
        8192, ge=1, description="open WebSockets per API key and replica; more → 429"
    )
    drain_timeout_s: float = Field(
        30.0, gt=0, description="on shutdown/redeploy, how long responses in flight may finish"
    )
    # Drains (docs/reliability.md, "Drains"; the pure logic: actors/host/drain.py).
    drain_poll_interval_s: float = Field(
        0.5,
        gt=0,
        description="how often the gateway checks whether Serve is stopping its replica (in process)",
    )
    node_drain_poll_interval_s: float = Field(
        2.0,
        gt=0,
        description="how often the gateway asks Ray whether its node is draining (one GCS read; "
        "also as soon as Serve stops the replica)",
    )
    drain_health_grace_s: float = Field(
        6.0,
        ge=0,
        description="on a node drain, /readyz answers 503 this long before sockets begin to close: "
        "the balancer's health-check interval x fall (HAProxy's defaults: 2 s x 3)",
    )
    drain_deadline_margin_s: float = Field(
        2.0, ge=0, description="a drain with a node deadline cuts off this long before it"
    )
    drain_close_batch_size: int = Field(
        50, ge=1, description="sockets a draining node closes per batch (reconnects do not storm)"
    )
    drain_close_batch_interval_s: float = Field(0.5, gt=0, description="between those batches")
    api_keys: tuple[str, ...] = Field((), description="accepted keys; empty = any key is accepted")
    api_keys_file: str | None = Field(None, description="a file with one accepted key per line")
    # Browsers send Origin; SDKs and CLIs do not, and are always served (serve/origins.py).
    allowed_origins: tuple[str, ...] = Field(
        LOOPBACK_ORIGINS,
        description="web pages (their Origin header) that may use the server, e.g. "
        "https://app.example.com or http://localhost:*; '*' = any page",
    )
    # Placement (clusters).  A gateway hands WebSockets to session actors on its own node, so
    # where the gateways run is where connections live: give "session" nodes a custom
    # resource and ask for it here (docs/deploy.md).
    gateway_resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each gateway replica needs, e.g. {session: 1}"
    )
    gateway_max_replicas_per_node: int | None = Field(
        None, ge=1, description="spread gateway replicas: at most this many per node"
    )

    @model_validator(mode="before")
    @classmethod
    def _fixed_count_wins(cls, data: Any) -> Any:
        """``gateway_replicas`` given (a file, the environment, ``--set``) fixes the count:
        ``gateway_autoscaling`` is then off, whatever a lower layer said."""
        if isinstance(data, Mapping) and "gateway_replicas" in data and data.get("gateway_autoscaling"):
            return {**data, "gateway_autoscaling": None}
        return data

    @property
    def drain(self) -> DrainSettings:
        return DrainSettings(
            timeout_s=self.drain_timeout_s,
            health_grace_s=self.drain_health_grace_s,
            deadline_margin_s=self.drain_deadline_margin_s,
            batch_size=self.drain_close_batch_size,
            batch_interval_s=self.drain_close_batch_interval_s,
        )

    @field_validator("allowed_origins")
    @classmethod
    def _origins_parse(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        OriginPolicy(value)  # ValueError for an entry that is not an origin
        return value


class AppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    server: ServerConfig = Field(
        ServerConfig(), description="the gateway: its port, limits, API keys, drains"
    )
    session: SessionConfig = Field(
        SessionConfig(), description="the session hosts: per-connection limits, the pool, caches, backends"
    )
    store: StoreConfig = Field(StoreConfig(), description="where stored responses and usage lines go")
    inference: InferenceConfig = Field(
        default_factory=load_inference_config,
        description="the emulated models and their deployment; defaults: the packaged models.yaml",
    )
    logs: LogSettings = Field(
        LogSettings(), description="the app's own loggers: the gateway and its session hosts"
    )

    @model_validator(mode="after")
    def _emulated_backends_have_profiles(self) -> AppConfig:
        profiles = {p.id for p in self.inference.profiles}
        for backend in self.session.backends:
            if backend.kind == "emulator" and backend.id not in profiles:
                raise ValueError(
                    f"backend {backend.id!r} (kind emulator) needs an inference profile of that id"
                )
        return self


ENV_PREFIX = "RESPONSES_WS_"
ENV_SEPARATOR = "__"


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` on ``base``: mappings are merged key by key at every depth; anything
    else in ``override`` (a list, a scalar, ``None``) replaces what ``base`` has."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def dotted_layer(assignments: Mapping[str, Any]) -> dict[str, Any]:
    """``{"session.safety.enabled": False}`` → ``{"session": {"safety": {"enabled": False}}}``."""
    layer: dict[str, Any] = {}
    for dotted, value in assignments.items():
        parts = dotted.split(".")
        if len(parts) < 2 or not all(parts):
            raise ValueError(f"{dotted!r}: expected section.key (e.g. session.max_inflight)")
        for part in reversed(parts):
            value = {part: value}
        layer = deep_merge(layer, value)
    return layer


def yaml_value(raw: str) -> Any:
    """A value given as text (``--set``, the environment) read as YAML: ``64``, ``true``,
    ``null``, ``[a, b]``, ``{x: 1}``; anything else (or nothing) is a string."""
    return yaml.safe_load(raw) if raw.strip() else ""


def parse_set(assignment: str) -> tuple[str, Any]:
    """``--set section.key=value`` → ``("section.key", value)`` (:func:`yaml_value`)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set {assignment!r}: expected section.key=value")
    return key.strip(), yaml_value(raw)


def environment_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    """``RESPONSES_WS_<SECTION>__<KEY>[__<KEY>…]`` variables as a layer: names are
    lower-cased, values are :func:`yaml_value`.  Prefixed names without ``__`` (such as
    ``RESPONSES_WS_API_KEYS``) are not keys; an unknown section is an error."""
    assignments = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or ENV_SEPARATOR not in name:
            continue
        path = name[len(ENV_PREFIX) :].lower().split(ENV_SEPARATOR)
        if path[0] not in AppConfig.model_fields:
            raise ValueError(
                f"{name}: unknown section {path[0]!r} (one of {', '.join(AppConfig.model_fields)})"
            )
        assignments[".".join(path)] = yaml_value(raw)
    return dotted_layer(assignments)


def load_app_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    sets: Iterable[str] = (),
    **overrides: Any,
) -> AppConfig:
    """The config from a YAML file (all sections optional), the environment, ``--set``
    assignments and ``section.key`` keyword overrides (the flags), in that order of
    precedence from lowest to highest (module docstring).

    ``environ`` defaults to ``os.environ``; it also supplies ``RESPONSES_WS_API_KEYS``
    (:func:`resolve_keys_and_paths`)."""
    data: dict[str, Any] = (yaml.safe_load(path.read_text()) if path else None) or {}
    flags = dict(parse_set(s) for s in sets) | overrides
    return app_config_from_dict(data, environ=environ, flags=flags)


def app_config_from_dict(
    data: Mapping[str, Any] | None,
    *,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> AppConfig:
    """The sections as a mapping (a YAML file's, or a Serve config's ``args``) → AppConfig,
    with the environment and then ``flags`` (dotted keys) merged on top.

    Every section refines its defaults: a partial ``inference`` section refines the
    packaged profiles file (inference/emulator/models.yaml), a partial ``session.safety`` the
    classifier's defaults, and so on."""
    environ = os.environ if environ is None else environ
    merged: dict[str, Any] = {"inference": load_inference_config().model_dump()}
    for layer in (data or {}, environment_layer(environ), dotted_layer(flags or {})):
        merged = deep_merge(merged, layer)
    return resolve_keys_and_paths(AppConfig.model_validate(merged), environ)


def resolve_keys_and_paths(config: AppConfig, environ: Mapping[str, str]) -> AppConfig:
    """Accepted API keys from the list, ``RESPONSES_WS_API_KEYS`` and the key file; the
    SQLite data directory made absolute (every process of a cluster sees the same path)."""
    server = config.server
    keys = list(server.api_keys)
    keys += [k.strip() for k in environ.get(API_KEYS_ENV, "").split(",") if k.strip()]
    if server.api_keys_file:
        keys += [line.strip() for line in Path(server.api_keys_file).read_text().splitlines() if line.strip()]
    return config.model_copy(
        update={
            "server": server.model_copy(
                update={"api_keys": tuple(dict.fromkeys(keys)), "api_keys_file": None}
            ),
            "store": config.store.model_copy(update={"data_dir": str(Path(config.store.data_dir).resolve())}),
        }
    )
