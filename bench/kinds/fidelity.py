"""The emulator against a real engine: the same conversation on a real model and on the
emulator's twin of it (a ``kind: emulator`` model rendered with the real model's tokenizer),
turn by turn over one WebSocket each — input, cached and output tokens as usage reports
them, and the client-seen time to the first token and decode rate (docs/emulator-fidelity.md,
"Against a real engine").  The twin answers each turn with as many tokens as the engine
did on it, so both conversations grow alike.

    responses-ws bench fidelity --config configs/fidelity-smollm2.yaml \\
        [--real smollm2-135m] [--emulated smollm2-135m-emu] [--turns 6] [--repeats 3] [--url URL]

Each run uses an API key of its own, so neither backend's prefix cache (scoped per key) holds
anything of an earlier run.  From the real engine's turns it fits the emulator profile's
timing (prefill overhead and rate, decode rate; from each turn's fastest sample) and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from pathlib import Path
from typing import Any

from bench import results
from bench.client import connect
from bench.stats import line, mean, median
from serve.embedded import embedded_server, local_config

QUESTIONS = (
    "What is the capital of France?",
    "And of Germany?",
    "Name a river in Spain.",
    "What colour is the sky?",
    "How many legs has a spider?",
    "Name a planet.",
    "What is two plus two?",
    "Say goodbye.",
)


def instructions(rules: int) -> str:
    return "You are a concise assistant. " + " ".join(
        f"Rule {i}: answer briefly, factually and politely, in one sentence." for i in range(rules)
    )


async def conversation(
    url: str, model: str, rules: int, max_output: int, lengths: list[int | None]
) -> list[dict[str, Any]]:
    """One socket, a store=false turn per entry of ``lengths``, each continuing the one
    before; an emulated model answers turn ``i`` with ``lengths[i]`` tokens (the real
    engine's on the same turn; None: ``max_output``)."""
    out: list[dict[str, Any]] = []
    async with connect(url, api_key=f"sk-fidelity-{uuid.uuid4().hex[:8]}") as sock:
        previous = None
        for i, length in enumerate(lengths):
            answer = await sock.create(
                model=model,
                instructions=instructions(rules),
                store=False,
                max_output_tokens=max_output,
                previous_response_id=previous,
                input=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                metadata={"emulator.text_tokens": str(length or max_output)},
            )
            response = answer.response
            if response is None or response.get("status") not in ("completed", "incomplete"):
                raise RuntimeError(f"{model} turn {i + 1}: {answer.last}")
            usage = response["usage"]
            ttft = answer.ttft_s or answer.total_s
            output = usage["output_tokens"]
            decode_s = answer.total_s - ttft
            out.append(
                {
                    "turn": i + 1,
                    "input_tokens": usage["input_tokens"],
                    "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
                    "output_tokens": output,
                    "ttft_ms": round(ttft * 1000, 1),
                    "total_ms": round(answer.total_s * 1000, 1),
                    "decode_tok_s": round((output - 1) / decode_s, 1)
                    if output > 1 and decode_s > 0
                    else None,
                }
            )
            previous = response["id"]
    return out


def fit_timing(runs: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Prefill overhead and rate, decode rate of the real engine, from each turn's least
    loaded sample over the runs (on a shared machine the others measure its neighbours):
    TTFT = overhead + uncached / rate, fitted by least squares over the turns' fastest
    TTFT; decode, the median over the turns of each turn's fastest rate."""
    turns = list(zip(*runs))
    xs = [t[0]["input_tokens"] - t[0]["cached_tokens"] for t in turns]
    ys = [min(s["ttft_ms"] for s in t) for t in turns]
    slope, intercept = line(xs, ys) or (0.0, mean(ys) or 0.0)
    decode = [max(rates) for t in turns if (rates := [s["decode_tok_s"] for s in t if s["decode_tok_s"]])]
    return {
        "prefill_overhead_ms": round(max(0.0, intercept), 1),
        "prefill_tokens_per_s": round(1000.0 / slope, 0) if slope > 0 else float("inf"),
        "decode_tokens_per_s": median(decode, 1) or float("nan"),
    }


def summary(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per turn: the tokens (the same in every run) and the median times."""
    return [
        {
            **{k: run_turns[0][k] for k in ("turn", "input_tokens", "cached_tokens", "output_tokens")},
            "cached_tokens_runs": sorted({t["cached_tokens"] for t in run_turns}),
            **{k: median((t[k] for t in run_turns), None) for k in ("ttft_ms", "total_ms")},
        }
        for run_turns in zip(*runs)
    ]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--real", default="smollm2-135m", help="the real model's id")
    p.add_argument("--emulated", default="smollm2-135m-emu", help="its emulated twin's id (kind: emulator)")
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3, help="runs of the conversation per model, alternating")
    p.add_argument(
        "--rules", type=int, default=70, help="sentences of instructions (70: ~1190 SmolLM2 tokens)"
    )
    p.add_argument("--max-output-tokens", type=int, default=24)
    p.add_argument(
        "--url",
        help="the base URL, http://host:port, of a running server with both models (default: start an embedded one)",
    )
    p.add_argument("--config", type=Path, help="server config file for the embedded server")
    p.add_argument("--out", type=Path, default=Path("results/fidelity.json"))


async def measure(url: str, args: argparse.Namespace) -> dict[str, list[list[dict[str, Any]]]]:
    runs: dict[str, list[list[dict[str, Any]]]] = {args.real: [], args.emulated: []}
    for r in range(args.repeats):
        lengths: list[int | None] = [None] * args.turns
        for model in runs:  # alternating: both see the same machine load
            turns = await conversation(url, model, args.rules, args.max_output_tokens, lengths)
            lengths = [t["output_tokens"] for t in turns]  # the twin answers as long as the engine did
            runs[model].append(turns)
            print(
                f"run {r + 1} {model}: "
                + "; ".join(
                    f"{t['input_tokens']}/{t['cached_tokens']} cached, {t['output_tokens']} out, "
                    f"ttft {t['ttft_ms']:.0f} ms"
                    for t in turns
                )
            )
    return runs


def run(args: argparse.Namespace) -> int:
    if args.url:
        runs = asyncio.run(measure(args.url, args))
    else:
        with embedded_server(local_config(args.config)) as url:
            runs = asyncio.run(measure(url, args))
    fitted = fit_timing(runs[args.real])
    report = {model: summary(model_runs) for model, model_runs in runs.items()}
    print(f"the real engine's timing, fitted: {fitted}")
    profiles = {p.id: p for p in local_config(args.config).inference.profiles} if args.config else {}
    emulated = profiles[args.emulated].model_dump(mode="json") if args.emulated in profiles else None
    results.write(
        args.out,
        {
            "command": args.command,
            "fitted_real_timing": fitted,
            "summary": report,
            "emulated_profile": emulated,
            "runs": runs,
            "workload": {
                k: getattr(args, k)
                for k in ("real", "emulated", "turns", "repeats", "rules", "max_output_tokens")
            },
        },
        args.run,
    )
    print(f"wrote {args.out}")
    return 0
