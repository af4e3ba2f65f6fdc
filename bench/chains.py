"""Agent chains over checked WebSockets: the soak's client (bench/kinds/soak.py).

A *slot* holds one connection at a time and runs chains on it: ``response.create`` with
``store:false``, ``previous_response_id`` of the chain's last response and only the new
input (the tool's ``function_call_output`` after a function call), a think/tool pause in
between.  The emulated model calls a tool on every turn of a chain but the last
(``metadata["emulator.tool_rounds"]``), so both event orders of docs/protocol.md §3.2/§3.3 occur.
Every create and event goes through :mod:`bench.invariants`; client timings go to
:class:`Load`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from . import workload as wl
from .invariants import ConnectionCheck, RunCheck
from .rollouts import TIMINGS_KEY, server_timings
from .transports import TurnOutcome, WebSocketTransport


@dataclass(frozen=True)
class SoakPlan:
    connections: int = 200
    turns: int = 30  # per chain (one connection)
    duration_s: float | None = None  # reconnect with fresh chains until this much time passed
    ramp_s: float = 20.0  # connections open evenly spread over this
    think_ms: float = 5000.0  # client tool time between turns, mean (uniform ±50 %)
    system_tokens: int = 300
    tool_def_tokens: int = 600
    tool_output_tokens: int = 150
    text_tokens: int = 24
    model: str = "emu-fast"
    seed: int = 0
    sample_s: float | None = 3.0  # memory sampling period; None: no sampling
    drain_s: float = 0.05  # after a chain's last turn, wait this long for stray events

    def workload(self) -> wl.Workload:
        return wl.Workload(
            model=self.model,
            tool_rounds=self.turns - 1,
            system_tokens=self.system_tokens,
            tool_def_tokens=self.tool_def_tokens,
            task_tokens=40,
            tool_output_tokens=self.tool_output_tokens,
            text_tokens=self.text_tokens,
            tool_time_ms=self.think_ms,
            seed=self.seed,
        )


@dataclass
class Load:
    """What the client measured, besides the invariants."""

    open: int = 0
    peak_open: int = 0
    opened: int = 0
    turns: int = 0  # completed responses
    connect_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    model_ttft_ms: list[float] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)
    queue_ms: list[float] = field(default_factory=list)
    api_overhead_ms: list[float] = field(default_factory=list)
    done_at: list[float] = field(default_factory=list)  # monotonic time of each completed turn
    overhead_by_turn: dict[int, list[float]] = field(default_factory=dict)  # turn of its chain → ms
    model_ttft_source: Counter[str] = field(default_factory=Counter)

    def connected(self, ms: float) -> None:
        self.open += 1
        self.opened += 1
        self.peak_open = max(self.peak_open, self.open)
        self.connect_ms.append(ms)

    def record(self, turn: int, out: TurnOutcome, profile: Any) -> None:
        if out.error or out.response is None:
            return
        self.turns += 1
        self.done_at.append(time.monotonic())
        model, source = model_ttft_ms(out.response, profile)
        self.model_ttft_source[source] += 1
        timings = server_timings(out.response) or {}
        if "api_overhead" in timings:
            self.api_overhead_ms.append(timings["api_overhead"])
        if "queue" in timings:
            self.queue_ms.append(timings["queue"])
        if out.ttft_s is not None:
            self.ttft_ms.append(out.ttft_s * 1000)
            if model is not None:
                self.model_ttft_ms.append(model)
                self.overhead_ms.append(out.ttft_s * 1000 - model)
                self.overhead_by_turn.setdefault(turn, []).append(self.overhead_ms[-1])


def model_ttft_ms(response: dict[str, Any], profile: Any) -> tuple[float | None, str]:
    """The emulator's own time to first token for this response: ``queue + prefill`` as the
    replica reported them (``timings``), else the profile's prefill formula on the reported
    usage (``profile``; no queue, and cached tokens rounded down to 128, so it may charge up
    to 127 tokens of prefill too many)."""
    t = server_timings(response)
    if t and "prefill" in t:
        return t.get("queue", 0.0) + t["prefill"], "timings"
    if profile is not None:
        from inference.emulator.pacing import ttft_ms

        usage = response.get("usage") or {}
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
        return ttft_ms(profile, usage.get("input_tokens", 0), cached), "profile"
    return None, "none"


class CheckedWebSocket(WebSocketTransport):
    """The benchmark's ``ws`` transport with every create and event shown to a checker."""

    def __init__(self, base_url: str, check: ConnectionCheck) -> None:
        super().__init__(base_url)
        self.check = check
        self.on_event = check.feed

    async def turn(self, base, new_items):
        self.check.create_sent(self._prev)
        return await super().turn(base, new_items)

    async def drain(self, timeout_s: float) -> None:
        """Events that arrive after the last terminal are stray: the checker sees them."""
        await self.socket.drain(timeout_s)


