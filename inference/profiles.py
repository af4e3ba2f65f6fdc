"""Typed configuration of the emulated inference backend (``configs/models.yaml``).

One pydantic model per concept: a ``ModelProfile`` is the latency model of one served
model, ``PolicyConfig`` drives the scripted output, ``InferenceConfig`` composes them for
the deployment.  The app builder loads this once and passes it to the deployment.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[1] / "configs" / "models.yaml"


class ModelNotFound(LookupError):
    """The requested model id is not one of the configured profiles.

    ``args == (model,)`` so the exception pickles across Ray unchanged.
    """

    code = "model_not_found"
    status = 404

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model

    def __str__(self) -> str:
        return f"The model '{self.model}' does not exist or you do not have access to it."


class ModelProfile(BaseModel):
    """The latency model of one served model.  Rates are per stream (per response).

    Decode follows a token bucket: the first ``burst_tokens`` output tokens of a response
    are produced at ``burst_tokens_per_s``, the rest at ``decode_tokens_per_s`` (issue 3
    refines this, e.g. refilling the bucket and load-dependent step time).  With
    ``burst_tokens == 0`` or ``burst_tokens_per_s is None`` there is no burst.

    ``chunk_ms`` and ``min_chunk_tokens`` shape the stream, not the model: the first token
    goes out alone when due; after it, due tokens are sent as one stream item when
    ``min_chunk_tokens`` are due or ``chunk_ms`` has passed since the last item (design.md §3: tokens cross Ray in ~5 ms / >= 8-token chunks).
    """

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    description: str = ""
    decode_tokens_per_s: float = Field(gt=0)
    burst_tokens_per_s: float | None = Field(default=None, gt=0)
    burst_tokens: int = Field(default=0, ge=0)
    prefill_tokens_per_s: float = Field(gt=0)
    prefill_overhead_ms: float = Field(ge=0)
    chunk_ms: float = Field(default=5.0, gt=0)
    min_chunk_tokens: int = Field(default=8, ge=1)
    owned_by: str = "responses-ws"

    @model_validator(mode="after")
    def _burst_needs_rate(self) -> ModelProfile:
        if self.burst_tokens > 0 and self.burst_tokens_per_s is None:
            raise ValueError("burst_tokens > 0 needs burst_tokens_per_s")
        return self


class PolicyConfig(BaseModel):
    """The scripted policy (``inference.policy``).

    The model calls a tool until the conversation holds ``tool_rounds`` tool results, then
    answers with ``text_tokens`` tokens of text.  ``seed`` varies all choices.
    """

    model_config = ConfigDict(extra="forbid")

    tool_rounds: int = Field(default=3, ge=0)
    text_tokens: int = Field(default=48, ge=1)
    seed: int = 0


class InferenceConfig(BaseModel):
    """Everything the inference deployment needs; ``default_model`` must be a profile id."""

    model_config = ConfigDict(extra="forbid")

    profiles: list[ModelProfile] = Field(min_length=1)
    policy: PolicyConfig = PolicyConfig()
    prefix_cache_sessions: int = Field(default=1024, ge=0)
    replicas: int = Field(default=1, ge=1)
    default_model: str

    @model_validator(mode="after")
    def _ids_unique_and_default_known(self) -> InferenceConfig:
        ids = [p.id for p in self.profiles]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate profile ids: {duplicates}")
        if self.default_model not in ids:
            raise ValueError(f"default_model {self.default_model!r} is not a profile id {ids}")
        return self

    def profile(self, model_id: str) -> ModelProfile:
        """The profile serving ``model_id``; raises ``ModelNotFound``."""
        for p in self.profiles:
            if p.id == model_id:
                return p
        raise ModelNotFound(model_id)


def load_inference_config(path: Path | None = None) -> InferenceConfig:
    """Read and validate the YAML config; ``path`` defaults to the repo's ``configs/models.yaml``."""
    with open(path or DEFAULT_CONFIG_PATH, encoding="utf-8") as f:
        return InferenceConfig.model_validate(yaml.safe_load(f))
