"""Fidelity benchmark of the emulated inference deployment: does it do what its model says?

    python -m investigations.emulator [--out results/emulator.json] [--repeats 3] [--sessions 5]

Starts an embedded Ray with the real application (two inference replicas) and drives the
``InferenceDeployment`` through a streaming ``DeploymentHandle`` from this process — the
same hop a session actor uses — timing every item on arrival.  Profiles used: the
bench profiles (:mod:`bench.bench_profiles`: ``bench-1k``, ``bench-4k``, ``bench-flat``, zero
jitter) and ``emu-fast`` as shipped (its first 256 tokens are the 4000 tok/s burst).

Sections: one stream (delivered rate and TTFT against the model), a concurrency sweep
(1, 8, 32 streams on one replica against ``steady_tokens_per_s``), and the prefix cache
over a 20-turn tool loop, pinned (Serve ``session_id``) and unpinned, on 2 replicas.
Results are printed and saved as JSON; docs/emulator-fidelity.md summarises them.  It drives the
inference deployment's own interface in-process, so it lives here, beside the product, and
not in the lab (which is a client of the server's wire).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from bench import bench_profiles as profiles
from bench import ray_internals, results
from inference import chat_format as cf
from inference.emulator.batching import steady_tokens_per_s
from inference.emulator.pacing import decode_s, ttft_ms
from inference.emulator.profiles import InferenceConfig
from inference.tokenizer import encode
from inference.types import Done, FunctionCallDelta, InferenceRequest, Prefilled, TextDelta, ToolSpec
from serve.embedded import embedded_ray, embedded_server, local_config

APP = "emu-bench"
REPLICAS = 2
TOOL = ToolSpec(
    "read_file",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["path"],
        "properties": {
            "path": {"type": "string"},
            "max_lines": {"type": "integer", "minimum": 1, "maximum": 500},
        },
    },
)


def bench_inference_config() -> InferenceConfig:
    return profiles.bench_inference_config(REPLICAS)


class Stream:
    """One response, timed at arrival of each item in this process."""

    def __init__(self) -> None:
        self.t_send = 0.0
        self.stamps: list[tuple[float, int]] = []  # (arrival, tokens in item)
        self._prefilled: Prefilled | None = None
        self._done: Done | None = None
        self.rendered: list[int] = []

    @property
    def prefilled(self) -> Prefilled:
        assert self._prefilled is not None, "the stream sent no Prefilled"
        return self._prefilled

    @property
    def done(self) -> Done:
        assert self._done is not None, "the stream did not end with Done"
        return self._done

    @property
    def ttft_ms(self) -> float:
        return (self.stamps[0][0] - self.t_send) * 1000

    def rate(self, skip_tokens: int = 1, upto: int | None = None) -> float:
        """Delivered tokens/s between the item that completed token ``skip_tokens`` and the
        one that completed token ``upto`` (default: the last)."""
        seen, t_a, n_a, t_b, n_b = 0, None, 0, None, 0
        for t, n in self.stamps:
            if not n:  # an item without tokens (under load, Done follows the last tokens alone)
                continue
            seen += n
            if t_a is None and seen >= skip_tokens:
                t_a, n_a = t, seen
            if upto is None or seen <= upto:
                t_b, n_b = t, seen
        if t_a is None or t_b is None or t_b <= t_a:
            return float("nan")
        return (n_b - n_a) / (t_b - t_a)


async def run_stream(handle, request: InferenceRequest, session: str | None) -> Stream:
    s = Stream()
    opts: dict[str, Any] = {"stream": True, "method_name": "generate"}
    if session:
        opts["session_id"] = session
    text: list[str] = []
    calls: dict[int, tuple[str, str]] = {}
    s.t_send = time.perf_counter()
    async for chunk in handle.options(**opts).remote(request):
        t = time.perf_counter()
        n = 0
        for ev in chunk:
            if isinstance(ev, Prefilled):
                s._prefilled = ev
            elif isinstance(ev, TextDelta):
                n += ev.tokens
                text.append(ev.text)
            elif isinstance(ev, FunctionCallDelta):
                n += ev.tokens
                name, args = calls.get(ev.index, (ev.name, ""))
                calls[ev.index] = (name, args + ev.arguments_delta)
            elif isinstance(ev, Done):
                s._done = ev
        s.stamps.append((t, n))
    for _, (name, args) in sorted(calls.items()):
        s.rendered += cf.render_function_call(name, args)
    if text:
        s.rendered += cf.render_message("assistant", "".join(text))
    return s


def req(rid: str, model: str, prompt, tokens: int, **kw) -> InferenceRequest:
    return InferenceRequest(
        rid, model, tuple(prompt), metadata=(("emulator.text_tokens", str(tokens)),), **kw
    )


# --- sections -----------------------------------------------------------------------------


async def hop(handle, repeats: int) -> dict:
    """Client-observed time to the first item of a zero-latency response: the Ray/Serve hop
    and the replica's own per-request work, with no emulated time at all."""
    prompt = cf.render_message("user", "Explain the change. " * 50)
    ttfts = []
    for i in range(max(20, repeats * 10)):
        s = await run_stream(
            handle, req(f"hop-{i}-{time.time_ns()}", "bench-zero", prompt, 1), "bench-single"
        )
        ttfts.append(s.ttft_ms)
    out = {
        "median_ms": round(statistics.median(ttfts), 3),
        "min_ms": round(min(ttfts), 3),
        "p90_ms": round(sorted(ttfts)[int(len(ttfts) * 0.9)], 3),
        "n": len(ttfts),
    }
    print(
        f"  hop (zero-latency profile, first item): median {out['median_ms']:.2f} ms, min {out['min_ms']:.2f}"
    )
    return out


