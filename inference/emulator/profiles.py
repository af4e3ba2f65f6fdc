"""Typed configuration of the emulated inference backend (``inference/emulator/models.yaml``, the
defaults shipped inside the package).

One pydantic model per concept: a ``ModelProfile`` is the latency and load model of one
served model (``BatchingConfig`` and ``JitterConfig`` are parts of it), ``PolicyConfig``
drives the scripted output, ``PrefixCacheConfig`` sizes each replica's KV cache,
``RoutingConfig`` says which replica a request goes to, ``ScalingConfig`` says how Serve
places and scales replicas, and ``InferenceConfig``
composes them for the deployment.  The app builder loads this once and passes it to the
deployment.  ``docs/emulator.md`` explains the model these numbers feed.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from inference.emulator.scenario import Scenario

# Package data (pyproject.toml): found the same way in a checkout, an editable install and a wheel.
DEFAULT_CONFIG = resources.files("inference.emulator").joinpath("models.yaml")


class UnknownModelProfile(LookupError):
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


class BatchingConfig(BaseModel):
    """Continuous batching on one replica (``inference.emulator.batching``).

    At most ``max_running`` sequences are in the batch; later requests wait FIFO in a queue
    of at most ``max_waiting`` (beyond it a request is refused with ``EngineOverloaded``).
    With ``b`` sequences running, every running stream's inter-token latency is its
    single-stream value times the step factor::

        f(b) = (1 + itl_growth_per_seq * (min(b, knee) - 1)) * max(1, b / knee)

    Below the knee decode is memory-bound: a step costs almost the same for more sequences,
    so the replica's throughput grows ~linearly with ``b``; past the knee it is compute-bound
    and throughput stays flat at ``knee`` streams' worth.
    """

    model_config = ConfigDict(extra="forbid")

    max_running: int = Field(default=64, ge=1, description="sequences in the batch, at most")
    max_waiting: int = Field(
        default=1024, ge=0, description="requests waiting for the batch, FIFO; beyond it a request is refused"
    )
    knee: int = Field(
        default=16, ge=1, description="sequences past which the step is compute-bound: throughput stays flat"
    )
    itl_growth_per_seq: float = Field(
        default=0.0, ge=0, description="inter-token latency growth per extra sequence below the knee"
    )

    @model_validator(mode="after")
    def _knee_within_batch(self) -> BatchingConfig:
        if self.knee > self.max_running:
            raise ValueError("batching.knee must be <= batching.max_running")
        return self


class JitterConfig(BaseModel):
    """Seeded lognormal jitter with mean 1 (``inference.emulator.jitter``).

    One factor per request multiplies its prefill time and every one of its token times;
    one factor per token multiplies that token's time.  ``sigma`` is the standard deviation
    of the underlying normal; 0 turns that jitter off (exactly 1.0).  Factors are drawn from
    an RNG seeded by ``seed`` and the request id, so a request's timing does not depend on
    what else runs.
    """

    model_config = ConfigDict(extra="forbid")

    request_sigma: float = Field(
        default=0.0, ge=0, le=2, description="lognormal sigma of a request's factor on all its times; 0 = off"
    )
    token_sigma: float = Field(
        default=0.0, ge=0, le=2, description="lognormal sigma of each token's factor; 0 = off"
    )
    seed: int = Field(0, description="seeds the jitter, with the request id")


class ModelProfile(BaseModel):
    """The latency model of one served model.  Rates are per stream (per response) at a
    batch of one; ``batching`` says how they degrade with load, ``jitter`` how they vary.

    Bursts are explicit, not noise: decode follows a token bucket of ``burst_tokens`` that is
    full when a response starts — the first ``burst_tokens`` output tokens of a response are
    produced at ``burst_tokens_per_s``, the rest at ``decode_tokens_per_s``.  With
    ``burst_tokens == 0`` or ``burst_tokens_per_s is None`` there is no burst.
    ``source`` says where the numbers come from.

    ``chunk_ms`` and ``min_chunk_tokens`` shape the stream, not the model: the first token
    goes out alone when due; after it, due tokens are sent as one stream item when
    ``min_chunk_tokens`` are due or ``chunk_ms`` has passed since the last item (tokens cross Ray in ~5 ms / >= 8-token chunks).
    ``max_items_per_s`` caps the items per second one replica sends for this model, summed
    over its running streams: past ``max_items_per_s * chunk_ms / 1000`` streams, every
    stream's window and minimum grow in proportion (``pacing.ItemWindow``; tokens are held,
    never sent before they are due); ``None``: no cap.
    """

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="the model id clients ask for (listed by /v1/models)")
    description: str = Field("", description="one line on what it emulates")
    decode_tokens_per_s: float = Field(
        gt=0, description="output tokens per second per stream, after the burst"
    )
    burst_tokens_per_s: float | None = Field(
        default=None, gt=0, description="rate of a response's first burst_tokens; null = no burst"
    )
    burst_tokens: int = Field(default=0, ge=0, description="output tokens at the burst rate; 0 = no burst")
    prefill_tokens_per_s: float = Field(gt=0, description="uncached prompt tokens processed per second")
    prefill_overhead_ms: float = Field(ge=0, description="fixed time before a response's first token")
    chunk_ms: float = Field(
        default=5.0, gt=0, description="due tokens go out as one stream item at least this often"
    )
    min_chunk_tokens: int = Field(default=8, ge=1, description="or as soon as this many are due")
    max_items_per_s: float | None = Field(
        default=1600.0,
        gt=0,
        description="stream items per second one replica sends for this model; past it every "
        "stream's chunk window grows (tokens held, never early); null = no cap",
    )
    batching: BatchingConfig = Field(BatchingConfig(), description="continuous batching on one replica")
    jitter: JitterConfig = Field(JitterConfig(), description="seeded lognormal jitter with mean 1")
    source: str = Field("", description="where the numbers come from")
    owned_by: str = Field("responses-ws", description="owned_by in /v1/models")
    # The prompt-cache rule (docs/emulator.md): "blocks", reuse in 128-token steps from 1024
    # (inference.emulator.prefix_cache); "breakpoints", the breakpoint rule
    # (inference.emulator.breakpoint_cache).
    prompt_cache: Literal["blocks", "breakpoints"] = Field(
        "blocks", description="the prompt-cache rule: blocks (128-token steps from 1024) | breakpoints"
    )

    @model_validator(mode="after")
    def _burst_needs_rate(self) -> ModelProfile:
        if self.burst_tokens > 0 and self.burst_tokens_per_s is None:
            raise ValueError("burst_tokens > 0 needs burst_tokens_per_s")
        return self


class PolicyConfig(BaseModel):
    """The scripted policy (``inference.emulator.policy``).

    The model calls a tool until the conversation holds ``tool_rounds`` tool results, then
    answers with ``text_tokens`` tokens of text; every response first thinks for
    ``reasoning_tokens`` hidden tokens (0: none) — or, with ``reasoning_tokens_p90`` above
    it, for a length drawn per response from the lognormal of that median and 90th
    percentile.  ``seed`` varies all choices.  A request
    can override each of them through its ``metadata`` (``inference.emulator.policy.METADATA_KEYS``).
    """

    model_config = ConfigDict(extra="forbid")

    tool_rounds: int = Field(
        default=3,
        ge=0,
        le=10_000,
        description="the model calls a tool until the conversation holds this many results",
    )
    # Bounded: planning an answer runs on the replica's event loop (~0.15 s per 64k tokens).
    text_tokens: int = Field(default=48, ge=1, le=65_536, description="length of the final text answer")
    reasoning_tokens: int = Field(
        default=0,
        ge=0,
        le=65_536,
        description="hidden reasoning tokens before every response (the median); 0 = none",
    )
    reasoning_tokens_p90: int = Field(
        default=0,
        ge=0,
        le=65_536,
        description="above reasoning_tokens: lengths drawn from a lognormal with this 90th percentile",
    )
    seed: int = Field(0, description="varies all the policy's choices")
    scenario: Scenario | None = Field(
        None, description="a scripted scenario every conversation follows (docs/replay.md); null: the policy"
    )


class PrefixCacheConfig(BaseModel):
    """Each replica's prefix (KV) cache (``inference.emulator.prefix_cache``): ``capacity_tokens``
    of KV held in blocks of ``block_tokens`` (a divisor of 128, so the reported cached
    tokens, in 128-token steps, never exceed what was reused); 0 disables it.

    Entries are scoped per API key, like the hosted API's per-organization prompt cache: a
    request's blocks are salted with its ``cache_scope`` (like vLLM's ``cache_salt``), which
    the session sets to its API key's fingerprint for WebSocket and HTTP requests alike.  So
    a key's socket and HTTP requests share entries (a full resend on the same key's new
    socket may hit) and two keys never do (docs/protocol.md check 27).  There is no option
    to share across keys; the former ``share_across_sessions`` is refused with a pointer here.
    """

    model_config = ConfigDict(extra="forbid")

    block_tokens: int = Field(default=32, ge=1, description="tokens per cached block (a divisor of 128)")
    capacity_tokens: int = Field(
        default=1 << 20, ge=0, description="tokens of KV each replica holds; 0 = off"
    )
    max_entries: int = Field(default=65_536, ge=1, description="entries of the breakpoint rule's cache")

    @model_validator(mode="before")
    @classmethod
    def _no_cross_key_sharing(cls, data: object) -> object:
        if isinstance(data, dict) and "share_across_sessions" in data:
            raise ValueError(
                "prefix_cache.share_across_sessions was removed: the prefix cache is "
                "scoped per API key, shared by its connections and HTTP requests "
                "(docs/emulator.md)"
            )
        return data

    @model_validator(mode="after")
    def _block_divides_128(self) -> PrefixCacheConfig:
        if 128 % self.block_tokens:
            raise ValueError("prefix_cache.block_tokens must divide 128")
        return self

    @property
    def capacity_blocks(self) -> int:
        return self.capacity_tokens // self.block_tokens


class RoutingConfig(BaseModel):
    """How a request picks its replica (``inference.routing``; the Serve request router in
    ``inference.emulator.deployment`` reads this when ``scaling.session_affinity`` is on).

    A WebSocket connection is pinned to one replica for its life; its first request, and
    every stateless (HTTP) request, goes where its *prefix route* says: rendezvous hashing
    of the API key's scope, the request's ``prompt_cache_key`` and its first
    ``prefix_tokens`` prompt tokens, with at most ``prefix_requests_per_min`` requests of
    one route per replica per minute before the overflow moves to the next-ranked replica.

    Source of the defaults: OpenAI's prompt-caching guide says requests are routed by a
    hash of the prompt's initial prefix ("typically the first 256 tokens") combined with
    ``prompt_cache_key``, and that above "approximately 15 requests per minute" for one
    prefix + key some requests overflow to additional machines.
    """

    model_config = ConfigDict(extra="forbid")

    prefix_tokens: int = Field(
        default=256, ge=0, description="prompt tokens hashed into a request's prefix route"
    )
    prefix_requests_per_min: int = Field(
        default=15,
        ge=1,
        description="requests of one route per replica per minute before the overflow moves on",
    )
    max_pinned_sessions: int = Field(
        default=65_536, ge=1, description="connections pinned to replicas, remembered"
    )
    max_routed_prefixes: int = Field(default=65_536, ge=1, description="prefix routes remembered")


class AutoscalingConfig(BaseModel):
    """Serve ``autoscaling_config`` for the inference deployment (a subset of its keys).

    ``target_sequences`` set: each replica reports its running + waiting sequences (every
    call, direct-channel ones included) and Serve keeps that many per replica
    (inference/serve_autoscaling.py); ``metrics_interval_s`` and ``look_back_period_s`` are
    how often a replica reports and over how long Serve averages.  Unset: Serve's own policy
    on the requests it routes (``target_ongoing_requests``: first calls of a connection only)."""

    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(default=1, ge=0, description="replicas always up")
    max_replicas: int = Field(default=4, ge=1, description="replicas at most")
    target_sequences: float | None = Field(
        default=None,
        gt=0,
        description="running + waiting sequences kept per replica; null: Serve's own policy",
    )
    target_ongoing_requests: float = Field(
        default=32, gt=0, description="Serve's own policy: routed requests per replica"
    )
    upscale_delay_s: float = Field(
        default=2.0, ge=0, description="load above target this long before a replica is added"
    )
    downscale_delay_s: float = Field(
        default=30.0, ge=0, description="load below target this long before a replica is removed"
    )
    metrics_interval_s: float = Field(
        default=2.0, gt=0, description="how often a replica reports its sequences"
    )
    look_back_period_s: float = Field(
        default=10.0, gt=0, description="Serve averages the reports over this window"
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError("autoscaling.min_replicas must be <= max_replicas")
        return self


class ScalingConfig(BaseModel):
    """How Serve runs the replicas (``inference.emulator.deployment.deployment_options``).

    ``autoscaling`` (if set) replaces the fixed ``InferenceConfig.replicas``.  With
    ``accelerator_resource`` set, each replica asks for ``accelerator_per_replica`` of that
    custom Ray resource, so on a cluster replicas land only on nodes started with it (e.g.
    ``ray start --resources='{"accelerator": 4}'``).  Replicas never reserve CPUs
    (``num_cpus=0``): on a laptop they share the cores with everything else.
    """

    model_config = ConfigDict(extra="forbid")

    autoscaling: AutoscalingConfig | None = Field(
        None, description="Serve autoscaling (replaces replicas); null = fixed"
    )
    accelerator_resource: str | None = Field(
        None, description="a custom Ray resource each replica asks for, e.g. accelerator; null = none"
    )
    accelerator_per_replica: float = Field(default=1.0, gt=0, description="how much of it a replica asks for")
    max_ongoing_requests: int = Field(default=2048, ge=1, description="Serve calls a replica takes at once")
    session_affinity: bool = Field(
        True, description="pin connections and route by prefix; false: Serve's default router"
    )
    nice: int = Field(
        0,
        ge=-20,
        le=19,
        description="added to each replica's threads' niceness at start, as nice -n does "
        "(inference/priority.py); needs CAP_SYS_NICE below 0, else it keeps its own (logged); "
        "0 = unchanged",
    )


class InferenceConfig(BaseModel):
    """Everything the inference deployment needs; ``default_model`` must be a profile id."""

    model_config = ConfigDict(extra="forbid")

    profiles: list[ModelProfile] = Field(
        min_length=1, description="the emulated models: each one's latency model"
    )
    policy: PolicyConfig = Field(PolicyConfig(), description="the scripted model: tool calls, then text")
    prefix_cache: PrefixCacheConfig = Field(
        PrefixCacheConfig(), description="each replica's prefix (KV) cache, scoped per API key"
    )
    routing: RoutingConfig = Field(RoutingConfig(), description="which replica a request goes to")
    replicas: int = Field(
        default=1, ge=1, description="fixed replica count, unless scaling.autoscaling is set"
    )
    scaling: ScalingConfig = Field(ScalingConfig(), description="how Serve runs the replicas")
    default_model: str = Field(description="the model of a request that names none (a profile id)")

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
        """The profile serving ``model_id``; raises ``UnknownModelProfile``."""
        for p in self.profiles:
            if p.id == model_id:
                return p
        raise UnknownModelProfile(model_id)


def load_inference_config(path: Path | None = None) -> InferenceConfig:
    """Read and validate the YAML config; ``path`` defaults to the packaged ``inference/emulator/models.yaml``."""
    text = (
        path.read_text(encoding="utf-8") if path is not None else DEFAULT_CONFIG.read_text(encoding="utf-8")
    )
    return InferenceConfig.model_validate(yaml.safe_load(text))
