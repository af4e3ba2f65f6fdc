"""Memory per connection: one connection's cache grows past ``session.max_cached_tokens``
and its session actor's memory levels off (docs/reliability.md, "Memory per connection").

    responses-ws bench memory [--max-cached-tokens 200000] [--lanes 4] [--turns 60]
                              [--input-tokens 6000] [--rounds 3] [--out results/conn_memory.json]

One WebSocket connection runs ``--turns`` ``store:false`` turns round-robin over ``--lanes``
lanes, each turn continuing its lane with ``--input-tokens`` tokens of fresh text, so the
connection's cached context grows by about that much per turn.  The session actor's USS
(the connection's actor is found by the TCP socket it holds) is sampled after every turn.

The client feeds the turns it saw to its model of the documented cache rule
(:class:`CacheModel`: after a turn the other lanes are evicted, least recently updated first,
while the connection holds more than ``max_cached_tokens``), so it knows which lane ids must
now be gone; it continues an evicted lane from its old id anyway, requires
``previous_response_not_found``, and restarts the lane.  Reported: bytes per cached token
(least squares over the turns before the first eviction), the plateau after it, every
eviction's verification.

Then the connection's actor after close: with the default pool (one connection per actor)
whether it survives; with ``connections_per_actor: 2`` (the actor is kept and reused)
``--rounds`` connections in a row on the same actor, its USS after each close against the
idle baseline.  Last, one lane alone grows past ``max_cached_tokens``: the lane being
continued is never evicted, so it is bounded by ``session.max_input_tokens`` instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from inference import chat_format
from serve.config import AppConfig
from serve.embedded import embedded_ray, embedded_server, local_config

from .. import results
from ..client import ResponsesSocket, connect
from ..processes import flatness, session_host_pids, uss_mb
from ..stats import line, mean

TEXT = {"emulator.tool_rounds": "0", "emulator.text_tokens": "16"}
MODEL = "emu-fast"
SETTLE_S = 3.0  # after a close: the actor drops the connection's objects

SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ran",
    "tes",
    "vo",
    "pel",
    "dun",
    "shi",
    "gar",
    "nop",
    "ul",
    "ber",
    "cos",
    "fi",
    "ja",
    "quen",
    "ro",
    "sta",
    "wel",
    "zi",
    "mor",
    "tak",
    "ep",
]


def fresh_text(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` cl100k tokens of made-up words (new strings every turn; ~2.25
    tokens per word, measured)."""
    words = ("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(tokens * 4 // 9))
    lines, line = [], []
    for w in words:
        line.append(w)
        if len(line) == 12:
            lines.append(" ".join(line) + ".")
            line = []
    return "\n".join(lines)


def rendered_output_tokens(response: dict[str, Any]) -> int:
    """Tokens the response's output adds to its lane's cached context: each output item in
    the model's chat format (:mod:`inference.chat_format`, the emulated models' public
    format, docs/emulator.md), as the session renders it."""
    tokens = 0
    for out in response["output"]:
        if out["type"] == "message":
            text = "".join(p["text"] for p in out["content"] if p.get("type") == "output_text")
            tokens += len(chat_format.render_message("assistant", text))
        elif out["type"] == "function_call":
            tokens += len(chat_format.render_function_call(out["name"], out["arguments"]))
        else:
            raise ValueError(f"no rendering of an output item of type {out['type']!r} here")
    return tokens


def connection(url: str) -> connect:
    """A connection to the server at ``url`` (permessage-deflate on, as measured)."""
    return connect(url, compression="deflate", open_timeout=120)


async def create(sock: ResponsesSocket, **body: Any) -> tuple[dict[str, Any], float]:
    """A ``store:false`` text turn: its final event and its round trip in ms."""
    answer = await sock.create(model=MODEL, store=False, metadata=TEXT, **body)
    assert answer.last is not None  # create returns on its final event
    return answer.last, answer.total_s * 1000


def actor_of(sock: ResponsesSocket) -> int:
    """The pid of the session actor holding this client's TCP connection."""
    client = sock.local_address
    for pid in session_host_pids():
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(c.raddr and (c.raddr.ip, c.raddr.port) == client for c in conns):
            return pid
    raise RuntimeError("no session actor holds this connection")


async def uss(pid: int) -> float:
    return await asyncio.to_thread(uss_mb, [pid])


@dataclass
class CacheModel:
    """What the server caches on one connection, by its documented rule (docs/protocol.md
    §4.2): after a turn, the connection's other lanes are evicted, least recently updated
    first, while it holds more than ``cap`` tokens (``session.max_cached_tokens``); the lane
    just continued is kept.  The client's own model:
    tests/bench/test_conn_memory.py checks it against the session core."""

    cap: int
    ids: dict[str, str] = field(default_factory=dict)  # lane -> latest response id
    tokens: dict[str, int] = field(default_factory=dict)  # cached lanes, least recently updated first

    def finished(self, lane: str, response_id: str, context_tokens: int) -> list[tuple[str, str]]:
        """A turn on ``lane`` completed; returns the (lane, id) entries it evicted, least
        recently updated first."""
        self.tokens.pop(lane, None)
        self.tokens[lane], self.ids[lane] = context_tokens, response_id
        evicted = []
        for other in [x for x in self.tokens if x != lane]:
            if self.total <= self.cap:
                break
            del self.tokens[other]
            evicted.append((other, self.ids[other]))
        return evicted

    @property
    def lru(self) -> list[str]:
        """The cached lanes, least recently updated first."""
        return list(self.tokens)

    @property
    def total(self) -> int:
        return sum(self.tokens.values())


async def grow(
    url: str,
    *,
    lanes: int,
    turns: int,
    input_tokens: int,
    cap: int,
    seed: int,
    pid_box: list[int] | None = None,
) -> dict[str, Any]:
    """One connection, ``turns`` turns round-robin over ``lanes`` lanes; USS after each."""
    rng = random.Random(seed)
    model = CacheModel(cap)
    gone: dict[str, str] = {}  # lane -> its evicted id, checked on the lane's next turn
    samples, checks, mismatches = [], [], []
    async with connection(url) as ws:
        pid = actor_of(ws)
        if pid_box is not None:
            pid_box.append(pid)
        base = await uss(pid)
        for i in range(turns):
            lane = f"lane{i % lanes}"
            text = fresh_text(rng, input_tokens)
            if lane in gone:  # the model says it was evicted: the server must agree
                evicted_id = gone.pop(lane)
                ev, _ = await create(ws, stream_id=lane, input="continue", previous_response_id=evicted_id)
                checks.append(
                    {
                        "turn": i,
                        "lane": lane,
                        "id": evicted_id,
                        "type": ev["type"],
                        "code": ev.get("error", {}).get("code"),
                        "ok": ev.get("error", {}).get("code") == "previous_response_not_found",
                    }
                )
            prev = model.ids.get(lane) if lane in model.tokens else None
            ev, ms = await create(ws, stream_id=lane, input=text, previous_response_id=prev)
            if ev["type"] != "response.completed":
                raise RuntimeError(f"turn {i} on {lane}: {ev}")
            r = ev["response"]
            expected_prompt = model.tokens[lane] if prev else 0
            prompt = r["usage"]["input_tokens"]
            new_tokens = prompt - expected_prompt
            if prev is not None and not (0 < new_tokens <= 2 * input_tokens):
                mismatches.append(
                    {"turn": i, "lane": lane, "input_tokens": prompt, "model_tokens": expected_prompt}
                )
            evicted = model.finished(lane, r["id"], prompt + rendered_output_tokens(r))
            for lane_out, rid in evicted:
                gone[lane_out] = rid
            mem = await uss(pid)
            samples.append(
                {
                    "turn": i,
                    "lane": lane,
                    "continued": prev is not None,
                    "input_tokens": prompt,
                    "cached_tokens_reported": r["usage"]["input_tokens_details"]["cached_tokens"],
                    "connection_cached_tokens": model.total,
                    "evicted": [x for x, _ in evicted],
                    "uss_mb": mem,
                    "turn_ms": ms,
                }
            )
            print(
                f"  turn {i:3d} {lane:6s} context {model.total / 1000:6.1f}k tokens  USS {mem:7.1f} MiB"
                f"{'  evicted ' + ','.join(x for x, _ in evicted) if evicted else ''}",
                flush=True,
            )
        # The ids the model still holds must continue (the model is right both ways); a
        # continuation may evict another lane, checked like the others.
        kept = []
        for lane in list(model.lru):
            if lane not in model.tokens:
                continue
            ev, _ = await create(ws, stream_id=lane, input="continue", previous_response_id=model.ids[lane])
            kept.append({"lane": lane, "type": ev["type"]})
            if ev["type"] == "response.completed":
                r = ev["response"]
                gone.update(
                    model.finished(lane, r["id"], r["usage"]["input_tokens"] + rendered_output_tokens(r))
                )
        for lane, evicted_id in gone.items():  # evicted by the last turns: no later turn checked them
            ev, _ = await create(ws, stream_id=lane, input="continue", previous_response_id=evicted_id)
            checks.append(
                {
                    "turn": turns,
                    "lane": lane,
                    "id": evicted_id,
                    "type": ev["type"],
                    "code": ev.get("error", {}).get("code"),
                    "ok": ev.get("error", {}).get("code") == "previous_response_not_found",
                }
            )
    return {
        "pid": pid,
        "uss_mb_at_open": base,
        "samples": samples,
        "eviction_checks": checks,
        "kept_checks": kept,
        "model_mismatches": mismatches,
    }


def analyse(run: dict[str, Any], cap: int) -> dict[str, Any]:
    samples = run["samples"]
    first_evict = next((s["turn"] for s in samples if s["evicted"]), None)
    growth = [s for s in samples if first_evict is None or s["turn"] < first_evict]
    xs = [s["connection_cached_tokens"] for s in growth]
    ys = [s["uss_mb"] * 2**20 for s in growth]
    fit = line(xs, ys) if len(xs) >= 3 else None
    slope, intercept = fit if fit is not None else (None, None)
    r2 = None
    if fit is not None:
        my = mean(ys) or 0.0
        ss_res = sum((y - (fit[1] + fit[0] * x)) ** 2 for x, y in zip(xs, ys))
        ss_tot = sum((y - my) ** 2 for y in ys)
        r2 = 1 - ss_res / ss_tot if ss_tot else None
    after = [s for s in samples if first_evict is not None and s["turn"] >= first_evict]
    uss_after = [s["uss_mb"] for s in after]
    return {
        "uss_mb_at_open": run["uss_mb_at_open"],
        "first_eviction_turn": first_evict,
        "bytes_per_cached_token": slope,
        "fit_intercept_mb": intercept / 2**20 if intercept is not None else None,
        "fit_r2": r2,
        "uss_mb_before_first_eviction": growth[-1]["uss_mb"] if growth else None,
        "plateau_uss_mb": {"mean": mean(uss_after), "max": max(uss_after), "min": min(uss_after)}
        if uss_after
        else None,
        "plateau_flatness": flatness(uss_after) if len(uss_after) >= 6 else None,
        "predicted_uss_mb_at_cap": (fit[1] + fit[0] * cap) / 2**20 if fit is not None else None,
        "peak_connection_cached_tokens": max(s["connection_cached_tokens"] for s in samples),
        "evictions": sum(len(s["evicted"]) for s in samples),
        "eviction_checks_ok": sum(c["ok"] for c in run["eviction_checks"]),
        "eviction_checks": len(run["eviction_checks"]),
        "kept_lanes_continue": all(k["type"] == "response.completed" for k in run["kept_checks"]),
        "model_mismatches": len(run["model_mismatches"]),
    }


def app_config(cap: int, per_actor: int) -> AppConfig:
    return local_config(
        None,
        **{
            "session.max_cached_tokens": cap,
            "session.connections_per_actor": per_actor,
            "session.warm_actors": 1,
        },
    )


async def wait_alive(pid: int) -> bool:
    await asyncio.sleep(SETTLE_S)
    return psutil.pid_exists(pid) and pid in session_host_pids()


async def default_pool_phase(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Default config (one connection per actor): the growth run, then is the actor kept?"""
    pid_box: list[int] = []
    idle_before = {pid: await uss(pid) for pid in session_host_pids()}
    run = await grow(
        url,
        lanes=args.lanes,
        turns=args.turns,
        input_tokens=args.input_tokens,
        cap=args.max_cached_tokens,
        seed=1,
        pid_box=pid_box,
    )
    pid = pid_box[0]
    alive = await wait_alive(pid)
    after = await uss(pid) if alive else None
    async with connection(url) as ws:
        next_pid = actor_of(ws)
        await create(ws, input="hello")
    return {
        "run": run,
        "summary": analyse(run, args.max_cached_tokens),
        "idle_actors_uss_mb_before": idle_before,
        "actor_alive_after_close": alive,
        "uss_mb_after_close": after,
        "next_connection_same_actor": next_pid == pid,
    }


async def reuse_phase(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """``connections_per_actor: 2``: the actor is kept when its connection closes; rounds of
    the growth run on the same actor, USS after each close against the idle baseline."""
    async with connection(url) as ws:
        pid = actor_of(ws)
    await asyncio.sleep(SETTLE_S)
    idle = await uss(pid)
    rounds = []
    for k in range(args.rounds):
        box: list[int] = []
        run = await grow(
            url,
            lanes=args.lanes,
            turns=args.turns,
            input_tokens=args.input_tokens,
            cap=args.max_cached_tokens,
            seed=100 + k,
            pid_box=box,
        )
        await asyncio.sleep(SETTLE_S)
        closed = await uss(pid)
        rounds.append(
            {
                "same_actor": box[0] == pid,
                "peak_uss_mb": max(s["uss_mb"] for s in run["samples"]),
                "uss_mb_after_close": closed,
                "summary": analyse(run, args.max_cached_tokens),
            }
        )
        print(
            f"  round {k}: same actor {box[0] == pid}, peak {rounds[-1]['peak_uss_mb']:.1f} MiB, "
            f"after close {closed:.1f} MiB (idle baseline {idle:.1f})",
            flush=True,
        )
    return {"pid": pid, "idle_uss_mb": idle, "rounds": rounds}


async def single_lane_phase(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One lane only: the lane being continued is never evicted, so its context grows past
    max_cached_tokens until the request hits session.max_input_tokens."""
    rng = random.Random(7)
    samples = []
    async with connection(url) as ws:
        pid = actor_of(ws)
        prev, base = None, await uss(pid)
        limit_error = None
        for i in range(args.single_lane_turns):
            ev, _ = await create(
                ws,
                stream_id="only",
                input=fresh_text(rng, args.single_lane_input_tokens),
                previous_response_id=prev,
            )
            if ev["type"] != "response.completed":
                limit_error = {"turn": i, "type": ev["type"], "code": ev.get("error", {}).get("code")}
                break
            r = ev["response"]
            prev = r["id"]
            context = r["usage"]["input_tokens"] + rendered_output_tokens(r)
            samples.append({"turn": i, "context_tokens": context, "uss_mb": await uss(pid)})
            print(
                f"  single lane turn {i:3d} context {context / 1000:6.1f}k tokens  USS {samples[-1]['uss_mb']:7.1f} MiB",
                flush=True,
            )
        still = None
        if prev is not None:
            ev, _ = await create(
                ws, stream_id="only", input="still there?", previous_response_id=prev, max_output_tokens=16
            )
            still = ev["type"]
    return {
        "pid": pid,
        "uss_mb_at_open": base,
        "samples": samples,
        "stopped_by": limit_error,
        "largest_context_tokens": max((s["context_tokens"] for s in samples), default=0),
        "peak_uss_mb": max((s["uss_mb"] for s in samples), default=None),
        "latest_id_still_continues": still,
    }


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = result["config"]
    t = Table(
        title=f"Memory per connection (max_cached_tokens={cfg['max_cached_tokens']}, {cfg['lanes']} lanes, "
        f"{cfg['input_tokens']} input tokens per turn)"
    )
    t.add_column("what")
    t.add_column("value", justify="right")

    def mb(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f} MiB"

    if "default_pool" in result:
        d, pool = result["default_pool"]["summary"], result["default_pool"]
        t.add_row("USS at open (idle actor + empty connection)", mb(d["uss_mb_at_open"]))
        t.add_row("first eviction at turn", str(d["first_eviction_turn"]))
        t.add_row("USS just before the first eviction", mb(d["uss_mb_before_first_eviction"]))
        t.add_row(
            "bytes per cached token (fit before eviction)",
            "-"
            if d["bytes_per_cached_token"] is None
            else f"{d['bytes_per_cached_token']:.1f} (r² {d['fit_r2']:.3f})",
        )
        t.add_row("predicted USS at the cap", mb(d["predicted_uss_mb_at_cap"]))
        if d["plateau_uss_mb"]:
            p, f = d["plateau_uss_mb"], d["plateau_flatness"]
            t.add_row(
                "USS after eviction starts (mean / min / max)",
                f"{p['mean']:.1f} / {p['min']:.1f} / {p['max']:.1f} MiB",
            )
            if f:
                t.add_row(
                    "plateau flat (last third vs middle third)",
                    f"{f['flat']} (change {f['change_mb']:+.1f} MiB, band {f['band_mb']:.1f})",
                )
        t.add_row("peak cached tokens on the connection", f"{d['peak_connection_cached_tokens']:,}")
        t.add_row(
            "evicted ids → previous_response_not_found", f"{d['eviction_checks_ok']} / {d['eviction_checks']}"
        )
        t.add_row("ids still cached continue", str(d["kept_lanes_continue"]))
        t.add_row("default pool: actor alive after close", str(pool["actor_alive_after_close"]))
        t.add_row("default pool: USS after close", mb(pool["uss_mb_after_close"]))
        t.add_row("default pool: next connection on the same actor", str(pool["next_connection_same_actor"]))
    if "reuse" in result:
        r = result["reuse"]
        t.add_row("reuse (2 per actor): idle baseline", mb(r["idle_uss_mb"]))
        for k, rnd in enumerate(r["rounds"]):
            t.add_row(
                f"  round {k}: same actor / peak / after close",
                f"{rnd['same_actor']} / {rnd['peak_uss_mb']:.1f} / {rnd['uss_mb_after_close']:.1f} MiB",
            )
    if "single_lane" in result:
        s = result["single_lane"]
        t.add_row("single lane: largest context", f"{s['largest_context_tokens']:,} tokens")
        t.add_row(
            "single lane: USS at open → peak", f"{s['uss_mb_at_open']:.1f} → {s['peak_uss_mb'] or 0:.1f} MiB"
        )
        t.add_row("single lane: stopped by", json.dumps(s["stopped_by"]))
    Console().print(t)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-cached-tokens", type=int, default=200_000)
    p.add_argument("--lanes", type=int, default=4)
    p.add_argument("--turns", type=int, default=60)
    p.add_argument("--input-tokens", type=int, default=6000)
    p.add_argument("--rounds", type=int, default=3, help="connections in a row on one reused actor")
    p.add_argument("--single-lane-turns", type=int, default=30)
    p.add_argument("--single-lane-input-tokens", type=int, default=20_000)
    p.add_argument("--phases", default="default,single,reuse", help="comma-separated subset to run")
    p.add_argument("--out", type=Path, default=Path("results/conn_memory.json"))


def run(args: argparse.Namespace) -> int:
    result: dict[str, Any] = {
        "command": args.command,
        "config": {
            "max_cached_tokens": args.max_cached_tokens,
            "lanes": args.lanes,
            "turns": args.turns,
            "input_tokens": args.input_tokens,
            "rounds": args.rounds,
            "model": MODEL,
            "metadata": TEXT,
        },
    }
    phases = set(args.phases.split(","))
    with embedded_ray(num_cpus=2):
        if phases & {"default", "single"}:
            with embedded_server(app_config(args.max_cached_tokens, 1), name="conn-memory") as url:
                if "default" in phases:
                    print("default pool (one connection per actor):", flush=True)
                    result["default_pool"] = asyncio.run(default_pool_phase(url, args))
                if "single" in phases:
                    print("single lane:", flush=True)
                    result["single_lane"] = asyncio.run(single_lane_phase(url, args))
        if "reuse" in phases:
            print("reuse (two connections per actor):", flush=True)
            with embedded_server(app_config(args.max_cached_tokens, 2), name="conn-memory-reuse") as url:
                result["reuse"] = asyncio.run(reuse_phase(url, args))
    results.write(args.out, result, args.run)
    print_table(result)
    print(f"saved {args.out}")
    return 0
