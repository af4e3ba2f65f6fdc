"""Re-driving a session shape over one transport, step by step.

Each step sends the recorded new input items (re-synthesised, tool outputs answering the
calls the replay made) with the step's scripted turn, waits for the terminal event, then
spends the step's tool time (:class:`ToolTime`) before the next.  A compaction starts a
new chain on the same transport.  Human gaps (time before a user message) are waited for
only when asked, and reported apart.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from bench import breakpoints
from bench.conversation import TIMINGS_KEY, model_seconds, server_timings
from bench.transports import TRANSPORTS

from . import synth
from .shape import SessionShape


@dataclass(frozen=True)
class ToolTime:
    """How long a step's tools take: the recorded duration times ``scale``, or ``fixed_s``
    whenever a step made calls; ``scale=0``: no tool time."""

    scale: float = 1.0
    fixed_s: float | None = None

    @classmethod
    def parse(cls, text: str) -> ToolTime:
        """``recorded``, ``none``, ``xFACTOR`` (``x0.5``) or a fixed number of seconds."""
        text = text.strip().lower()
        if text == "recorded":
            return cls()
        if text == "none":
            return cls(scale=0.0)
        if text.startswith("x"):
            return cls(scale=float(text[1:]))
        return cls(fixed_s=float(text))

    def seconds(self, recorded_s: float, calls: int) -> float:
        if not calls:
            return 0.0
        return self.fixed_s if self.fixed_s is not None else recorded_s * self.scale


@dataclass
class StepRun:
    step: int
    total_ms: float = 0.0
    ttft_ms: float | None = None
    request_bytes: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    write_30m_tokens: int = 0  # written to the prompt cache, by lifetime (bench.breakpoints.figures)
    write_12h_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    calls: int = 0
    model_ms: float | None = None  # the server's queue + prefill + decode
    tool_ms: float = 0.0
    gap_ms: float = 0.0
    new_chain: bool = False
    error: str | None = None


@dataclass
class SessionRun:
    transport: str
    e2e_s: float = 0.0
    connect_ms: float = 0.0
    steps: list[StepRun] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # what the replay left out, and why
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def replay(
    session: SessionShape,
    transport: str,
    url: str,
    *,
    model: str,
    api_key: str,
    tool_time: ToolTime = ToolTime(),
    human_gaps: bool = False,
    cache_breakpoints: str | None = None,
) -> SessionRun:
    """One session over ``transport``; its end-to-end time includes connecting, tool time
    and (with ``human_gaps``) the recorded gaps.  ``cache_breakpoints`` (a ttl): place
    prompt-cache breakpoints as a client would (``bench.breakpoints``), the first one at the
    start of each chain."""
    run = SessionRun(transport)
    t = TRANSPORTS[transport](url, api_key)
    base = synth.base(session, model)
    call_ids: dict[tuple[int, int], str] = {}
    t0 = time.perf_counter()

    def skip(reason: str, n: int = 1) -> None:
        run.skipped[reason] = run.skipped.get(reason, 0) + n

    try:
        await t.open()
        run.connect_ms = (time.perf_counter() - t0) * 1000
        for step in session.steps:
            rec = StepRun(step.index, new_chain=step.new_chain)
            run.steps.append(rec)
            if step.new_chain:
                t.new_chain()
            if human_gaps and step.gap_s:
                started = time.perf_counter()
                await asyncio.sleep(step.gap_s)
                rec.gap_ms = (time.perf_counter() - started) * 1000
            items = [synth.input_item(session, step, i, item, call_ids) for i, item in enumerate(step.inputs)]
            if None in items:
                skip("tool output for a call the replay did not make", items.count(None))
            if cache_breakpoints:
                kept = breakpoints.place(
                    [i for i in items if i is not None],
                    first=step.index == 0 or step.new_chain,
                    ttl=cache_breakpoints,
                )
                items[:] = kept
            turn, dropped = synth.turn_script(step)
            if dropped:
                skip("calls past the metadata value's 512 characters", dropped)
            out = await t.turn(
                {**base, "metadata": synth.metadata(turn, TIMINGS_KEY)}, [i for i in items if i is not None]
            )
            rec.total_ms, rec.request_bytes, rec.error = out.total_s * 1000, out.request_bytes, out.error
            rec.ttft_ms = None if out.ttft_s is None else out.ttft_s * 1000
            if out.error or out.response is None:
                run.error = f"step {step.index}: {out.error}"
                break
            _usage(rec, out.response)
            calls = [o for o in out.response.get("output", []) if o.get("type") == "function_call"]
            for k, c in enumerate(calls):
                call_ids[(step.index, k)] = c["call_id"]
            pause = tool_time.seconds(step.tool_s, len(calls))
            if pause:
                started = time.perf_counter()
                await asyncio.sleep(pause)
                rec.tool_ms = (time.perf_counter() - started) * 1000
    except Exception as exc:  # noqa: BLE001 - a failed replay is a result, not a crash
        run.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        run.e2e_s = time.perf_counter() - t0
        try:
            await t.close()
        except Exception as exc:  # noqa: BLE001 - closing a broken transport must not hide the result
            run.error = run.error or f"close: {type(exc).__name__}"
    return run


def _usage(rec: StepRun, response: dict[str, Any]) -> None:
    usage = response.get("usage") or {}
    rec.input_tokens = usage.get("input_tokens", 0)
    rec.cached_tokens, rec.write_30m_tokens, rec.write_12h_tokens = breakpoints.figures(usage)
    rec.output_tokens = usage.get("output_tokens", 0)
    rec.reasoning_tokens = (usage.get("output_tokens_details") or {}).get("reasoning_tokens", 0)
    rec.calls = sum(1 for o in response.get("output", []) if o.get("type") == "function_call")
    model_s = model_seconds(server_timings(response))
    rec.model_ms = None if model_s is None else model_s * 1000
