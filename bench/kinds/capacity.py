"""A node's capacity: N concurrent Codex-like loops, from client processes of their own.

    responses-ws bench capacity [--loops 1,16,64,256,1024] [--duration 30] [--clients 2]
                                [--preset codex] [--url URL] [--out results/capacity.json]

For each N in ``--loops`` (one embedded server on the default configuration for all of them,
or ``--url``), N loops run in ``--clients`` separate client processes (raw WebSocket
clients, as little client work as possible: the creates are pre-encoded, only each answer's
terminal frame is parsed).  A loop is one socket running the ``--preset`` workload of
bench/workload.py: its rollout's first create resends the instructions, the tools and the
resumed history (the ``codex`` preset's ~60k tokens: what a client reconnecting after a node
drain sends), then turns chained with ``previous_response_id`` carrying the tool outputs,
each after the tool's time; a rollout that ends starts the next on the same socket.

1. every loop connects; then the N first turns are released at once (a reconnect storm);
2. the loops run on for ``--duration`` seconds (steady state).

Reported per N: turns/s in the steady window; p50/p99 non-model time per turn (the client's
turn time less the server's reported queue + prefill + decode) for steady turns (chained)
and for the first turns apart (and a rollout's later first turns as ``rollout_first``);
CPU per turn by process role over the steady window (gateway, session hosts, inference
emulator, Ray's own; embedded server only) with Ray's idle background rate measured before;
and whether every loop was served (connected, its first turn and at least one more
completed, no error).  Writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import processes, results
from .. import workload as wl
from ..client import FINAL_EVENT_TYPES
from ..rollouts import TIMINGS_KEY, model_seconds, server_timings
from ..stats import pct

TERMINAL = tuple(f'"type":"{t}"' for t in sorted(FINAL_EVENT_TYPES))  # matched in the raw frames
OUTPUT_POOL = 48  # distinct tool outputs per client process (drawn from the preset's sizes)
HISTORY_POOL = 8  # distinct resumed histories (generating one costs the client ~0.1 s of CPU)


def is_terminal(raw: str) -> bool:
    head = raw[:60]
    return any(t in head for t in TERMINAL)


@dataclass
class TurnRecord:
    loop: int
    kind: str  # "first" (released at once), "steady" (chained) or "rollout_first"
    sent: float  # time.time() when sent
    total_ms: float
    model_ms: float | None
    ok: bool
    server: dict[str, float] | None = None  # the server's phase timings (ms), as reported


# ----------------------------------------------------------------------------- client process


@dataclass
class ClientPlan:
    url: str
    loops: list[int]
    preset: str
    resume_tokens: int | None
    duration_s: float
    seed: int
    store: bool = False  # the creates' ``store``


class Loop:
    """One socket's turns; pre-encoded fixed parts of its creates."""

    def __init__(self, index: int, w: wl.Workload, fixed_json: str, outputs: list[str], state: dict) -> None:
        self.index = index
        self.w = w
        self.state = state  # the client's shared {"end_at": ..., "firsts": pending first turns}
        self.fixed_json = fixed_json  # '{"type":"response.create",...' without its closing brace
        self.outputs = outputs
        self.rollout = index
        self.records: list[TurnRecord] = []
        self.errors: list[str] = []
        self.rng = random.Random(f"capacity/{index}")

    def first_create(self) -> str:
        """The rollout's first create: a resumed history (one of :data:`HISTORY_POOL`) and
        the task; the model is told to call tools while the context holds fewer tool
        results than that history's plus the rollout's rounds."""
        rollout = self.rollout
        history = wl.history(self.w, rollout % HISTORY_POOL)
        items = history + [
            {"role": "user", "content": [{"type": "input_text", "text": wl.task(self.w, rollout)}]}
        ]
        meta = wl.metadata(replace(self.w, resume_tokens=0), rollout)
        resumed = sum(1 for item in history if item.get("type") == "function_call_output")
        meta["emulator.tool_rounds"] = str(int(meta["emulator.tool_rounds"]) + resumed)
        self.meta_json = json.dumps({**meta, TIMINGS_KEY: "1"})
        return f'{self.fixed_json},"input":{json.dumps(items)},"metadata":{self.meta_json}}}'

    def next_create(self, response: dict[str, Any]) -> str | None:
        calls = [o for o in response.get("output", []) if o.get("type") == "function_call"]
        if not calls:
            return None
        items = [
            {
                "type": "function_call_output",
                "call_id": c["call_id"],
                "output": self.outputs[self.rng.randrange(len(self.outputs))],
            }
            for c in calls
        ]
        return (
            f'{self.fixed_json},"input":{json.dumps(items)},"metadata":{self.meta_json},'
            f'"previous_response_id":{json.dumps(response["id"])}}}'
        )

    async def turn(self, ws: Any, create: str, kind: str) -> dict[str, Any] | None:
        sent = time.time()
        t0 = time.perf_counter()
        await ws.send(create)
        while True:
            raw = await ws.recv()
            if is_terminal(raw):
                break
        total = (time.perf_counter() - t0) * 1000
        last = json.loads(raw)
        response = last.get("response")
        ok = last.get("type") == "response.completed"
        server = server_timings(response) if response else None
        model = model_seconds(server)
        self.records.append(
            TurnRecord(self.index, kind, sent, total, None if model is None else model * 1000, ok, server)
        )
        if not ok:
            self.errors.append(raw[:200])
            return None
        return response

    async def run(self, ws: Any, release_at: float) -> None:
        create = self.first_create()
        await asyncio.sleep(max(0.0, release_at - time.time()))
        kind = "first"
        while time.time() < self.state["end_at"]:
            try:
                response = await self.turn(ws, create, kind)
            finally:
                if kind == "first":
                    self.state["firsts"] -= 1
                    if self.state["firsts"] == 0:
                        self.state["storm_over"].set()
            if response is None:
                return
            nxt = self.next_create(response)
            if nxt is None:  # the rollout ended: the next one on the same socket
                self.rollout += 100_003
                create, kind = self.first_create(), "rollout_first"
                continue
            await asyncio.sleep(wl.tool_time_s(self.w, self.rollout, len(self.records)))
            create, kind = nxt, "steady"


