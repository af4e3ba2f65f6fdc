"""Typed configuration of the whole application, composed once in :mod:`serve.builder`.

A YAML file (``--config FILE``, or Serve config ``args:``) has the sections ``server``,
``session`` and ``inference``; ``inference`` defaults to ``configs/models.yaml``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from actors.config import SessionConfig
from store import StoreConfig
from inference.profiles import InferenceConfig, load_inference_config

API_KEYS_ENV = "RESPONSES_WS_API_KEYS"


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    gateway_replicas: int = Field(1, ge=1, description="gateway replicas sharing the port (SO_REUSEPORT)")
    # A fleet of agents (RL rollouts, a reconnect storm) often shares one key: the per-key cap
    # is for fairness between keys, not a small number (docs/scaling.md sizes a node).
    max_connections: int = Field(16384, ge=1, description="open WebSockets per gateway replica; more → 503")
    max_connections_per_key: int = Field(8192, ge=1, description="open WebSockets per API key and replica; more → 429")
    drain_timeout_s: float = Field(30.0, gt=0, description="on shutdown/redeploy, how long responses in flight may finish")
    api_keys: tuple[str, ...] = Field((), description="accepted keys; empty = any key is accepted")
    api_keys_file: str | None = Field(None, description="a file with one accepted key per line")
    # Placement (clusters).  A gateway hands WebSockets to session actors on its own node, so
    # where the gateways run is where connections live: give "session" nodes a custom
    # resource and ask for it here (docs/deploy.md).
    gateway_resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each gateway replica needs, e.g. {session: 1}")
    gateway_max_replicas_per_node: int | None = Field(
        None, ge=1, description="spread gateway replicas: at most this many per node")


class AppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    server: ServerConfig = ServerConfig()
    session: SessionConfig = SessionConfig()
    store: StoreConfig = StoreConfig()
    inference: InferenceConfig = Field(default_factory=load_inference_config)


def load_app_config(path: Path | None = None, *, environ: dict[str, str] | None = None,
                    **overrides: Any) -> AppConfig:
    """Read a YAML config file (all sections optional) and apply ``section.key`` overrides.

    This is the one place the environment is read: ``RESPONSES_WS_API_KEYS`` (comma
    separated) adds accepted API keys.  Key files and the SQLite data directory are
    resolved here too, so every process of a cluster sees the same absolute paths."""
    data: dict[str, Any] = yaml.safe_load(path.read_text()) if path else {}
    data = data or {}
    for dotted, value in overrides.items():
        section, key = dotted.split(".", 1)
        data.setdefault(section, {})[key] = value
    return app_config_from_dict(data, environ=environ)


def app_config_from_dict(data: dict[str, Any] | None, *, environ: dict[str, str] | None = None) -> AppConfig:
    """The sections as a mapping (a YAML file's, or a Serve config's ``args``) → AppConfig.

    A partial ``inference`` section refines the default profiles file (configs/models.yaml),
    as in a ``--config`` file."""
    data = dict(data or {})
    inference = data.get("inference")
    if inference is not None and "profiles" not in inference:
        data["inference"] = {**load_inference_config().model_dump(), **inference}
    config = AppConfig.model_validate(data)
    return resolve_keys_and_paths(config, environ if environ is not None else dict(os.environ))


def resolve_keys_and_paths(config: AppConfig, environ: dict[str, str]) -> AppConfig:
    server = config.server
    keys = list(server.api_keys)
    keys += [k.strip() for k in environ.get(API_KEYS_ENV, "").split(",") if k.strip()]
    if server.api_keys_file:
        keys += [line.strip() for line in Path(server.api_keys_file).read_text().splitlines() if line.strip()]
    return config.model_copy(update={
        "server": server.model_copy(update={"api_keys": tuple(dict.fromkeys(keys)), "api_keys_file": None}),
        "store": config.store.model_copy(update={"data_dir": str(Path(config.store.data_dir).resolve())}),
    })