async def single_stream(handle, cfg: InferenceConfig, repeats: int, hop_ms: float) -> dict:
    prompt = cf.render_message("user", "Explain the change. " * 50)
    out: dict[str, Any] = {}
    for model, tokens, skip, upto, target in (
        ("bench-1k", 3000, 1, None, 1000.0),
        ("bench-4k", 4000, 1, None, 4000.0),
        ("emu-fast", 1000, 1, 256, 4000.0),  # its burst phase: tokens 1..256
        ("emu-fast", 1000, 256, None, 1000.0),  # after the burst
    ):
        p = cfg.profile(model)
        runs = []
        for i in range(repeats):
            s = await run_stream(
                handle,
                req(f"single-{model}-{skip}-{i}-{time.time_ns()}", model, prompt, tokens),
                session="bench-single",
            )
            model_ttft = ttft_ms(p, len(prompt), s.prefilled.reused_tokens) + decode_s(p, 1) * 1000
            rate = s.rate(skip, upto)
            runs.append(
                {
                    "delivered_tok_s": round(rate, 1),
                    "error_pct": round((rate / target - 1) * 100, 2),
                    "ttft_ms": round(s.ttft_ms, 3),
                    "model_ttft_ms": round(model_ttft, 3),
                    "ttft_minus_model_ms": round(s.ttft_ms - model_ttft, 3),
                    "ttft_minus_model_minus_hop_ms": round(s.ttft_ms - model_ttft - hop_ms, 3),
                    "reused_tokens": s.prefilled.reused_tokens,
                    "items": len(s.stamps),
                }
            )
        key = f"{model}" + ("" if model != "emu-fast" else ("-burst" if upto else "-after-burst"))
        out[key] = {
            "target_tok_s": target,
            "tokens": tokens,
            "runs": runs,
            "median_error_pct": statistics.median(r["error_pct"] for r in runs),
            "median_ttft_minus_model_ms": statistics.median(r["ttft_minus_model_ms"] for r in runs),
            "median_ttft_minus_model_minus_hop_ms": statistics.median(
                r["ttft_minus_model_minus_hop_ms"] for r in runs
            ),
        }
        print(
            f"  {key:<22} target {target:>6.0f}  delivered "
            + ", ".join(f"{r['delivered_tok_s']:.0f}" for r in runs)
            + "  TTFT-model ms "
            + ", ".join(f"{r['ttft_minus_model_ms']:+.2f}" for r in runs)
            + "  minus hop "
            + ", ".join(f"{r['ttft_minus_model_minus_hop_ms']:+.2f}" for r in runs)
        )
    return out