LAG_TICK_S = 0.01


STALL_MS = 20.0  # a tick this late is kept with its time


async def _watch_lag(into: list[float], stalls: list[tuple[float, float]]) -> None:
    """How late this client's event loop wakes from a 10 ms sleep (ms), every tick: a
    client too busy to read its sockets shows here, not as the server's time.  Ticks
    later than :data:`STALL_MS` go to ``stalls`` with when they ended (``time.time()``)."""
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(LAG_TICK_S)
        late = (time.perf_counter() - t0 - LAG_TICK_S) * 1000
        into.append(late)
        if late >= STALL_MS:
            stalls.append((time.time(), late))


def _client_main(plan: ClientPlan, conn: Any) -> None:
    """A client process: connect every loop, say so, wait for the release time, run."""
    import websockets

    w = replace(wl.PRESETS[plan.preset], seed=plan.seed)
    if plan.resume_tokens is not None:
        w = replace(w, resume_tokens=plan.resume_tokens)
    fixed = {"model": w.model, "store": plan.store, "instructions": wl.instructions(w.system_tokens, w.seed)}
    fixed["tools"] = wl.tools(w)
    fixed_json = '{"type":"response.create",' + json.dumps(fixed)[1:-1]
    rng = random.Random(f"capacity-outputs/{plan.seed}/{plan.loops[:1]}")
    outputs = [wl.tool_output(w, rng.randrange(10**6), 0, 0, "shell") for _ in range(OUTPUT_POOL)]
    state: dict[str, Any] = {"end_at": float("inf"), "firsts": len(plan.loops)}
    loops = [Loop(i, w, fixed_json, outputs, state) for i in plan.loops]
    for i in range(min(HISTORY_POOL, len(loops))):
        loops[i].first_create()  # the histories, built before the release

    async def main() -> dict[str, Any]:
        url = plan.url.replace("http", "ws", 1) + "/v1/responses"
        sockets: list[Any] = []
        failed_connect = 0
        sem = asyncio.Semaphore(64)

        async def open_one() -> Any:
            async with sem:
                try:
                    return await websockets.connect(url, max_size=None, compression=None, open_timeout=60)
                except Exception:  # noqa: BLE001 - counted
                    return None

        sockets = await asyncio.gather(*(open_one() for _ in loops))
        failed_connect = sum(s is None for s in sockets)
        conn.send(("connected", len(loops) - failed_connect))
        release_at = await asyncio.to_thread(conn.recv)
        state["storm_over"] = asyncio.Event()

        async def run(loop: Loop, ws: Any) -> None:
            if ws is None:
                loop.errors.append("connect failed")
                state["firsts"] -= 1
                if state["firsts"] == 0:
                    state["storm_over"].set()
                return
            try:
                await loop.run(ws, release_at)
            except Exception as exc:  # noqa: BLE001 - a loop's failure is counted, not raised
                loop.errors.append(f"{type(exc).__name__}: {exc}"[:200])

        async def steer() -> None:
            await state["storm_over"].wait()
            conn.send(("storm", time.time()))
            state["end_at"] = await asyncio.to_thread(conn.recv)

        steering = asyncio.create_task(steer())
        lag_ms: list[float] = []
        stalls: list[tuple[float, float]] = []
        watching = asyncio.create_task(_watch_lag(lag_ms, stalls))
        await asyncio.gather(*(run(lp, ws) for lp, ws in zip(loops, sockets)))
        await steering
        watching.cancel()
        await asyncio.gather(*(ws.close() for ws in sockets if ws is not None), return_exceptions=True)
        return {
            "records": [r.__dict__ for lp in loops for r in lp.records],
            "errors": {lp.index: lp.errors for lp in loops if lp.errors},
            "failed_connect": failed_connect,
            "loop_lag_ms": sorted(lag_ms),
            "stalls": stalls,
        }

    t_cpu = time.process_time()
    out = asyncio.run(main())
    out["client_cpu_s"] = time.process_time() - t_cpu
    conn.send(("done", out))


