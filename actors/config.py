"""Typed configuration of the session layer (composed once by ``serve.builder``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inference.emulator.whatif import WhatIfConfig

from .core.safety import SafetyConfig

# vLLM's engine arguments of a ``serve_llm`` backend unless it gives its own: the prefix
# cache, the cached-token count in usage, the context the session's prompts fit in.
SERVE_LLM_ENGINE_KWARGS: dict[str, Any] = {
    "max_model_len": 4096,
    "enable_prefix_caching": True,
    "enable_prompt_tokens_details": True,
}


class ModelBackend(BaseModel):
    """A model rendered with its own tokenizer and template, and what serves it (docs/backends.md).

    ``openai``: any OpenAI-compatible server by ``url`` (vLLM, SGLang, llama.cpp) — its
    ``/v1/completions`` fed the conversation's token ids.  ``serve_llm``: a Ray Serve LLM
    deployment (vLLM engine) of the same application, built from ``model_source`` by
    ``serve.builder`` and called through its handle.  ``emulator``: the emulator's profile of
    the same id, fed the model's own token ids (its cache and timing model over the real
    model's token counts: docs/emulator-fidelity.md, "Against a real engine").  Each renders with the
    model's own tokenizer and chat template, read from the ``tokenizer`` folder (a Hugging
    Face model folder)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, description="the model id clients ask for (listed by /v1/models)")
    kind: Literal["openai", "serve_llm", "emulator"] = Field(
        "openai", description="what serves it: openai (an engine by url) | serve_llm | emulator"
    )
    tokenizer: str = Field(min_length=1, description="folder with the model's tokenizer and chat template")
    url: str | None = Field(
        None, min_length=1, description="openai: the engine's base URL, e.g. http://127.0.0.1:8000/v1"
    )
    engine_model: str | None = Field(None, description="the model name the engine serves; default: id")
    api_key_env: str | None = Field(
        None, description="openai: environment variable holding the engine's key (Bearer)"
    )
    # serve_llm: the deployment (ray.serve.llm's LLMConfig, serve/serve_llm.py).
    model_source: str | None = Field(
        None,
        description="serve_llm: the weights (a folder or a Hugging Face id); default: the tokenizer folder",
    )
    accelerator: Literal["cpu", "gpu"] = Field("gpu", description="serve_llm: what the engine runs on")
    engine_kwargs: dict[str, Any] = Field(
        default_factory=lambda: dict(SERVE_LLM_ENGINE_KWARGS),
        description="serve_llm: vLLM's engine arguments (replace the defaults)",
    )
    engine_env: dict[str, str] = Field(
        default_factory=dict,
        description="serve_llm: environment of the engine's replica, e.g. VLLM_CPU_KVCACHE_SPACE",
    )
    replicas: int = Field(1, ge=1, description="serve_llm: engine replicas")
    temperature: float = Field(0.0, ge=0, description="sampling temperature; 0 = greedy (deterministic)")
    max_output_tokens: int = Field(512, ge=1, description="output cap when a request gives none")
    cache_salt: bool = Field(
        True, description="scope the engine's prefix cache per API key (vLLM cache_salt)"
    )
    timeout_s: float = Field(300.0, gt=0, description="one model call, at most")
    owned_by: str = Field("responses-ws", description="owned_by in /v1/models")

    @model_validator(mode="after")
    def _kind_has_what_it_needs(self) -> ModelBackend:
        if self.kind == "openai" and not self.url:
            raise ValueError(f"backend {self.id!r} (kind openai) needs the engine's url")
        if self.kind != "openai" and (self.url or self.api_key_env):
            raise ValueError(f"backend {self.id!r} (kind {self.kind}) is served in this application: no url")
        return self

    @property
    def served_name(self) -> str:
        return self.engine_model or self.id

    @property
    def deployment(self) -> str:
        """serve_llm: the deployment's name in the application."""
        return f"LLMServer:{self.id}"


class SessionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_inflight: int = Field(
        16, ge=1, description="responses in flight per connection (docs/protocol.md §1.4)"
    )
    max_named_lanes: int = Field(32, ge=1, description="distinct stream_ids per connection")
    strict_params: bool = Field(False, description="reject unknown top-level create fields")
    # The session-host pool of each gateway replica (serve/pool.py, docs/scaling.md).
    connections_per_actor: int = Field(
        1024,
        ge=1,
        description="connections a session host takes before the "
        "pool prefers another (soft target); 1 = a dedicated actor per connection",
    )
    max_connections_per_actor: int | None = Field(
        None,
        ge=1,
        description="connections a host takes at most "
        "(hard cap); default 4 x connections_per_actor, 1 when that is 1",
    )
    warm_actors: int | None = Field(
        None,
        ge=0,
        description="free connection slots kept ready ahead of demand "
        "(more as arrivals grow); default min(64, connections_per_actor)",
    )
    max_actors: int = Field(32, ge=1, description="session hosts per gateway replica, at most")
    nice: int = Field(
        0,
        ge=-20,
        le=19,
        description="added to each session host's threads' niceness at start, as nice -n does "
        "(inference/priority.py): below 0 its event loop gets a core ahead of the node's other "
        "processes; needs CAP_SYS_NICE, else it keeps its own (logged); 0 = unchanged",
    )
    phase_sample_every: int = Field(
        8,
        ge=1,
        description="responses_ws_phase_seconds: api_overhead observed for every response, the "
        "other phases for one response in this many (Ray's metrics agent records each value "
        "again, a burst of CPU every export: actors/host/host_metrics.py); 1 = every response's",
    )
    max_starting_actors: int = Field(2, ge=1, description="session hosts starting at once, at most")
    open_files: int = Field(
        65536,
        ge=1024,
        description="open-file limit (RLIMIT_NOFILE) each gateway and session host raises itself to "
        "at start, the hard limit too where it may: a held connection is a descriptor in both "
        "(actors/host/limits.py)",
    )
    actor_idle_timeout_s: float = Field(
        30.0, ge=0, description="an idle host stops after this long, while the others keep enough free slots"
    )
    http_actors: int = Field(
        1,
        ge=0,
        description="session hosts of HTTP mode alone, started at the first "
        "HTTP connection and kept; WebSockets never share them, so a stateless rebuild of a long "
        "conversation never stalls an open socket's event loop; 0 = HTTP shares the "
        "WebSocket hosts",
    )
    admission_wait_s: float = Field(
        5.0,
        ge=0,
        description="how long an upgrade may wait for a starting "
        "host when every host is at its hard cap; then 503 + Retry-After",
    )
    max_frame_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, description="inbound frame cap; larger → close 1009"
    )
    deflate: Literal["auto", "always", "never"] = Field(
        "auto",
        description="accept a client's permessage-deflate offer: always, never, or (auto) unless the "
        "peer is on this machine's loopback, where compressing costs more than the bytes it saves "
        "(docs/performance.md); set always behind a reverse proxy on the same machine",
    )
    deflate_level: int = Field(
        1,
        ge=0,
        le=9,
        description="zlib level of permessage-deflate when a client "
        "negotiates it (docs/performance.md, the protocol's floor)",
    )
    connection_lifetime_s: float = Field(3600.0, gt=0, description="then websocket_connection_limit_reached")
    ping_interval_s: float | None = Field(
        20.0, description="keepalive pings to detect dead peers; None disables"
    )
    ping_timeout_s: float | None = Field(
        20.0, description="a ping unanswered this long drops the peer; None waits forever"
    )
    resume_grace_s: float = Field(
        0.0,
        ge=0,
        description="opt-in resumable connections: keep a dropped "
        "connection's state this long for its resume token; 0 = off",
    )
    render_offload_chars: int = Field(
        32_768,
        ge=0,
        description="an input with at least this many characters "
        "of text is tokenised on a worker thread while the host has other work in "
        "flight, so its event loop keeps serving the other connections; 0 = always "
        "on the loop",
    )
    max_input_tokens: int = Field(400_000, ge=1, description="prompt tokens per request; more → 400")
    max_cached_tokens: int = Field(
        2_000_000,
        ge=1,
        description="tokens a connection caches over all "
        "lanes; beyond it the least recently used lanes are evicted",
    )
    host_max_cached_tokens: int = Field(
        32_000_000,
        ge=1,
        description="tokens one session host caches over "
        "all its connections (~13-15 bytes each); beyond it the least recently "
        "used lanes of any of its connections are evicted",
    )
    safety: SafetyConfig = Field(
        SafetyConfig(), description="the incremental safety classifier (actors/core/safety.py)"
    )
    # Opt-in emulated per-request services of a hosted API (docs/whatif.md); off by default.
    whatif: WhatIfConfig = Field(
        WhatIfConfig(), description="opt-in emulated per-request services, never the default (docs/whatif.md)"
    )
    direct_inference: bool = Field(
        True,
        description="a connection's model calls after its first go "
        "over a direct channel to its pinned inference replica, not one Serve "
        "call each (docs/performance.md)",
    )
    backends: tuple[ModelBackend, ...] = Field(
        (),
        description="models served by a real engine (docs/backends.md); the other models are the emulator's",
    )
    inference_app: str = Field("responses-ws", description="Serve application of the inference deployment")
    inference_deployment: str = Field("InferenceDeployment", description="the inference deployment's name")

    @property
    def hard_connections_per_actor(self) -> int:
        if self.max_connections_per_actor is not None:
            return max(self.max_connections_per_actor, self.connections_per_actor)
        return 1 if self.connections_per_actor == 1 else 4 * self.connections_per_actor

    @property
    def spare_slots(self) -> int:
        return min(64, self.connections_per_actor) if self.warm_actors is None else self.warm_actors