def chain_turns(plan: SoakPlan, slot: int, chain: int) -> int:
    """Turns of a slot's chain.  With a duration, first chains are cut short at evenly spread
    lengths (1 … turns), so connection ages — and the conversation state held — are spread
    out and stay steady as chains end and reconnect, instead of all growing and resetting
    in step."""
    if plan.duration_s is None or chain > 0:
        return plan.turns
    return 1 + (slot * plan.turns) // max(1, plan.connections)


async def run_slot(
    slot: int,
    url: str,
    plan: SoakPlan,
    check: RunCheck,
    load: Load,
    t_end: float | None,
    profile: Any,
    *,
    run: int = 0,
) -> None:
    """One connection slot: chains, one connection each, until ``t_end`` (then the running
    chain stops at its next turn boundary), or one chain without ``t_end``.
    ``run`` numbers repeated runs of the plan (their prompts and names differ)."""
    await asyncio.sleep(slot * plan.ramp_s / max(1, plan.connections))
    w = plan.workload()
    instructions, tools = wl.instructions(w.system_tokens, w.seed), wl.tools(w)
    chain = 0
    while True:
        turns = chain_turns(plan, slot, chain)
        cw = dataclasses.replace(w, tool_rounds=turns - 1)  # a text answer ends every chain
        rollout = (run * plan.connections + slot) * 10_000 + chain
        conn = check.connection(f"r{run}.c{slot}.{chain}")
        ws = CheckedWebSocket(url, conn)
        base = {
            "model": w.model,
            "instructions": instructions,
            "tools": tools,
            "metadata": {**wl.metadata(cw, rollout), TIMINGS_KEY: "1"},
        }
        items: list[dict[str, Any]] = [{"role": "user", "content": wl.task(w, rollout)}]
        t0 = time.perf_counter()
        try:
            await ws.open()
        except Exception as exc:  # noqa: BLE001 - a refused connection is a result
            check.violate("connection", conn.name, None, f"connect: {type(exc).__name__}: {exc}")
            return
        load.connected((time.perf_counter() - t0) * 1000)
        try:
            for turn in range(1, turns + 1):
                out = await ws.turn(base, items)
                load.record(turn, out, profile)
                if out.error or out.response is None or turn == turns:
                    break
                if t_end is not None and time.monotonic() >= t_end:
                    break  # the duration is over: the chain ends at this turn boundary
                await asyncio.sleep(wl.tool_time_s(w, rollout, turn))
                calls = [o for o in out.response["output"] if o.get("type") == "function_call"]
                items = [
                    {
                        "type": "function_call_output",
                        "call_id": c["call_id"],
                        "output": wl.tool_output(w, rollout, turn, i, c["name"]),
                    }
                    for i, c in enumerate(calls)
                ] or [{"role": "user", "content": "Go on."}]
            await ws.drain(plan.drain_s)
        except Exception as exc:  # noqa: BLE001 - e.g. the server closed the socket mid-chain
            check.violate("connection", conn.name, None, f"{type(exc).__name__}: {exc}"[:300])
        finally:
            conn.close()
            with contextlib.suppress(Exception):
                await ws.close()
            load.open -= 1
        chain += 1
        if t_end is None or time.monotonic() >= t_end:
            return