async def sweep(handle, cfg: InferenceConfig, model: str, counts: tuple[int, ...], tokens: int) -> dict:
    p = cfg.profile(model)
    prompt = cf.render_message("user", "Run the tests. " * 30)
    out: dict[str, Any] = {}
    for b in counts:
        # one session id for all: every stream lands on the same replica, so the batch is b
        streams = await asyncio.gather(
            *(
                run_stream(
                    handle,
                    req(f"sweep-{model}-{b}-{i}-{time.time_ns()}", model, prompt, tokens),
                    "bench-sweep",
                )
                for i in range(b)
            )
        )
        rates = [s.rate(1) for s in streams]
        ttfts = [s.ttft_ms for s in streams]
        model_ttfts = [
            s.prefilled.queue_ms + s.prefilled.prefill_ms + decode_s(p, 1) * 1000 * 1 for s in streams
        ]
        predicted = steady_tokens_per_s(p.decode_tokens_per_s, b, p.batching)
        wall = max(s.stamps[-1][0] for s in streams) - min(s.t_send for s in streams)
        out[str(b)] = {
            "predicted_tok_s_per_stream": round(predicted, 1),
            "delivered_tok_s_per_stream": {
                "median": round(statistics.median(rates), 1),
                "min": round(min(rates), 1),
                "max": round(max(rates), 1),
            },
            "median_error_pct": round((statistics.median(rates) / predicted - 1) * 100, 2),
            "aggregate_tok_s": round(sum(s.done.output_tokens for s in streams) / wall, 1),
            "ttft_ms": {"median": round(statistics.median(ttfts), 2), "max": round(max(ttfts), 2)},
            "model_ttft_ms_median": round(statistics.median(model_ttfts), 2),
        }
        r = out[str(b)]
        print(
            f"  {model:<10} {b:>2} streams: predicted {predicted:7.1f}  delivered median "
            f"{r['delivered_tok_s_per_stream']['median']:7.1f} (min {r['delivered_tok_s_per_stream']['min']:.1f})"
            f"  aggregate {r['aggregate_tok_s']:8.1f} tok/s  TTFT median {r['ttft_ms']['median']:.1f} ms"
            f" (model {r['model_ttft_ms_median']:.1f})"
        )
    return out


async def agent_session(handle, cfg: InferenceConfig, session: str | None, turns: int) -> list[dict]:
    """A 20-turn tool loop: each turn's prompt = previous prompt + rendered output + a tool
    result, as the session actor builds it."""
    block = cfg.prefix_cache.block_tokens
    tag = f"{session or 'unpinned'}-{time.time_ns()}"
    prompt = (
        cf.render_tools((TOOL,))
        + cf.render_instructions(f"[{tag}] You are a coding agent. " * 120)
        + cf.render_message("user", "Fix the failing test.")
    )
    rows = []
    inherited = 0
    for turn in range(turns):
        request = InferenceRequest(
            f"{tag}-{turn}",
            "emu-fast",
            tuple(prompt),
            tools=(TOOL,),
            tool_results_in_context=turn,
            metadata=(("emulator.tool_rounds", str(turns)),),
        )
        s = await run_stream(handle, request, session)
        pf = s.prefilled
        rows.append(
            {
                "turn": turn + 1,
                "prompt_tokens": pf.prompt_tokens,
                "inherited_tokens": inherited,
                "reused_tokens": pf.reused_tokens,
                "cached_tokens": pf.cached_tokens,
                "replica": pf.replica,
                "block_tokens": block,
            }
        )
        inherited = len(prompt) + len(s.rendered)
        prompt = prompt + s.rendered + cf.render_function_call_output("x = 1\n" * 60)
    return rows


