"""Opt-in "what-if" services: the hosted API's per-request services as explicit cost models.

Never the default.  With ``session.whatif`` switched on, every model call is preceded by
calls to two emulated services (Serve deployments in :mod:`inference.emulator.whatif_deployment`):

* a **neural safety classifier** on an accelerator: a fixed overhead per call, then the
  tokens it reads at a throughput shared by the replica's calls (one accelerator: work queues
  first in, first out);
* an **intermediate-service hop**: a fixed latency per request plus a cost per kilobyte of
  what it forwards.

Which tokens a call is charged for is the session's rule (``actors.backend.whatif_hook``): the same rule
as the keyword classifier's work, so the services cost the same per processed token on every
transport — a WebSocket turn reads the new tokens plus a carried window, an HTTP request the
whole history it re-processes.

Every parameter says where its default comes from, or that it is an assumption
(:func:`parameters` lists them; docs/whatif.md).  The cost models are pure functions of
these parameters, with the clock and the sleeper injected, so tests assert exact times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from inference.emulator.pacing import Clock, Sleeper

PROMPT_GUARD = "Prompt-Guard-86M model card, huggingface.co/meta-llama/Prompt-Guard-86M"
LATENCY_NUMBERS = "'Latency numbers every programmer should know' (J. Dean, P. Norvig)"
OPENAI_TOKENS = "OpenAI help center, 'What are tokens and how to count them?'"


def _param(default: Any, what: str, *, source: str | None = None, **kw: Any) -> Any:
    """A field whose description says what it is and where its default comes from."""
    origin = f"source: {source}" if source else "assumption"
    return Field(
        default, description=f"{what} [{origin}]", json_schema_extra={"source": source or "assumption"}, **kw
    )


class SafetyModelConfig(BaseModel):
    """A small encoder classifier (prompt-injection/jailbreak class, ~86M parameters) on one
    accelerator per replica."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="call the classifier before every model call")
    tokens_per_s: float = _param(
        500_000.0,
        "tokens one replica reads per second, calls sharing it first in, first out. "
        "Estimate: ~2 x 86M FLOPs per token is ~0.17 GFLOP, so a data-centre GPU at a fraction of its "
        "bf16 peak reads 10^5-10^6 tokens/s",
        gt=0,
    )
    overhead_ms: float = _param(
        3.0,
        "fixed time per call outside the token work: request handling, tokenisation, "
        "kernel launches, the reply",
        ge=0,
    )
    window_tokens: int = _param(
        512,
        "tokens of earlier conversation a carried (WebSocket) call reads again as context "
        "before the new tokens; the classifier's context window",
        source=PROMPT_GUARD,
        ge=0,
    )
    replicas: int = Field(1, ge=1, description="Serve replicas (one accelerator each)")
    max_ongoing_requests: int = Field(
        256, ge=1, description="calls a replica accepts at once (they queue on its accelerator)"
    )
    deployment: str = Field("WhatIfSafetyModel", description="Serve deployment name")


class HopConfig(BaseModel):
    """A network/service hop the request passes through (a front-end to a model service)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="pass every model call through the hop")
    latency_ms: float = _param(
        0.5, "fixed latency per request: one round trip within a data centre", source=LATENCY_NUMBERS, ge=0
    )
    per_kb_us: float = _param(
        10.0, "cost per kilobyte forwarded: sending 1 KB over a 1 Gbps network", source=LATENCY_NUMBERS, ge=0
    )
    bytes_per_token: float = _param(
        4.0, "bytes of text per token forwarded (English text)", source=OPENAI_TOKENS, gt=0
    )
    replicas: int = Field(1, ge=1, description="Serve replicas")
    max_ongoing_requests: int = Field(1024, ge=1, description="requests a replica accepts at once")
    deployment: str = Field("WhatIfHop", description="Serve deployment name")


class WhatIfConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    safety_model: SafetyModelConfig = Field(
        SafetyModelConfig(),
        description="a neural safety classifier on an accelerator, before every model call",
    )
    hop: HopConfig = Field(HopConfig(), description="an intermediate-service hop, before every model call")

    @property
    def enabled(self) -> bool:
        return self.safety_model.enabled or self.hop.enabled


def parameters(config: WhatIfConfig) -> list[dict[str, Any]]:
    """Each cost parameter of the enabled services with its value and source (``assumption``
    when there is none): what a measurement reports beside its numbers."""
    rows = []
    for name, section in (("safety_model", config.safety_model), ("hop", config.hop)):
        if not section.enabled:
            continue
        for field, info in type(section).model_fields.items():
            extra = info.json_schema_extra
            if isinstance(extra, dict) and "source" in extra:
                rows.append(
                    {
                        "parameter": f"{name}.{field}",
                        "value": getattr(section, field),
                        "source": extra["source"],
                    }
                )
    return rows


@dataclass(frozen=True, slots=True)
class ServiceReply:
    """What a service call cost: the tokens charged and the time spent (ms)."""

    tokens: int
    ms: float
    queue_ms: float = 0.0  # of ``ms``, waiting for the accelerator behind other calls


class SafetyModel:
    """One classifier replica's cost model.

    A call pays ``overhead_ms``, then waits for the accelerator, which reads every call's
    tokens in arrival order at ``tokens_per_s`` (a call's slot is reserved when it arrives,
    so the order is exact without a lock)."""

    def __init__(self, config: SafetyModelConfig, clock: Clock, sleeper: Sleeper) -> None:
        self._config = config
        self._clock = clock
        self._sleeper = sleeper
        self._free_at = 0.0  # when the accelerator has read every call accepted so far
        self.calls = 0
        self.tokens = 0

    async def classify(self, tokens: int) -> ServiceReply:
        cfg = self._config
        start = self._clock.now()
        ready = start + cfg.overhead_ms / 1000.0
        begin = max(ready, self._free_at)
        end = begin + tokens / cfg.tokens_per_s
        self._free_at = end
        self.calls += 1
        self.tokens += tokens
        await self._sleeper.sleep_until(end)
        return ServiceReply(tokens, (end - start) * 1000.0, (begin - ready) * 1000.0)


def hop_seconds(config: HopConfig, tokens: int) -> float:
    """The hop's time for a request forwarding ``tokens`` tokens."""
    kb = tokens * config.bytes_per_token / 1024.0
    return config.latency_ms / 1000.0 + kb * config.per_kb_us / 1e6


class Hop:
    """One hop replica's cost model: requests do not wait for each other."""

    def __init__(self, config: HopConfig, clock: Clock, sleeper: Sleeper) -> None:
        self._config = config
        self._clock = clock
        self._sleeper = sleeper
        self.calls = 0
        self.tokens = 0

    async def forward(self, tokens: int) -> ServiceReply:
        start = self._clock.now()
        end = start + hop_seconds(self._config, tokens)
        self.calls += 1
        self.tokens += tokens
        await self._sleeper.sleep_until(end)
        return ServiceReply(tokens, (end - start) * 1000.0)