# ----------------------------------------------------------------------------- summaries


def nonmodel(records: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    ms = [
        r["total_ms"] - r["model_ms"]
        for r in records
        if r["kind"] == kind and r["ok"] and r["model_ms"] is not None
    ]
    return {"turns": len(ms), **{k: _ms(pct(ms, q)) for k, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))}}


WAIT = "wait:"  # a sample's key prefix for a role's run-queue wait (s)
TAIL_PHASES = ("render", "parse_validate", "backend", "other", "api_overhead", "queue", "prefill", "decode")


def tail(
    records: list[dict[str, Any]], kind: str, q: float = 0.99, origin: float | None = None
) -> dict[str, Any]:
    """Where the turns at or past the ``q`` quantile of non-model time spent it: the
    median of each server phase (ms) over them, and of ``outside`` (the client's turn time
    less the server's own span, model and ``api_overhead``: the socket, the host's event
    loop before the frame is parsed, the client)."""
    rows = [
        r for r in records if r["kind"] == kind and r["ok"] and r.get("server") and r["model_ms"] is not None
    ]
    if not rows:
        return {}
    cut = pct(sorted(r["total_ms"] - r["model_ms"] for r in rows), q) or 0.0
    slow = [r for r in rows if r["total_ms"] - r["model_ms"] >= cut]
    out: dict[str, Any] = {"turns": len(slow), "from_ms": _ms(cut)}
    for phase in TAIL_PHASES:
        out[phase] = _ms(pct(sorted(r["server"].get(phase, 0.0) for r in slow), 0.5))
    outside = sorted(r["total_ms"] - r["model_ms"] - r["server"].get("api_overhead", 0.0) for r in slow)
    out["outside"] = _ms(pct(outside, 0.5))
    # when they were sent (s from ``origin``, default the first of them): turns slow
    # together mean a stall
    t0 = min(r["sent"] for r in rows) if origin is None else origin
    out["sent_s"] = sorted(round(r["sent"] - t0, 2) for r in slow)
    return out


