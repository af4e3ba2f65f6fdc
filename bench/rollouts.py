"""Runs agent-loop rollouts over several transports, interleaved, and records every turn.

Rollout ``r`` is the same workload (same prompts, tool outputs, model script, tool times)
on every transport; jobs are queued transport by transport within each rollout index
(``ws#0, http-chained#0, http-full#0, ws#1, …``) and ``concurrency`` workers take them in
that order, so machine drift and load hit all transports alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from . import breakpoints as bp
from . import workload as wl
from .conversation import TIMINGS_KEY, model_seconds, server_timings
from .transports import TRANSPORTS, TurnOutcome

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


def _record(turn: int, out: TurnOutcome, model_time: ModelTime | None) -> TurnRecord:
    rec = TurnRecord(
        turn,
        None if out.ttft_s is None else out.ttft_s * 1000,
        out.total_s * 1000,
        out.request_bytes,
        error=out.error,
    )
    resp = out.response
    if resp:
        usage = resp.get("usage") or {}
        rec.input_tokens = usage.get("input_tokens", 0)
        rec.cached_tokens, rec.write_30m_tokens, rec.write_12h_tokens = bp.figures(usage)
        rec.output_tokens = usage.get("output_tokens", 0)
        rec.calls = sum(1 for o in resp.get("output", []) if o.get("type") == "function_call")
        rec.server = server_timings(resp)
        if model_time is not None and not out.error:
            rec.model_ms_est = model_time(rec.input_tokens, rec.cached_tokens, rec.output_tokens)
    return rec


def first_input(w: wl.Workload, rollout: int) -> list[dict[str, Any]]:
    """The first request's input: the resumed history (if any), then the task."""
    task = {"role": "user", "content": [{"type": "input_text", "text": wl.task(w, rollout)}]}
    return [*wl.history(w, rollout), task]


async def warm_resumed(url: str, w: wl.Workload, rollouts: Sequence[int], api_key: str) -> None:
    """Put each resumed history in the prefix cache before a transport runs it, as a session
    resumed within the provider's cache retention finds it (its first turn then hits on
    every transport alike instead of on whichever ran rollout ``r`` second).  One
    ``generate:false`` create per rollout (docs/protocol.md §4.11) over one socket."""
    from .client import connect

    socket = await connect(url, api_key=api_key)
    try:
        for r in rollouts:
            history = wl.history(w, r)
            if w.breakpoints:  # marked as the first turn will send it, so that turn reads it
                history = bp.place(history, first=True, ttl=w.breakpoint_ttl, resumed=len(history))
            answer = await socket.create(**wl.fixed(w), input=history, store=False, generate=False)
            if answer.response is None or answer.response.get("status") != "completed":
                raise RuntimeError(f"warming rollout {r}'s history failed: {answer.last}")
    finally:
        await socket.close()


async def run_rollout(
    transport: str,
    url: str,
    w: wl.Workload,
    rollout: int,
    *,
    api_key: str = "sk-bench",
    model_time: ModelTime | None = None,
    on_turn: Callable[[str, TurnRecord], None] | None = None,
) -> RolloutRecord:
    """One agent rollout; its end-to-end time includes connecting and the tool time."""
    rec = RolloutRecord(transport, rollout, wl.rounds(w, rollout))
    t = TRANSPORTS[transport](url, api_key)
    base = {**wl.fixed(w), "metadata": {**wl.metadata(w, rollout), TIMINGS_KEY: "1"}}
    new_items = first_input(w, rollout)
    if w.breakpoints:
        new_items = bp.place(new_items, first=True, ttl=w.breakpoint_ttl, resumed=len(new_items) - 1)
    t0 = time.perf_counter()
    try:
        await t.open()
        rec.connect_ms = (time.perf_counter() - t0) * 1000
        for turn in range(1, rec.tool_rounds + 2):
            out = await t.turn(base, new_items)
            turn_rec = _record(turn, out, model_time)
            rec.turns.append(turn_rec)
            if on_turn:
                on_turn(transport, turn_rec)
            if out.error or out.response is None:
                rec.error = f"turn {turn}: {out.error}"
                break
            calls = [o for o in out.response.get("output", []) if o.get("type") == "function_call"]
            if not calls:
                break
            # The tools run for ``pause`` in all, producing their outputs in that time (making
            # up the filler text is the simulated tool's work, not the transport's); tool
            # time is what the client actually spent, a late wake-up included.
            pause = wl.tool_time_s(w, rollout, turn)
            started = time.perf_counter()
            new_items = [
                {
                    "type": "function_call_output",
                    "call_id": c["call_id"],
                    "output": wl.tool_output(w, rollout, turn, i, c["name"]),
                }
                for i, c in enumerate(calls)
            ]
            if w.breakpoints:
                new_items = bp.place(new_items, first=False)
            await asyncio.sleep(max(0.0, pause - (time.perf_counter() - started)))
            turn_rec.tool_ms = (time.perf_counter() - started) * 1000
            rec.tool_s += turn_rec.tool_ms / 1000
    except Exception as exc:  # noqa: BLE001 - a failed rollout is a result, not a crash
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        rec.e2e_s = time.perf_counter() - t0
        if not rec.error:
            rec.model_s = rollout_model_s(rec.turns, server_timings(t.rollout_response))
        try:
            await t.close()
        except Exception as exc:  # noqa: BLE001 - closing a broken transport must not hide the result
            rec.error = rec.error or f"close: {type(exc).__name__}"
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
) -> list[RolloutRecord]:
    """Run ``rollouts`` rollouts on each transport, interleaved.  ``api_key`` names each
    transport's key: with ``{transport}`` in it (the default) every transport has its own
    prefix-cache scope, so the same rollout run on one transport does not warm the cache for
    the next (identical conversations render to identical prompts: docs/emulator.md)."""
    unknown = set(transports) - set(TRANSPORTS)
    if unknown:
        raise ValueError(f"unknown transports {sorted(unknown)}; known: {sorted(TRANSPORTS)}")
    keys = {t: api_key.format(transport=t) for t in transports}
    model_time = emulator_model_time(w.model)
    if warmup:  # pay first-use costs (actor pool, handles, store, tokenizer) outside the numbers
        short = replace(w, tool_rounds=2, shape=None, resume_tokens=0)
        for t in transports:
            await run_rollout(t, url, short, -1, api_key=keys[t])
        # A dedicated session actor is killed when its socket closes and the gateway's pool
        # starts a replacement (~1.3 s on this machine): let it refill before measuring.
        await asyncio.sleep(settle_s)
    jobs: asyncio.Queue[Any] = asyncio.Queue()
    for job in interleaved_jobs(transports, rollouts):
        jobs.put_nowait(job)
    results: list[RolloutRecord] = []

    async def worker() -> None:
        while not jobs.empty():
            transport, r = jobs.get_nowait()
            if w.resume_tokens:  # just before it runs: warming every rollout of every key up front
                # could evict the first ones' histories again (18 of ~66k tokens fill a replica's
                # 1M-token cache), and then their first turns missed on whichever transport ran first
                await warm_resumed(url, w, [r], keys[transport])
            results.append(
                await run_rollout(
                    transport, url, w, r, api_key=keys[transport], model_time=model_time, on_turn=on_turn
                )
            )

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return results
