"""Typed configuration of the session layer (composed once by ``serve.builder``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .safety import SafetyConfig


class SessionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_inflight: int = Field(16, ge=1, description="responses in flight per connection (spec §1.4)")
    max_named_lanes: int = Field(32, ge=1, description="distinct stream_ids per connection")
    strict_params: bool = Field(False, description="reject unknown top-level create fields")
    connections_per_actor: int = Field(1, ge=1, description="connections one session actor hosts")
    warm_actors: int = Field(1, ge=0, description="idle session actors kept ready per gateway")
    max_frame_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="inbound frame cap; larger → close 1009")
    connection_lifetime_s: float = Field(3600.0, gt=0, description="then websocket_connection_limit_reached")
    ping_interval_s: float | None = Field(20.0, description="keepalive pings to detect dead peers; None disables")
    ping_timeout_s: float | None = 20.0
    resume_grace_s: float = Field(0.0, ge=0, description="opt-in resumable connections: keep a dropped "
                                  "connection's state this long for its resume token; 0 = off")
    max_input_tokens: int = Field(400_000, ge=1, description="prompt tokens per request; more → 400")
    max_cached_tokens: int = Field(2_000_000, ge=1, description="tokens a connection caches over all "
                                   "lanes; beyond it the least recently used lanes are evicted")
    safety: SafetyConfig = SafetyConfig()
    inference_app: str = Field("responses-ws", description="Serve application of the inference deployment")
    inference_deployment: str = "InferenceDeployment"