def expected_unpinned_reuse(rows: list[dict], n_replicas: int) -> tuple[float, float]:
    """(expected reuse under uniform random routing, reuse implied by the observed routing):
    a replica holds the conversation up to the last turn it served (rounded down to blocks),
    and matching stops there."""
    block = rows[0]["block_tokens"]
    held = [r["inherited_tokens"] for r in rows[1:]] + [None]  # what turn k leaves = turn k+1's inherited
    p = 1.0 / n_replicas
    expected = observed = 0.0
    for k, row in enumerate(rows):
        if k == 0:
            continue
        for j in range(k):  # turn j (0-based) was the last one on this replica
            prob = p * (1 - p) ** (k - 1 - j)
            expected += prob * (held[j] // block * block)
        same = [j for j in range(k) if rows[j]["replica"] == row["replica"]]
        observed += held[same[-1]] // block * block if same else 0
    return expected, observed


async def prefix_cache(handle, cfg: InferenceConfig, sessions: int, turns: int) -> dict:
    out: dict[str, Any] = {}
    for mode in ("pinned", "unpinned"):
        runs = []
        for i in range(sessions):
            rows = await agent_session(handle, cfg, f"bench-pinned-{i}" if mode == "pinned" else None, turns)
            inherited = sum(r["inherited_tokens"] for r in rows[1:])
            prefilled = sum(r["prompt_tokens"] - r["reused_tokens"] for r in rows)
            reused = sum(min(r["reused_tokens"], r["inherited_tokens"]) for r in rows[1:])
            expected, implied = expected_unpinned_reuse(rows, REPLICAS)
            runs.append(
                {
                    "hit_rate_of_inherited": round(reused / inherited, 4),
                    "expected_hit_rate_uniform_routing": round(expected / inherited, 4),
                    "hit_rate_implied_by_observed_routing": round(implied / inherited, 4),
                    "replicas_used": len({r["replica"] for r in rows}),
                    "prefilled_tokens_total": prefilled,
                    "prompt_tokens_total": sum(r["prompt_tokens"] for r in rows),
                    "final_prompt_tokens": rows[-1]["prompt_tokens"],
                    "turns": rows,
                }
            )
        rates = [r["hit_rate_of_inherited"] for r in runs]
        out[mode] = {
            "sessions": runs,
            "hit_rate_median": statistics.median(rates),
            "prefilled_tokens_median": statistics.median(r["prefilled_tokens_total"] for r in runs),
            "hit_rate_min": min(rates),
            "miss_rate_median": round(1 - statistics.median(rates), 4),
        }
        exp = statistics.median(r["expected_hit_rate_uniform_routing"] for r in runs)
        print(
            f"  {mode:<9} prefilled tokens per session (median) {out[mode]['prefilled_tokens_median']:.0f};"
            f" hit rate of inherited tokens per session: {', '.join(f'{x:.3f}' for x in rates)}"
            + (
                f"  (uniform-routing expectation {exp:.3f}; implied by observed routing "
                + ", ".join(f"{r['hit_rate_implied_by_observed_routing']:.3f}" for r in runs)
                + ")"
                if mode == "unpinned"
                else ""
            )
        )
    return out


async def main_async(args) -> dict:
    # Serve reads its flags when ray.serve is first imported: embedded_ray (in run) put
    # serve.embedded.RAY_ENV in this process's environment before, so this process's handle
    # runs in the same throughput mode as the embedded cluster.
    from ray import serve

    cfg = bench_inference_config()
    # The app is deleted on this loop: the handle's router lives here in throughput mode.
    with embedded_server(
        local_config(**{f"inference.{k}": v for k, v in cfg.model_dump().items()}), name=APP
    ):
        handle = serve.get_deployment_handle("InferenceDeployment", app_name=APP)
        # warm both replicas and the handle paths
        for i in range(8):
            await run_stream(handle, req(f"warm-{i}", "bench-1k", encode("warm"), 16), None)
        result: dict[str, Any] = {
            "command": args.command,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "serve_throughput_mode": os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED"),
            "replicas": REPLICAS,
            "profiles": {p.id: p.model_dump(exclude={"description", "source"}) for p in cfg.profiles},
            "prefix_cache": cfg.prefix_cache.model_dump(),
        }
        await sections(handle, cfg, args, result)
    ray_internals.stop_long_poll_clients()
    return result


async def sections(handle, cfg: InferenceConfig, args, result: dict) -> None:
    print("one stream (zero jitter):")
    result["hop"] = await hop(handle, args.repeats)
    result["single_stream"] = await single_stream(handle, cfg, args.repeats, result["hop"]["median_ms"])
    print("concurrency sweep (one replica, streams started together):")
    result["sweep"] = await sweep(handle, cfg, "bench-1k", (1, 8, 32), args.sweep_tokens)
    result["sweep_flat_batch"] = await sweep(handle, cfg, "bench-flat", (8, 32), args.sweep_tokens)
    print(f"prefix cache, {args.turns}-turn tool loop on emu-fast, {REPLICAS} replicas:")
    result["prefix_cache_sessions"] = await prefix_cache(handle, cfg, args.sessions, args.turns)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("results/emulator.json"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sessions", type=int, default=5)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--sweep-tokens", type=int, default=2000)


def run(args: argparse.Namespace) -> int:
    with embedded_ray(num_cpus=2):
        result = asyncio.run(main_async(args))
        results.write(args.out, result, args.run)  # before Ray stops
        print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    from investigations import main

    raise SystemExit(main("investigations.emulator"))