def lag(samples: list[float]) -> dict[str, Any]:
    """The client processes' event-loop lag (ms): p50/p99/max over their ticks."""
    s = sorted(samples)
    return {"ticks": len(s), **{k: _ms(pct(s, q)) for k, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))}}


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def window_cpu(
    samples: list[tuple[float, dict[str, float]]], t0: float, t1: float
) -> tuple[dict[str, float], float, float]:
    """CPU seconds by role between the first sample at or after ``t0`` and the last at or
    before ``t1`` (samples are (time, CPU seconds so far by role)), and those samples' times."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        return {}, t0, t0
    (a, ca), (b, cb) = inside[0], inside[-1]
    return {k: cb[k] - ca.get(k, 0.0) for k in cb}, a, b


def summarise(
    n: int,
    records: list[dict[str, Any]],
    errors: dict[int, list[str]],
    samples: list[tuple[float, dict[str, float]]],
    background_ms_per_s: dict[str, float],
    release_at: float,
    end_at: float,
) -> dict[str, Any]:
    """One N's figures from every turn the clients recorded and the server's CPU samples."""
    firsts = [r for r in records if r["kind"] == "first"]
    storm_end = max((r["sent"] + r["total_ms"] / 1000 for r in firsts), default=release_at)
    steady = [r for r in records if r["ok"] and r["sent"] >= storm_end]
    done_in = [r for r in steady if r["sent"] + r["total_ms"] / 1000 <= end_at]
    cpu, a, b = window_cpu(samples, storm_end, end_at)
    span = b - a
    in_span = [r for r in steady if a <= r["sent"] + r["total_ms"] / 1000 <= b]
    served = {r["loop"] for r in records if r["ok"] and r["kind"] != "first"}
    out: dict[str, Any] = {
        "loops": n,
        "first_turns_ms": {
            **nonmodel(records, "first"),
            "completed": sum(r["ok"] for r in firsts),
            "storm_s": round(storm_end - release_at, 3),
        },
        "steady_ms": nonmodel(steady, "steady"),
        "steady_tail": tail(steady, "steady", origin=storm_end),
        "storm_end": storm_end,
        "rollout_first_ms": nonmodel(steady, "rollout_first"),
        "steady_window_s": round(end_at - storm_end, 3),
        "turns_per_s": round(len(done_in) / (end_at - storm_end), 2) if end_at > storm_end else None,
        "loops_served": len(served),
        "loops_with_errors": len(errors),
        "every_loop_served": len(served) == n and not errors,
    }
    if cpu and in_span:
        turns = len(in_span)
        waits = {k.removeprefix(WAIT): v for k, v in cpu.items() if k.startswith(WAIT)}
        cpu = {k: v for k, v in cpu.items() if not k.startswith(WAIT)}
        if waits:  # runnable, waiting for a core: the machine's contention, by role
            out["runqueue_wait_ms_per_turn"] = {k: round(v * 1000 / turns, 3) for k, v in waits.items()}
        per = {k: round(v * 1000 / turns, 3) for k, v in cpu.items()}
        per["api_tier"] = round(per.get("gateway", 0) + per.get("session_host", 0), 3)
        per["all"] = round(sum(v for k, v in per.items() if k in processes.ROLES), 3)
        per["ray_background"] = round(background_ms_per_s.get("ray", 0.0) * span / turns, 3)
        out["cpu_ms_per_turn"] = per
        out["cpu_window"] = {"s": round(span, 3), "turns": turns}
    if errors:
        out["errors_sample"] = dict(list(errors.items())[:5])
    return out


# ----------------------------------------------------------------------------- the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--loops", default="1,16,64,256,1024", help="comma-separated loop counts, run in turn")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of steady state per loop count")
    p.add_argument("--clients", type=int, default=2, help="client processes (for more than 16 loops)")
    p.add_argument("--preset", default="codex", choices=sorted(wl.PRESETS))
    p.add_argument("--resume-tokens", type=int, default=None, help="override the preset's resumed history")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--idle-s", type=float, default=3.0, help="idle window measuring the background CPU rate")
    p.add_argument("--url", help="a running server's base URL (default: start an embedded one)")
    p.add_argument("--config", type=Path, help="server config file for the embedded server")
    p.add_argument("--out", type=Path, default=Path("results/capacity.json"))


@dataclass
class Sampler:
    """CPU by role of the server's processes, once a second, in a thread."""

    procs: dict[int, str]
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        waits = {f"{WAIT}{role}": s for role, s in processes.wait_by_role(self.procs).items()}
        self.samples.append((time.time(), {**processes.cpu_by_role(self.procs), **waits}))

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(1.0)
        self.sample()


