"""Typed configuration of the whole application, composed once in :mod:`serve.builder`.

A YAML file (``--config FILE``, or Serve config ``args:``) has the sections ``server``,
``session`` and ``inference``; ``inference`` defaults to ``configs/models.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from actors.config import SessionConfig
from inference.profiles import InferenceConfig, load_inference_config


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    gateway_replicas: int = Field(1, ge=1, description="gateway replicas sharing the port (SO_REUSEPORT)")


class AppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    server: ServerConfig = ServerConfig()
    session: SessionConfig = SessionConfig()
    inference: InferenceConfig = Field(default_factory=load_inference_config)


def load_app_config(path: Path | None = None, **overrides: Any) -> AppConfig:
    """Read a YAML config file (all sections optional) and apply ``section.key`` overrides."""
    data: dict[str, Any] = yaml.safe_load(path.read_text()) if path else {}
    data = data or {}
    for dotted, value in overrides.items():
        section, key = dotted.split(".", 1)
        data.setdefault(section, {})[key] = value
    inference = data.get("inference")
    if inference is not None and "profiles" not in inference:
        # A partial inference section refines the default profiles file.
        data["inference"] = {**load_inference_config().model_dump(), **inference}
    return AppConfig.model_validate(data)
