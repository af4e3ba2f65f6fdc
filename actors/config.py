"""Typed configuration of the session layer (composed once by ``serve.builder``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SessionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_inflight: int = Field(16, ge=1, description="responses in flight per connection (spec §1.4)")
    max_named_lanes: int = Field(32, ge=1, description="distinct stream_ids per connection")
    strict_params: bool = Field(False, description="reject unknown top-level create fields")
    connections_per_actor: int = Field(1, ge=1, description="connections one session actor hosts")
    warm_actors: int = Field(1, ge=0, description="idle session actors kept ready per gateway")
    inference_app: str = Field("responses-ws", description="Serve application of the inference deployment")
    inference_deployment: str = "InferenceDeployment"