def one_level(
    url: str,
    n: int,
    args: argparse.Namespace,
    procs: dict[int, str],
    idle: dict[str, float],
    *,
    store: bool = False,
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    k = 1 if n <= 16 else max(1, args.clients)
    shares = [list(range(i, n, k)) for i in range(k)]
    pipes, workers = [], []
    for share in shares:
        parent, child = ctx.Pipe()
        plan = ClientPlan(url, share, args.preset, args.resume_tokens, args.duration, args.seed, store)
        proc = ctx.Process(target=_client_main, args=(plan, child), daemon=True)
        proc.start()
        pipes.append(parent)
        workers.append(proc)
    try:
        connected = sum(p.recv()[1] for p in pipes)
        sampler = Sampler(procs)
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
        release_at = time.time() + 1.0
        for p in pipes:
            p.send(release_at)
        storm_end = max(p.recv()[1] for p in pipes)  # every client's first turns answered
        end_at = storm_end + args.duration
        for p in pipes:
            p.send(end_at)
        outs = [p.recv()[1] for p in pipes]
        sampler.stop.set()
        thread.join()
    finally:
        for proc in workers:
            proc.join(30)
            if proc.is_alive():
                proc.terminate()
    records = [r for o in outs for r in o["records"]]
    errors = {int(k): v for o in outs for k, v in o["errors"].items()}
    out = summarise(n, records, errors, sampler.samples, idle, release_at, end_at)
    out["connected"] = connected
    out["client_processes"] = k
    out["client_cpu_s"] = round(sum(o["client_cpu_s"] for o in outs), 2)
    out["client_cpu_pct_of_a_core"] = round(100 * out["client_cpu_s"] / max(end_at - release_at, 1e-9), 1)
    out["client_loop_lag_ms"] = lag([x for o in outs for x in o["loop_lag_ms"]])
    # the clients' stalls in the steady window (s from its start, ms): at the moments the
    # server's slow turns were sent, they say the machine stalled, not the server alone
    out["client_stalls"] = sorted(
        (round(t - out["storm_end"], 2), round(ms, 1))
        for o in outs
        for t, ms in o["stalls"]
        if out["storm_end"] <= t <= end_at
    )
    return out


def print_level(s: dict[str, Any]) -> None:
    f, st, cpu = s["first_turns_ms"], s["steady_ms"], s.get("cpu_ms_per_turn")
    print(
        f"{s['loops']:>5} loops: {s['turns_per_s']} turns/s; steady non-model p50 {st['p50']} / p99 {st['p99']} ms "
        f"({st['turns']} turns); first turns released at once p50 {f['p50']} / p99 {f['p99']} ms "
        f"({f['completed']}/{s['loops']} in {f['storm_s']} s); served {s['loops_served']}/{s['loops']}"
        f"{'' if s['every_loop_served'] else ' — NOT every loop served'}"
        + (
            f"; CPU/turn gateway {cpu['gateway']} + host {cpu['session_host']} = API {cpu['api_tier']}, "
            f"inference {cpu['inference']}, Ray {cpu['ray']} (background {cpu['ray_background']}) ms"
            if cpu
            else ""
        ),
        flush=True,
    )
    t, lg = s.get("steady_tail") or {}, s["client_loop_lag_ms"]
    if t:
        print(
            f"       steady tail (≥ {t['from_ms']} ms, {t['turns']} turns), medians ms: "
            + ", ".join(f"{k} {t[k]}" for k in (*TAIL_PHASES, "outside"))
            + f"; clients: {s['client_cpu_pct_of_a_core']}% of a core, loop lag p99 {lg['p99']} / max {lg['max']} ms"
            + f"; waiting for a CPU, ms/turn: {s.get('runqueue_wait_ms_per_turn')}",
            flush=True,
        )


def run(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from serve.embedded import embedded_server, local_config

    levels = [int(x) for x in args.loops.split(",") if x]
    out: list[dict[str, Any]] = []
    with (
        nullcontext(args.url)
        if args.url
        else embedded_server(local_config(args.config), name="capacity") as url
    ):
        procs = {} if args.url else processes.server_processes()
        idle: dict[str, float] = {}
        if procs:
            before = processes.cpu_by_role(procs)
            time.sleep(args.idle_s)
            idle = {
                k: round(v / args.idle_s, 3)
                for k, v in processes.role_delta(processes.cpu_by_role(procs), before).items()
            }
            print(f"idle background CPU ms per s by role: {idle}", flush=True)
        for n in levels:
            if procs:  # hosts started for the previous level count too
                procs = processes.server_processes()
            level = one_level(url, n, args, procs, idle)
            print_level(level)
            out.append(level)
    results.write(
        args.out,
        {
            "command": args.command,
            "levels": out,
            "workload": {"preset": args.preset, "resume_tokens": args.resume_tokens, "seed": args.seed},
            "duration_s": args.duration,
        },
        args.run,
    )
    print(f"wrote {args.out}")
    return 0 if all(level["every_loop_served"] for level in out) else 1
