"""The agentloop kind's rollouts over several transports, interleaved, every turn recorded:
run by the load runner's ``rollouts`` workload (bench/runner/agent.py), its records made into
one :class:`RolloutRecord` a rollout and transport here.

Rollout ``r`` is the same workload (same prompts, tool outputs, model script, tool times)
on every transport; jobs are queued transport by transport within each rollout index
(``ws#0, http-chained#0, http-full#0, ws#1, …``) and ``concurrency`` loops take them in
that order, so machine drift and load hit all transports alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from . import workload as wl
from .conversation import TIMINGS_KEY, model_seconds
from .runner.agent import first_input
from .runner.workloads import ROLLOUT_TRANSPORTS as TRANSPORTS

if TYPE_CHECKING:
    from .runner.model import TurnRecord as RunnerTurn

__all__ = ["PHASES", "TIMINGS_KEY", "RolloutRecord", "TurnRecord", "first_input", "run_bench"]
RUN_BOUND_S = 3600.0  # a run ends when its rollouts ran; at the latest after this

PHASES = (
    "parse_validate",
    "history_load",
    "render",
    "classify",
    "model_resolution",
    "queue",
    "prefill",
    "decode",
    "post",
)


@dataclass
class TurnRecord:
    turn: int
    ttft_ms: float | None
    total_ms: float
    request_bytes: int
    input_tokens: int = 0
    cached_tokens: int = 0
    write_30m_tokens: int = 0  # written to the prompt cache, by lifetime (bench.breakpoints.figures)
    write_12h_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    server: dict[str, float] | None = None  # server-side phase timings (ms), when reported
    model_ms_est: float | None = None  # the emulator's own time for this turn, modelled
    tool_ms: float = 0.0  # the client's tool run after this turn
    error: str | None = None


@dataclass
class RolloutRecord:
    transport: str
    rollout: int
    tool_rounds: int
    e2e_s: float = 0.0
    connect_ms: float = 0.0  # opening the transport (the WebSocket handshake + actor handoff)
    tool_s: float = 0.0
    # The server-reported model time (queue + prefill + decode) of the whole rollout, when
    # the server reports timings: the floor is ``model_s + tool_s``.
    model_s: float | None = None
    turns: list[TurnRecord] = field(default_factory=list)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rollout_model_s(turns: Sequence[TurnRecord], whole: dict[str, float] | None) -> float | None:
    """The rollout's model time: the sum over its turns' timings, or ``whole`` (timings
    the transport got once for the whole rollout, append mode); ``None`` unless every
    turn (or the whole) is covered."""
    if whole:
        return model_seconds(whole)
    per_turn = [model_seconds(t.server) for t in turns]
    known = [x for x in per_turn if x is not None]
    if not per_turn or len(known) < len(per_turn):
        return None
    return sum(known)


ModelTime = Callable[[int, int, int], float]  # (input, cached, output tokens) -> ms


def emulator_model_time(model: str) -> ModelTime | None:
    """The emulator's modelled TTFT + decode time for a turn, from inference/emulator/models.yaml.

    ``cached_tokens`` as reported is rounded down to 128 (OpenAI's rule), so the estimate
    may charge up to 127 tokens of prefill too many (~2.5 ms on emu-fast)."""
    from inference.emulator.pacing import decode_s, ttft_ms
    from inference.emulator.profiles import load_inference_config

    try:
        profile = load_inference_config().profile(model)
    except Exception:  # noqa: BLE001 - unknown model: no estimate
        return None
    return lambda inp, cached, out: ttft_ms(profile, inp, cached) + 1000.0 * decode_s(profile, max(out, 1))


def rollouts_of(
    records: Sequence[RunnerTurn], w: wl.Workload, model_time: ModelTime | None = None
) -> list[RolloutRecord]:
    """The runner's turn records of the rollouts workload as one :class:`RolloutRecord` a
    rollout and transport, in the order the rollouts ended."""
    by: dict[tuple[str, int], list[RunnerTurn]] = {}
    for r in records:
        assert r.transport is not None and r.rollout is not None, "a turn of the rollouts workload"
        by.setdefault((r.transport, r.rollout), []).append(r)
    out = []
    for (transport, rollout), turns in sorted(by.items(), key=lambda kv: kv[1][-1].done):
        rec = RolloutRecord(transport, rollout, wl.rounds(w, rollout))
        answered = [t for t in turns if t.turn]  # a failed warm-up or open sent no turn
        rec.connect_ms = (answered[0].connect_ms or 0.0) if answered else 0.0
        rec.e2e_s = turns[-1].rollout_s or 0.0
        whole = answered[-1].server if transport == "append" and answered else None
        for t in answered:
            rec.turns.append(_turn(t, model_time, None if transport == "append" else t.server))
            rec.tool_s += t.tool_ms / 1000
        failed = next((t for t in turns if not t.ok), None)
        if failed is not None:
            rec.error = f"turn {failed.turn}: {failed.error_code}" if failed.turn else failed.error_code
        else:
            rec.model_s = rollout_model_s(rec.turns, whole)
        out.append(rec)
    return out


def _turn(t: RunnerTurn, model_time: ModelTime | None, server: dict[str, float] | None) -> TurnRecord:
    rec = TurnRecord(
        t.turn or 0,
        t.ttft_ms,
        t.total_ms,
        t.request_bytes,
        input_tokens=t.input_tokens or 0,
        cached_tokens=t.cached_tokens or 0,
        write_30m_tokens=t.write_30m_tokens,
        write_12h_tokens=t.write_12h_tokens,
        output_tokens=t.output_tokens or 0,
        calls=t.calls,
        server=server,
        tool_ms=t.tool_ms,
        error=None if t.ok else t.error_code,
    )
    if model_time is not None and t.ok:
        rec.model_ms_est = model_time(rec.input_tokens, rec.cached_tokens, rec.output_tokens)
    return rec


def interleaved_jobs(transports: Sequence[str], rollouts: int) -> list[tuple[str, int]]:
    return [(t, r) for r in range(rollouts) for t in transports]


async def run_bench(
    url: str,
    w: wl.Workload,
    transports: Sequence[str],
    *,
    rollouts: int,
    concurrency: int = 1,
    warmup: bool = True,
    settle_s: float = 3.0,
    api_key: str = "sk-bench-{transport}",
    on_turn: Callable[[str, TurnRecord], None] | None = None,
    clients: list[dict[str, Any]] | None = None,
) -> list[RolloutRecord]:
    """Run ``rollouts`` rollouts on each transport, interleaved, ``concurrency`` at once, on the
    load runner (bench/runner's ``rollouts`` workload, in a client process of this machine).
    ``api_key`` names each transport's key: with ``{transport}`` in it (the default) every
    transport has its own prefix-cache scope, so the same rollout run on one transport does not
    warm the cache for the next (identical conversations render to identical prompts:
    docs/emulator.md).  ``warmup``: a short rollout per transport first, then ``settle_s``.
    ``on_turn`` sees each turn as the runner hands its records over (a rollout's when it ends);
    ``clients`` gets the client process's own figures (its CPU, event-loop lag, ``saturated``:
    bench/runner's ``ClientStats``)."""
    from .runner import LoadSpec, run_local
    from .runner.workloads import Rollouts

    unknown = set(transports) - set(TRANSPORTS)
    if unknown:
        raise ValueError(f"unknown transports {sorted(unknown)}; known: {sorted(TRANSPORTS)}")
    shape = Rollouts(tuple(transports), rollouts, api_key=api_key, warmup=warmup, settle_s=settle_s)
    spec = LoadSpec(
        targets=(url,),
        loops=max(1, concurrency),
        workload="rollouts",
        duration_s=RUN_BOUND_S,
        warmup_s=0.0,
        custom_workload=w,
        rollouts=shape,
    )
    model_time = emulator_model_time(w.model)

    def seen(batch: list[RunnerTurn]) -> None:
        for t in batch:
            if on_turn is not None and t.turn and t.transport is not None:
                on_turn(t.transport, _turn(t, None, None))

    result = await asyncio.to_thread(run_local, spec, on_records=seen)
    if clients is not None:
        clients.extend(c.as_dict() for c in result.clients)
    return rollouts_of(result.records, w, model_time)
